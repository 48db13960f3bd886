// The batch plan as the trainer walks it: each epoch's plan built on demand (identically on every
// rank, no communication) and this rank's micro-batches in the order training consumes them, so
// the reader can be fed ahead of the trainer.
#pragma once
#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "io/dataset.h"
#include "io/reader.h"
#include "lib/balance/mixture.h"
#include "lib/balance/plan.h"

namespace kilter::train {

// What a re-plan changes: the cost model a plan divides with and the ranks' speeds (the cut-cost
// check's transfer charge, the in-run calibration's fit). Unresolved, as PlanOptions holds them.
struct PlanModel {
  balance::CostModel cost;
  std::vector<double> rank_speed;  // empty: every rank 1
};

// The plan of each epoch, built on demand and dropped once passed. replan() gives the steps from a
// position on a plan with another model (the cut-cost check, the in-run calibration): the same
// steps, the same tokens in each, only their division among the ranks differs; the steps before
// it keep theirs. start_build() makes such a plan on a thread of its own while training goes on,
// and switch_to() puts it in force from a position the ranks agreed on (trainer.cpp).
class PlanCache {
 public:
  PlanCache(const io::DatasetIndex& index, std::vector<uint64_t> docs, balance::PlanOptions opts, int world_size);
  // A mixture's plans (data.sources): drawn by `mixture` over the merged index.
  PlanCache(const io::DatasetIndex& index, std::shared_ptr<balance::MixturePlanner> mixture, int world_size);
  ~PlanCache();  // waits for a build in flight (it reads the index)
  PlanCache(const PlanCache&) = delete;
  PlanCache& operator=(const PlanCache&) = delete;
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
  // The same with a whole model (in this thread: what a resume restores before training).
  void replan(balance::PlanPosition from, const PlanModel& model);
  // The model plans are built with from now on.
  PlanModel model() const;
  // The (resolved) cost model and the rank speeds the steps at `pos` were planned with.
  const balance::CostModel& cost(balance::PlanPosition pos);
  const std::vector<double>& rank_speed(balance::PlanPosition pos);

  // A re-plan in the background: the plan of `epoch` with `model`, built on a thread of its own
  // (identically on every rank); nothing waits for it. One at a time. `then`, where given, runs on
  // that thread with the built plan before build_ready() turns true (rank 0 compares it there).
  void start_build(uint64_t epoch, PlanModel model, std::function<void(const balance::EpochPlan&)> then = {});
  // The same where the model is chosen on the thread too: `choose` fills it, or returns false for
  // no build at all.
  void start_job(uint64_t epoch, std::function<bool(PlanModel&)> choose,
                 std::function<void(const balance::EpochPlan&)> then = {});
  // The plan that holds the step at `pos`, shared: it stays alive for a thread that reads it while
  // the cache moves on (drop_before()).
  std::shared_ptr<const balance::EpochPlan> shared_plan_at(balance::PlanPosition pos);
  bool build_pending() const { return build_ != nullptr; }  // started, not yet switched to or dropped
  bool build_ready() const { return build_ && build_->done.load(); }
  uint64_t build_epoch() const { return build_ ? build_->epoch : 0; }
  const PlanModel& build_model() const { return build_->model; }
  // After build_ready(): the plan (rank 0 compares it with the plan in force). Rethrows the
  // thread's error (also where the build was skipped: then call it only for that).
  const balance::EpochPlan& built_plan();
  // After build_ready(): the built plan holds the steps from `from` on (its epoch's; later epochs
  // are planned with its model). false where `from` lies in a later epoch than the one built,
  // past its first step (the cursor crossed an epoch meanwhile): build that epoch, then switch.
  bool switch_to(balance::PlanPosition from);
  void drop_build();  // waits for the thread and forgets the plan
  // A mixture's sources that wrap into their next epoch during `epoch` (after get(epoch)).
  const std::vector<balance::SourceWrap>& wraps(uint64_t epoch) { return wraps_[epoch]; }

 private:
  const io::DatasetIndex& index_;
  std::vector<uint64_t> docs_;
  balance::PlanOptions opts_;
  int world_size_;
  // An epoch's plan and, after re-plans inside it, the plans of its steps from each switch step
  // on (ascending).
  struct Entry {
    std::shared_ptr<balance::EpochPlan> plan;
    std::vector<std::pair<uint64_t, std::shared_ptr<balance::EpochPlan>>> later;
  };
  // A background build (start_build): its own copy of what it plans with.
  struct Build {
    uint64_t epoch = 0;
    PlanModel model;
    balance::EpochPlan plan;
    std::thread thread;
    std::atomic<bool> done{false};
    bool skipped = false;
    std::exception_ptr error;
  };
  balance::EpochPlan build(uint64_t epoch);
  // The plan of `epoch` with `model`, from copies (safe on another thread).
  static balance::EpochPlan build_with(const io::DatasetIndex& index, const std::vector<uint64_t>& docs,
                                       balance::PlanOptions opts, balance::MixturePlanner* mixture, int world_size,
                                       uint64_t epoch);
  void set_model(const PlanModel& model);
  // `plan` in force from `from` on: a segment of its epoch (or the whole epoch from its first
  // step); later epochs are planned again on demand.
  void install(balance::PlanPosition from, std::shared_ptr<balance::EpochPlan> plan);
  Entry& entry(uint64_t epoch);
  // The plan that holds the step at `pos`: the later one from its switch step on.
  const balance::EpochPlan& plan_at(balance::PlanPosition pos);
  std::map<uint64_t, Entry> plans_;
  std::shared_ptr<balance::MixturePlanner> mixture_;
  std::map<uint64_t, std::vector<balance::SourceWrap>> wraps_;
  std::unique_ptr<Build> build_;
  std::unique_ptr<balance::MixturePlanner> build_mixture_;  // the background build's copy
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
