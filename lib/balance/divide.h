// Division of one global step's pieces among P ranks by cost, piece by piece, and the packing of
// each rank's share into as few micro-batches of at most max_tokens tokens as it can
// (docs/design.md, "Batch plan"). A pure function of (pieces, cost model, max_tokens, P): every rank
// computes the same division. Internal to lib/balance; build_epoch_plan() runs it step by step.
#pragma once
#include <cstdint>
#include <memory_resource>
#include <set>
#include <utility>
#include <vector>

#include "lib/balance/plan.h"

namespace kilter::balance {

// Divides steps, one after the other, reusing its buffers so that an epoch of thousands of steps
// does not allocate per step beyond the plan's own vectors.
class StepDivider {
 public:
  // `cost` must be resolved (b >= 0, c >= 0); every piece must be <= max_tokens long.
  StepDivider(const CostModel& cost, uint64_t max_tokens, int world_size);

  // Divides pieces[0, n) (one step, any order) and appends the step to `out`: rank by rank, each
  // rank's micro-batches, the pieces of each longest first. `out` must be for this world size.
  void divide(const Piece* pieces, size_t n, PlanSteps& out);

  // The micro-batches a rank holding `tokens` tokens needs at the least: ceil(tokens / max_tokens).
  uint64_t min_micro_batches(uint64_t tokens) const { return (tokens + max_tokens_ - 1) / max_tokens_; }

 private:
  // A rank's share while dividing: its pieces (indices into the step, longest first), their
  // summed piece cost and tokens.
  struct Share {
    std::vector<uint32_t> items;
    double piece_cost = 0;
    uint64_t tokens = 0;
  };
  // While dividing, a share is charged the fewest micro-batches it can pack into; the packed
  // result decides between the initial divisions (packed_busiest_load).
  double load_of(double piece_cost, uint64_t tokens) const {
    return piece_cost + cost_.c * double(min_micro_batches(tokens));
  }
  double load(int rank) const { return load_of(shares_[rank].piece_cost, shares_[rank].tokens); }
  void reset_shares();
  double busiest_load() const;
  void longest_first();
  void best_fit(double capacity);
  double refine();
  bool improve_busiest();
  void insert_sorted(std::vector<uint32_t>& items, uint32_t item) const;
  size_t assign_bins(int rank);  // fills bin_of_, bin_tokens_; returns the micro-batches
  double packed_busiest_load();
  void pack(int rank, PlanSteps& out);

  CostModel cost_;
  uint64_t max_tokens_;
  int world_size_;
  double tolerance_ = 0;
  double least_busiest_ = 0;  // the current step's lower bound on the busiest rank's load
  // Scratch of the current step.
  const Piece* pieces_ = nullptr;
  std::vector<uint64_t> order_;       // (context - len) << 32 | index: longest first, then by index
  std::vector<double> piece_cost_;    // per step piece
  std::vector<double> prefix_cost_;   // prefix sums of piece costs, longest first
  std::vector<Share> shares_;         // per rank
  std::vector<Share> best_shares_;    // the best division so far, while candidates are compared
  // (load, rank), ascending; its nodes come from a pool kept across steps (no malloc per update).
  std::pmr::unsynchronized_pool_resource node_pool_;
  std::pmr::set<std::pair<double, int>> by_load_{&node_pool_};
  std::vector<std::pair<double, int>> heap_;  // LPT min-heap of (load, rank)
  std::vector<uint32_t> bin_of_;      // packing: micro-batch of each of a rank's items
  std::vector<uint64_t> bin_tokens_;  // packing: tokens per micro-batch
  std::vector<uint32_t> by_bin_;      // packing: a rank's items grouped by micro-batch
};

}  // namespace kilter::balance
