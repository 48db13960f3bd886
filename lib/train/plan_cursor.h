// The batch plan as the trainer walks it: each epoch's plan built on demand (identically on every
// rank, no communication) and this rank's micro-batches in the order training consumes them, so
// the reader can be fed ahead of the trainer.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "io/dataset.h"
#include "io/reader.h"
#include "lib/balance/mixture.h"
#include "lib/balance/plan.h"

namespace kilter::train {

// The plan of each epoch, built on demand and dropped once passed. replan() gives the steps from a
// position on a plan with another transfer charge (the cut-cost check): the same steps, the same
// tokens in each, only their division among the ranks differs; the steps before it keep theirs.
class PlanCache {
 public:
  PlanCache(const io::DatasetIndex& index, std::vector<uint64_t> docs, balance::PlanOptions opts, int world_size);
  // A mixture's plans (data.sources): drawn by `mixture` over the merged index.
  PlanCache(const io::DatasetIndex& index, std::shared_ptr<balance::MixturePlanner> mixture, int world_size);
  // Throws kilter::Error when the epoch has no step (too few tokens for train.tokens_per_step).
  // The plan the epoch was first built with: its statistics, its step count.
  const balance::EpochPlan& get(uint64_t epoch);
  // The step at `pos`, from the plan that holds it (after a replan(), the later plan from its
  // position on).
  balance::StepView step(balance::PlanPosition pos);
  void drop_before(uint64_t epoch);
  // Plans the steps from `from` on (every later epoch too) with the transfer charge t, as given
  // (not raised by the link-bound rule). Same on every rank; no communication. Steps before `from`
  // stay as they were, so a reader already fed from them stays right.
  void replan(balance::PlanPosition from, double t);
  // The (resolved) cost model the steps at `pos` were planned with.
  const balance::CostModel& cost(balance::PlanPosition pos);
  // A mixture's sources that wrap into their next epoch during `epoch` (after get(epoch)).
  const std::vector<balance::SourceWrap>& wraps(uint64_t epoch) { return wraps_[epoch]; }

 private:
  const io::DatasetIndex& index_;
  std::vector<uint64_t> docs_;
  balance::PlanOptions opts_;
  int world_size_;
  // An epoch's plan and, after a replan() inside it, the plan of its steps from `switch_step` on.
  struct Entry {
    balance::EpochPlan plan;
    std::unique_ptr<balance::EpochPlan> later;
    uint64_t switch_step = UINT64_MAX;
  };
  balance::EpochPlan build(uint64_t epoch);
  Entry& entry(uint64_t epoch);
  // The plan that holds the step at `pos`: the later one from its switch step on.
  const balance::EpochPlan& plan_at(balance::PlanPosition pos);
  std::map<uint64_t, Entry> plans_;
  std::shared_ptr<balance::MixturePlanner> mixture_;
  std::map<uint64_t, std::vector<balance::SourceWrap>> wraps_;
};

// Walks this rank's micro-batches across steps and epochs from a plan position.
class PrefetchCursor {
 public:
  PrefetchCursor(PlanCache& plans, int rank, balance::PlanPosition start, int64_t steps_left);
  // Next micro-batch's pieces, or false when the run's steps are all queued.
  bool next(std::vector<io::PieceRequest>& out);
  // Steps of the run not yet passed: the step the cursor reads from (it may have queued some of
  // its micro-batches) is run_steps - steps_left() from the run's start.
  int64_t steps_left() const { return steps_left_; }

 private:
  PlanCache& plans_;
  int rank_;
  balance::PlanPosition pos_;
  int64_t steps_left_;
  size_t mb_ = 0;
  balance::MicroBatch scratch_;
};

// The reader's requests for one micro-batch's pieces, in order.
void piece_requests(const balance::MicroBatch& mb, std::vector<io::PieceRequest>& out);

}  // namespace kilter::train
