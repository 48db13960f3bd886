// Calibration of the cost model cost = a * tokens_computed + b * sum(L^2) + c * micro-batches
// from measured step times: a least-squares fit over the (rank, step) rows of a run's
// metrics/rank-NNNNN.csv files.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "lib/balance/plan.h"

namespace kilter::balance {

// One rank's share of one step: its computed tokens, its attention work, its micro-batches and its
// compute seconds.
struct CostSample {
  double tokens_computed = 0;
  double attn_work = 0;      // sum over the rank's segments of len^2
  double seconds = 0;        // forward + backward
  double micro_batches = 1;  // micro-batches the rank ran in the step
  double kv_wait = 0;        // seconds waiting for the K/V of earlier parts (context parallelism; 0 when not recorded)
  double kv_tokens = 0;      // earlier tokens whose K/V the rank received in the step
  int64_t step = -1;         // the step of the row (-1: not recorded, as in the trainer's check)
  int rank = -1;             // the rank of the row (-1: not recorded)
};

// The transfer coefficient from measured waits: every second any rank waited in the K/V
// exchange over the earlier tokens whose K/V were received, seconds_per_token = sum(kv_wait) /
// sum(kv_tokens) over all rows. The plan charges a cut once, t per earlier token on the later
// part; the waits it causes fall on both sides: the later part's rank waits for K/V in the
// forward, the earlier part's for dK/dV in the backward (kv_tokens = 0 there). A fit over the
// receiving rows alone missed the second kind (40% of the waits on scripts/vcluster) and, through
// the origin, weighted the long prefixes whose waits grow least: it measured half the charge that
// explains the run's step times (docs/plan.md, "Calibration"). measured = false where no row
// received K/V (no cut piece in the run): keep the derived t.
struct TransferFit {
  bool measured = false;
  double seconds_per_token = 0;
  uint64_t samples = 0;
  double cost_t(double a_seconds_per_token) const {
    return measured && a_seconds_per_token > 0 ? std::max(0.0, seconds_per_token / a_seconds_per_token) : 0;
  }
};
TransferFit fit_transfer_cost(const std::vector<CostSample>& samples);

struct CostFit {
  double a = 0;          // seconds per computed token
  double b = 0;          // seconds per unit of sum(L^2)
  double c = 0;          // seconds per micro-batch
  double intercept = 0;  // seconds per (rank, step) beyond the three terms (0 when folded into c)
  double r2 = 0;         // coefficient of determination (1 - SSE / centered SST)
  uint64_t samples = 0;
  // true: micro_batches did not vary (or was not recorded), so c and the intercept cannot be told
  // apart; the fixed time per (rank, step) is then taken as c x micro-batches.
  bool c_from_intercept = false;
  double b_over_a() const { return a > 0 ? b / a : 0; }
  double c_over_a() const { return a > 0 ? c / a : 0; }
};

// Least squares of seconds ~ intercept + a tokens_computed + b attn_work + c micro_batches.
// Where micro_batches is constant over the samples (or collinear with the others) the fit drops
// it and sets c = intercept / micro_batches, intercept = 0. Throws kilter::Error when there are
// fewer than 4 samples or when tokens_computed and attn_work are (nearly) collinear, i.e. the
// lengths did not vary enough to tell a from b.
CostFit fit_cost_model(const std::vector<CostSample>& samples);

// The sentence the trainer's check and kilter report's advice both say where a charge did not
// hold: "cut pieces cost more than the plan charged: their kv_wait measured t = ... (N (rank,
// step) rows[ over S steps]), the plan cut with t = ..., a miss of about N% of the step of a rank
// that received K/V" (steps = 0: the steps are not known, and not named).
std::string cut_cost_miss(double measured_t, uint64_t rows, double planned_t, double excess_share,
                          uint64_t steps = 0);
// What both say follows from it: ", so its cuts can make steps slower here; set data.cost_t =
// <measured_t> (the plan then cuts only where that pays)"; each adds its other setting.
std::string cut_cost_remedy(double measured_t);

// The cut-cost check of a training run (data.cut_cost_check): what its cut pieces cost against the
// charge the plan cut with. The transfer is fitted as fit_transfer_cost() fits it; the seconds of
// a unit of cost come from the plan's own cost model, sum(seconds) / sum(a tokens_computed +
// b attn_work + c micro_batches) over `samples` (no regression: a few steps of one run suffice,
// and the unit is the one the plan charges t in). replan: the measured charge is above 1.5x the
// planned one and the difference costs the ranks that received K/V at least 2% of their step
// (the rule kilter report's advice follows too), so the rest of the run should be planned with
// measured_t.
struct CutCostCheck {
  bool measured = false;     // rows with kv_tokens > 0 and computed work exist
  double measured_t = 0;     // dense tokens (cost units) per earlier token
  double planned_t = 0;
  double excess_share = 0;   // (measured - planned) x earlier tokens / computed tokens, ranks that received
  uint64_t rows = 0;         // (rank, step) rows with kv_tokens > 0
  uint64_t steps = 0;        // distinct steps of those rows, where the samples record their step (else 0)
  bool replan = false;
};
CutCostCheck check_cut_cost(const std::vector<CostSample>& samples, const CostModel& plan_cost);

// The advice line on a check whose charge did not hold (check.replan: the rule above): the figures
// and the settings that follow from them (data.cost_t = the measured figure, or data.cut_pieces =
// false); "" where the charge held, where its miss is too small to matter, or where nothing was
// measured. kilter report says it only where report_cut_cost_advice() finds the sample earns it.
std::string cut_cost_advice(const CutCostCheck& check);

// The sample kilter report's advice needs: rows that received K/V, over distinct steps.
// The measured charge is a ratio of sums, Σ kv_wait / Σ kv_tokens, whose relative error falls as
// c / sqrt(rows), c the spread of one row's wait per earlier token relative to its mean. With c
// = 1 (a row's wait varies by about its own size: a partner's hiccup, the scheduler), 16 rows
// put the error at 25%, so the 1.5x rule's 50% margin is two standard errors and a charge that
// held is seldom read as missed; one row (the demo's first advice, t = 95 against 0.0008) is
// anything. Rows of one step are not independent: they share its stalls (an evaluation, a
// checkpoint, a page-cache miss reach every rank), so the rows must span 5 steps, half the
// window the trainer's check judges by default (data.cut_cost_check = 10). That check judges
// its window however few rows received K/V in it (the e2e drill's: 5 rows over 2 steps); the
// report, which advises a setting for the next runs, asks for more.
constexpr uint64_t kCutCostAdviceMinRows = 16;
constexpr uint64_t kCutCostAdviceMinSteps = 5;

// What the run's own cut-cost check said (summary.json cut_cost_check; ran = false where the
// summary has none: the check was off, the charge was given, or the run was resumed after one).
struct RunCutCostCheck {
  bool ran = false;
  bool measured = false;     // some rank received K/V in its window
  bool charge_held = true;
  bool replanned = false;    // the run planned its remaining steps with the measured charge
  uint64_t rows = 0;         // (rank, step) rows of its window that received K/V
  int64_t window_begin = -1, window_end = -1;
};

// kilter report's advice from the whole run's rows (whole_run: check_cut_cost over
// read_cost_samples) beside the run's own check (docs/plan.md, "The report's advice"). The rule:
// - none where the run re-planned: it already followed the advice;
// - none where whole_run rests on fewer than kCutCostAdviceMinRows rows over
//   kCutCostAdviceMinSteps steps ("none: ..." where the check warned, saying why);
// - where the check judged as many rows as the whole run has, the report follows its verdict;
// - else the whole run's verdict, which rests on more rows: where it differs from the check's (the
//   check held or measured nothing and the whole run did not hold, or the reverse), the line says
//   so and why.
// The line to print after "advice: " ("" for none): "cut pieces cost more ..." where it names a
// setting, "none: ..." where it explains why it does not repeat the check's warning.
std::string report_cut_cost_advice(const CutCostCheck& whole_run, const RunCutCostCheck& run_check);

// Reads RUN_DIR/metrics/rank-*.csv: the header names the columns `step`, `tokens_computed`,
// `attn_work`, `forward` and `backward` (a `_s` suffix on the time columns is accepted), and
// `micro_batches` when the run recorded it (older runs: 1 per row). Rows with step < skip_steps
// (warm-up) and rows of idle ranks (tokens_computed = 0) are skipped. `kv_wait` and `kv_tokens`
// are read where the header names them (runs with cut pieces), else 0.
// Throws kilter::Error naming the file and the missing column or bad value.
std::vector<CostSample> read_cost_samples(const std::string& run_dir, int64_t skip_steps);

}  // namespace kilter::balance
