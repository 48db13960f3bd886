// Unit tests of the cost-balanced assignment (lib/balance/assign.h).
#include <gtest/gtest.h>

#include <algorithm>

#include "io/error.h"
#include "lib/balance/assign.h"
#include "lib/balance/rng.h"

namespace kilter::balance {
namespace {

void expect_each_item_once(const std::vector<std::vector<uint32_t>>& a, size_t items) {
  std::vector<int> seen(items, 0);
  for (const auto& rank : a) {
    EXPECT_TRUE(std::is_sorted(rank.begin(), rank.end()));
    for (uint32_t i : rank) ++seen.at(i);
  }
  for (int s : seen) EXPECT_EQ(s, 1);
}

TEST(BalanceAssign, EveryItemOnceAndDeterministic) {
  Xoshiro256 rng(42);
  std::vector<double> costs(200);
  for (double& c : costs) c = 1.0 + double(rng.below(1000)) / 100.0;
  for (int world : {1, 2, 7, 64, 300}) {
    const auto a = assign_by_cost(costs, world);
    ASSERT_EQ(a.size(), size_t(world));
    expect_each_item_once(a, costs.size());
    EXPECT_EQ(a, assign_by_cost(costs, world));
  }
}

TEST(BalanceAssign, SwapsFixWhatLongestFirstMisses) {
  // Longest-first gives {3,2,2} = 7 and {3,2} = 5; one swap reaches the optimum {3,3} | {2,2,2}.
  const std::vector<double> costs = {3, 3, 2, 2, 2};
  const auto a = assign_by_cost(costs, 2);
  expect_each_item_once(a, costs.size());
  EXPECT_DOUBLE_EQ(assignment_imbalance(costs, a), 1.0);
}

TEST(BalanceAssign, FewerItemsThanRanksLeavesRanksIdle) {
  const std::vector<double> costs = {5, 1, 3};
  const auto a = assign_by_cost(costs, 5);
  expect_each_item_once(a, 3);
  int idle = 0;
  for (const auto& r : a) idle += r.empty();
  EXPECT_EQ(idle, 2);
  EXPECT_EQ(a[0], std::vector<uint32_t>{0}) << "the largest item goes to the lowest rank";
}

TEST(BalanceAssign, ManyItemsBalanceTightly) {
  Xoshiro256 rng(7);
  std::vector<double> costs(64 * 8);
  for (double& c : costs) c = 0.5 + double(rng.below(1 << 20)) / double(1 << 20);
  const auto a = assign_by_cost(costs, 64);
  EXPECT_LT(assignment_imbalance(costs, a), 1.02);
  // Round-robin (what a fixed sampler does) is much worse on the same items.
  std::vector<std::vector<uint32_t>> round_robin(64);
  for (uint32_t i = 0; i < costs.size(); ++i) round_robin[i % 64].push_back(i);
  EXPECT_GT(assignment_imbalance(costs, round_robin), assignment_imbalance(costs, a));
}

TEST(BalanceAssign, RefusesBadInput) {
  EXPECT_THROW(assign_by_cost({1.0}, 0), Error);
  EXPECT_THROW(assign_by_cost({1.0, -2.0}, 2), Error);
}

}  // namespace
}  // namespace kilter::balance
