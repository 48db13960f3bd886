// Unit tests of the division of one step's pieces among ranks and of the packing of each share
// (lib/balance/divide.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <tuple>

#include "io/error.h"
#include "lib/balance/divide.h"
#include "lib/balance/rng.h"

namespace kilter::balance {
namespace {

std::vector<Piece> random_pieces(size_t n, uint32_t max_len, uint64_t seed) {
  Xoshiro256 rng(seed);
  std::vector<Piece> pieces(n);
  for (size_t i = 0; i < n; ++i) pieces[i] = Piece{i, 0, uint32_t(1 + rng.below(max_len))};
  return pieces;
}

// One step divided among `world` ranks, as plain vectors (the pieces start at 0 and are at most
// max_tokens long: the plan's storage takes max_tokens as its context).
Step divide_step(StepDivider& divider, const std::vector<Piece>& pieces, int world, uint64_t max_tokens) {
  PlanSteps steps(uint32_t(max_tokens), world);
  divider.divide(pieces.data(), pieces.size(), steps);
  EXPECT_EQ(steps.size(), 1u);
  return steps[0].expand();
}

CostModel unit_cost(double b, double c) {
  CostModel cost;
  cost.a = 1;
  cost.b = b;
  cost.c = c;
  return cost;
}

// Every piece in exactly one micro-batch of exactly one rank; packed micro-batches within budget.
void expect_valid_division(const std::vector<Piece>& pieces, const Step& step, int world, uint64_t max_tokens) {
  ASSERT_EQ(step.rank_batches.size(), size_t(world));
  std::vector<int> mb_seen(step.micro_batches.size(), 0);
  for (const auto& batches : step.rank_batches)
    for (uint32_t m : batches) ++mb_seen.at(m);
  for (int s : mb_seen) EXPECT_EQ(s, 1) << "a micro-batch not on exactly one rank";
  std::map<uint64_t, int> piece_seen;
  uint64_t tokens = 0;
  for (const MicroBatch& mb : step.micro_batches) {
    EXPECT_TRUE(mb.packed());
    EXPECT_FALSE(mb.pieces.empty());
    uint64_t mb_tokens = 0;
    for (const Piece& p : mb.pieces) ++piece_seen[p.doc], mb_tokens += p.len;
    EXPECT_EQ(mb.target_tokens, mb_tokens);
    EXPECT_EQ(mb.tokens_computed(), mb_tokens);
    EXPECT_LE(mb_tokens, max_tokens);
    tokens += mb_tokens;
  }
  EXPECT_EQ(piece_seen.size(), pieces.size());
  for (const auto& [doc, count] : piece_seen) EXPECT_EQ(count, 1) << "piece of doc " << doc;
  EXPECT_EQ(step.target_tokens, tokens);
}

TEST(BalanceDivide, EveryPieceOnceWithinBudgetAndDeterministic) {
  const auto pieces = random_pieces(700, 512, 3);
  for (int world : {1, 2, 7, 64, 300, 1000}) {
    StepDivider divider(unit_cost(1.0 / 3072, 64), 2048, world);
    const Step a = divide_step(divider, pieces, world, 2048);
    expect_valid_division(pieces, a, world, 2048);
    StepDivider other(unit_cost(1.0 / 3072, 64), 2048, world);
    const Step b = divide_step(other, pieces, world, 2048);
    EXPECT_EQ(a.rank_batches, b.rank_batches) << "world " << world;
    ASSERT_EQ(a.micro_batches.size(), b.micro_batches.size());
    for (size_t m = 0; m < a.micro_batches.size(); ++m)
      for (size_t i = 0; i < a.micro_batches[m].pieces.size(); ++i)
        EXPECT_EQ(a.micro_batches[m].pieces[i].doc, b.micro_batches[m].pieces[i].doc);
  }
}

TEST(BalanceDivide, FewestMicroBatchesAndLongestFirst) {
  // One rank: its share packs into ceil(tokens / max_tokens) micro-batches when small pieces can
  // fill the gaps, and the pieces of each micro-batch are sorted longest first.
  const auto pieces = random_pieces(2000, 300, 5);
  StepDivider divider(unit_cost(0.001, 10), 4096, 1);
  const Step step = divide_step(divider, pieces, 1, 4096);
  expect_valid_division(pieces, step, 1, 4096);
  EXPECT_EQ(step.micro_batches.size(), divider.min_micro_batches(step.target_tokens));
  for (const MicroBatch& mb : step.micro_batches)
    EXPECT_TRUE(std::is_sorted(mb.pieces.begin(), mb.pieces.end(),
                               [](const Piece& x, const Piece& y) { return x.len > y.len; }));
}

TEST(BalanceDivide, BalancedWhenSharesHoldManyPieces) {
  const auto pieces = random_pieces(4000, 1024, 11);
  for (int world : {2, 8, 32}) {
    StepDivider divider(unit_cost(1.0 / 6144, 256), 8192, world);
    const Step step = divide_step(divider, pieces, world, 8192);
    const std::vector<double> loads = rank_costs(step);
    double total = 0, top = 0;
    for (double l : loads) total += l, top = std::max(top, l);
    EXPECT_LE(top / (total / world), 1.005) << "world " << world;
  }
}

TEST(BalanceDivide, IdleRanksWhenFewerPiecesThanRanks) {
  const std::vector<Piece> pieces = {{0, 0, 100}, {1, 0, 50}, {2, 0, 10}};
  StepDivider divider(unit_cost(0, 0), 128, 5);
  const Step step = divide_step(divider, pieces, 5, 128);
  expect_valid_division(pieces, step, 5, 128);
  int idle = 0;
  for (const auto& batches : step.rank_batches) idle += batches.empty();
  EXPECT_EQ(idle, 2);
}

TEST(BalanceDivide, RefusesAnUnresolvedCostModelAndOversizedPieces) {
  EXPECT_THROW(StepDivider(unit_cost(-1, 0), 128, 2), Error);
  EXPECT_THROW(StepDivider(unit_cost(0, 0), 128, 0), Error);
  StepDivider divider(unit_cost(0, 0), 128, 2);
  const std::vector<Piece> pieces = {{0, 0, 257}};  // 3 parts of <= 128 tokens, 2 ranks
  PlanSteps steps(512, 2);
  EXPECT_THROW(divider.divide(pieces.data(), pieces.size(), steps), Error);
  const std::vector<Piece> two = {{0, 0, 256}};  // a chain over both ranks
  EXPECT_NO_THROW(divider.divide(two.data(), two.size(), steps));
  EXPECT_EQ(step_cuts(steps[0]).size(), 1u);
  PlanSteps other_world(256, 3);
  EXPECT_THROW(divider.divide(pieces.data(), 0, other_world), Error) << "steps for another world size";
}

}  // namespace
}  // namespace kilter::balance
