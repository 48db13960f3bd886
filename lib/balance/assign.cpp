// Cost-balanced assignment of a step's micro-batches to ranks (see assign.h). LPT alone leaves
// the busiest rank up to 4/3 of optimal in the worst case; the move/swap pass below closes most
// of the remaining gap for the item counts a step has (a handful to a few dozen per rank).
#include "lib/balance/assign.h"

#include <algorithm>
#include <numeric>
#include <queue>

#include "io/error.h"

namespace kilter::balance {

namespace {

// Ranks compared with the busiest one in each improvement round: the least-loaded few are
// where a move or swap can help most; looking at all ranks costs O(P) per round for little.
constexpr size_t kSwapPartners = 8;
// The improvement rounds stop once the busiest rank is within this share of the mean load:
// closer than that is below the noise of measured step times and only costs planning time.
constexpr double kGoodEnoughImbalance = 1e-3;

struct Assignment {
  std::vector<double> loads;
  std::vector<std::vector<uint32_t>> items;
};

Assignment longest_first(const std::vector<double>& costs, int world_size) {
  Assignment a;
  a.loads.assign(world_size, 0.0);
  a.items.assign(world_size, {});
  std::vector<uint32_t> order(costs.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t x, uint32_t y) { return costs[x] > costs[y]; });
  // Min-heap of (load, rank); ties go to the lower rank.
  using Entry = std::pair<double, int>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  for (int r = 0; r < world_size; ++r) heap.push({0.0, r});
  for (uint32_t item : order) {
    auto [load, rank] = heap.top();
    heap.pop();
    a.items[rank].push_back(item);
    a.loads[rank] = load + costs[item];
    heap.push({a.loads[rank], rank});
  }
  return a;
}

// One improvement round: the best single move or swap between the busiest rank and one of the
// least-loaded ranks that lowers the larger of the two loads. Returns false when none helps.
bool improve_busiest(const std::vector<double>& costs, double mean_load, Assignment& a) {
  const int world_size = static_cast<int>(a.loads.size());
  const int busiest = static_cast<int>(std::max_element(a.loads.begin(), a.loads.end()) - a.loads.begin());
  const double top = a.loads[busiest];
  if (top <= mean_load * (1 + kGoodEnoughImbalance)) return false;
  const double tolerance = top * 1e-12;

  std::vector<int> partners(world_size);
  std::iota(partners.begin(), partners.end(), 0);
  const size_t n_partners = std::min<size_t>(kSwapPartners, partners.size());
  std::partial_sort(partners.begin(), partners.begin() + n_partners, partners.end(),
                    [&](int x, int y) { return a.loads[x] < a.loads[y] || (a.loads[x] == a.loads[y] && x < y); });

  double best_pair_max = top - tolerance;
  int best_partner = -1;
  size_t best_x = 0;
  long best_y = -1;  // -1: a move, else the partner's item index to swap in
  for (size_t p = 0; p < n_partners; ++p) {
    const int partner = partners[p];
    if (partner == busiest) continue;
    const double gap = top - a.loads[partner];
    if (gap <= tolerance) continue;
    const auto& mine = a.items[busiest];
    const auto& theirs = a.items[partner];
    for (size_t xi = 0; xi < mine.size(); ++xi) {
      const double x = costs[mine[xi]];
      if (x < gap) {
        const double pair_max = std::max(top - x, a.loads[partner] + x);
        if (pair_max < best_pair_max) {
          best_pair_max = pair_max, best_partner = partner, best_x = xi, best_y = -1;
        }
      }
      for (size_t yi = 0; yi < theirs.size(); ++yi) {
        const double d = x - costs[theirs[yi]];
        if (d <= 0 || d >= gap) continue;
        const double pair_max = std::max(top - d, a.loads[partner] + d);
        if (pair_max < best_pair_max) {
          best_pair_max = pair_max, best_partner = partner, best_x = xi, best_y = static_cast<long>(yi);
        }
      }
    }
  }
  if (best_partner < 0) return false;

  auto& mine = a.items[busiest];
  auto& theirs = a.items[best_partner];
  const uint32_t x_item = mine[best_x];
  if (best_y < 0) {
    mine.erase(mine.begin() + best_x);
    theirs.push_back(x_item);
    a.loads[busiest] -= costs[x_item];
    a.loads[best_partner] += costs[x_item];
  } else {
    const uint32_t y_item = theirs[best_y];
    mine[best_x] = y_item;
    theirs[best_y] = x_item;
    const double d = costs[x_item] - costs[y_item];
    a.loads[busiest] -= d;
    a.loads[best_partner] += d;
  }
  return true;
}

}  // namespace

std::vector<std::vector<uint32_t>> assign_by_cost(const std::vector<double>& costs, int world_size) {
  KILTER_CHECK(world_size >= 1, "assign_by_cost: world size " << world_size << " must be >= 1");
  for (double c : costs) KILTER_CHECK(c >= 0 && c == c, "assign_by_cost: a micro-batch cost is " << c);
  Assignment a = longest_first(costs, world_size);
  if (world_size > 1 && costs.size() > static_cast<size_t>(1)) {
    // Each round strictly lowers the busiest rank's load without raising any load above it,
    // so the sorted load vector falls and the loop ends; the cap bounds planning time.
    const size_t max_rounds = 2 * static_cast<size_t>(world_size) + 4 * costs.size();
    double total = 0;
    for (double c : costs) total += c;
    const double mean_load = total / world_size;
    for (size_t round = 0; round < max_rounds && improve_busiest(costs, mean_load, a); ++round) {
    }
  }
  for (auto& items : a.items) std::sort(items.begin(), items.end());
  return std::move(a.items);
}

double assignment_imbalance(const std::vector<double>& costs,
                            const std::vector<std::vector<uint32_t>>& assignment) {
  if (assignment.empty()) return 1.0;
  double total = 0, top = 0;
  for (const auto& items : assignment) {
    double load = 0;
    for (uint32_t i : items) load += costs.at(i);
    total += load;
    top = std::max(top, load);
  }
  const double mean = total / static_cast<double>(assignment.size());
  return mean > 0 ? top / mean : 1.0;
}

}  // namespace kilter::balance
