// CutCostWatch (calibration_cut_cost.h).
#include "lib/train/calibration_cut_cost.h"

#include <cstdio>

namespace kilter::train {

CutCostWatch::CutCostWatch(int64_t window_steps, int64_t first_step)
    : window_(window_steps), begin_(first_step + 2) {}

void CutCostWatch::add_step(const diag::StepRecord* records, int ranks) {
  if (!active() || ranks <= 0) return;
  const int64_t step = records[0].step;
  if (step < begin_ || step > window_end()) return;
  for (int r = 0; r < ranks; ++r) {
    const diag::StepRecord& rec = records[r];
    if (rec.tokens_computed <= 0) continue;  // an idle rank in this step
    balance::CostSample s;
    s.tokens_computed = double(rec.tokens_computed);
    s.attn_work = rec.attn_work;
    // forward and backward are the rank's own work: its K/V waits are taken out of them
    s.seconds = rec.phase[diag::kForward] + rec.phase[diag::kBackward];
    s.micro_batches = double(rec.micro_batches);
    s.kv_wait = rec.phase[diag::kKvWait];
    s.kv_tokens = double(rec.kv_tokens);
    samples_.push_back(s);
  }
  ++steps_seen_;
}

balance::CutCostCheck CutCostWatch::decide(const balance::CostModel& plan_cost) {
  decided_ = true;
  balance::CutCostCheck check = balance::check_cut_cost(samples_, plan_cost);
  samples_.clear();
  samples_.shrink_to_fit();
  return check;
}

std::string describe_cut_cost_check(const balance::CutCostCheck& check, int64_t window_begin, int64_t window_end,
                                    int64_t replan_from_step) {
  char line[512];
  const int n = std::snprintf(line, sizeof line, "cut-cost check, steps %lld-%lld: ", (long long)window_begin,
                              (long long)window_end);
  const std::string head(line, size_t(n));
  if (check.replan && replan_from_step == kRunEnds) {
    std::snprintf(line, sizeof line, "kv_wait measured t = %.3g against the planned %.3g, but the run ends before a "
                  "new plan could start", check.measured_t, check.planned_t);
    return head + line;
  }
  if (!check.replan) {
    std::snprintf(line, sizeof line,
                  "kv_wait measured t = %.3g dense tokens per earlier token (%llu (rank, step) rows) against the "
                  "planned %.3g, a difference of %.1f%% of the step of a rank that received K/V: the plan's charge "
                  "holds",
                  check.measured_t, (unsigned long long)check.rows, check.planned_t, 100 * check.excess_share);
    return head + line;
  }
  const std::string miss = balance::cut_cost_miss(check.measured_t, check.rows, check.planned_t, check.excess_share);
  if (replan_from_step < 0)
    return head + miss + balance::cut_cost_remedy(check.measured_t) +
           ", or data.cut_cost_replan = true to have a run re-plan itself when this happens";
  std::snprintf(line, sizeof line,
                "; steps from %lld on are planned with t = %.3g (same steps and tokens, other cuts; data.cost_t fixes "
                "the charge, data.cut_cost_replan = false keeps the plan)",
                (long long)replan_from_step, check.measured_t);
  return head + miss + line;
}

}  // namespace kilter::train
