// The cut-cost check of a training run (data.cut_cost_check; docs/plan.md, "The cut-cost check"):
// rank 0 collects every rank's step records over a window of steps with cut pieces and judges
// the charge per earlier token the plan cut with against what the K/V waits measured
// (balance::check_cut_cost). Where cuts cost clearly more than charged, rank 0 warns, or with
// data.cut_cost_replan the rest of the run is planned with the measured charge
// (PlanCache::replan): the same steps and tokens, divided by a truer cost, so cuts that do not
// pay are not made. Once per run; no MPI here (the verdict travels in the step's reduction,
// train_step.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "lib/balance/calibration_fit.h"
#include "lib/diag/step_record.h"

namespace kilter::train {

class CutCostWatch {
 public:
  // window_steps <= 0: inactive. The first two steps of this process are warm-up and skipped; the
  // window is the window_steps steps after them.
  CutCostWatch(int64_t window_steps, int64_t first_step);
  bool active() const { return window_ > 0 && !decided_; }
  // Rank 0: every rank's record of one step (diag::RankDiagnostics::on_step_records).
  void add_step(const diag::StepRecord* records, int ranks);
  // Rank 0: the whole window has been gathered and no verdict was given yet.
  bool ready() const { return active() && steps_seen_ >= window_; }
  // Rank 0, once, when ready(): the verdict against the cost model the window's steps were
  // planned with. Afterwards active() is false.
  balance::CutCostCheck decide(const balance::CostModel& plan_cost);
  // The first and last step of the window (for messages).
  int64_t window_begin() const { return begin_; }
  int64_t window_end() const { return begin_ + window_ - 1; }

 private:
  int64_t window_;
  int64_t begin_;
  int64_t steps_seen_ = 0;
  bool decided_ = false;
  std::vector<balance::CostSample> samples_;
};

// What a check that measured (check.measured) found, one line for the log (rank 0).
// replan_from_step: the step the new plan starts at; -1 where the run does not re-plan
// (data.cut_cost_replan = false: the line then names the settings), kRunEnds where it would but
// the run ends first.
constexpr int64_t kRunEnds = -2;
std::string describe_cut_cost_check(const balance::CutCostCheck& check, int64_t window_begin, int64_t window_end,
                                    int64_t replan_from_step);

}  // namespace kilter::train
