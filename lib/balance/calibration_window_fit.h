// The cost model fitted to a window of a training run (data.cost_calibration = auto; docs/plan.md,
// "In-run calibration"). Every rank's compute seconds in every step of the window are set against
// its work: computed tokens, attention work (sum of L^2) and micro-batches, as
//   seconds(r, s) = m_s x f_r x (scale x units + beta x attention + gamma x micro-batches)
// with units the plan's own cost (a tokens + b attention + c micro-batches), m_s how fast the
// machine ran in step s (shared by its ranks: the scheduler, the file system, other jobs), f_r
// rank r's speed factor (one per segment of the window's steps: see
// WindowFitOptions::speed_segments). The step factors keep what every rank of a step shares out of the
// coefficients, so b and c move by what differs between the ranks of one step (which is what the
// division decides): b = b_plan + beta / scale, c = c_plan + gamma / scale. Guards say whether
// the fit may be used; compare_divisions() says whether a division made with it beats the one in
// force by more than the fit's own noise.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "lib/balance/calibration_fit.h"
#include "lib/balance/plan.h"

namespace kilter::balance {

// What a window's fit may change.
struct WindowFitOptions {
  CostModel current;   // the resolved cost model the window's steps were planned with
  CostModel derived;   // the model shape's coefficients (b, c): the centre of the bounds a fit must keep
  bool fit_b = true;   // false: data.cost_b is pinned (kept at current.b)
  bool fit_c = true;   // false: data.cost_c is pinned
  bool fit_t = true;   // false: data.cost_t is pinned (or nothing is cut)
  int world_size = 1;
  // The steps where a new segment of speeds begins (sorted; in a run, the steps after each earlier
  // fit's window): every segment has speeds of its own (one with fewer than kFitMinSegmentSteps
  // steps joins its neighbour). b and c are the hardware's, fitted over every step, but a rank's
  // speed is what it is now: a slowdown in earlier steps is not carried forward, nor does it bend
  // b, and a rank that became slower is seen in full. The plan takes the latest segment's speeds.
  std::vector<int64_t> speed_segments;
  // The speeds the latest steps were divided with (empty: every rank at 1). A fitted speed within
  // its noise (and kFitMinSpeedGap) of its rank's stays it.
  std::vector<double> planned_speed;
};

// The guards' figures (docs/plan.md says why each).
constexpr double kFitMinR2 = 0.25;          // of the differences within steps, where b or c is fitted
constexpr double kFitMinSpread = 1e-2;      // within-step sd of attention (micro-batches) over its mean, to fit b (c)
constexpr double kFitBRange = 4;            // b within [derived / 4, derived x 4]
constexpr double kFitCMaxTokens = 1024;     // c within [0, 1024 tokens' worth]
constexpr double kFitMinSpeedGap = 0.005;   // a speed factor differs from 1 (the plan's) by at least this ...
constexpr double kFitSpeedHold = 0.02;      // (a speed in force other than 1 stays within this of its estimate)
constexpr double kFitSpeedNoise = 3;        // ... and by this many of its standard errors
constexpr double kFitSpeedRange = 3;        // speed factors within [1/3, 3]
constexpr double kFitSpeedMinF = 4;         // the speeds' F statistic against every rank at 1 (b confounded)
constexpr int kFitMinDegreesOfFreedom = 8;
constexpr double kFitOutlier = 3.5;          // a step whose rank is this many robust sds off the fit is left out ...
constexpr double kFitMaxOutlierShare = 0.2; // ... unless more than this share of the steps would be
constexpr size_t kFitMinSegmentSteps = 10;  // steps each speed segment needs (else one segment)

struct WindowFit {
  bool usable = false;         // the fit passed its guards (at least for the speeds and the scale)
  std::string note;            // what the guards kept or refused, in words ("" where all was fitted)
  CostModel cost;              // the fitted model in the plan's units (a stays the plan's); current where not fitted
  CostModel units;             // the plan the window ran (WindowFitOptions::current): column 0's prices
  bool b_fitted = false, c_fitted = false, t_fitted = false;
  double seconds_per_unit = 0; // seconds one unit of cost takes on a rank of speed 1
  std::vector<double> rank_speed;     // per rank; 1 where it does not differ beyond its noise
  std::vector<double> rank_speed_se;  // their standard errors
  // Per rank of each speed segment, oldest first, as fitted (rank_speed: the latest's, settled).
  std::vector<double> segment_speed;
  int64_t speeds_from_step = -1;      // the first step rank_speed was fitted on (the latest segment's)
  double r2 = 0;               // of the within-step differences, where b or c was fitted (else 0)
  double residual_ss = 0;      // the squared seconds the fit leaves unexplained within steps
  uint64_t rows = 0, steps = 0;  // the rows and steps fitted (outliers left out)
  uint64_t outlier_steps = 0;     // steps left out, a rank's seconds far off the first fit
  // The prediction's columns: 0, the units of `units` (a tokens + b attention + c micro-batches),
  // at coef[0] = seconds_per_unit; 1, attention work, and 2, micro-batches, at the seconds beyond
  // what `units` charges for them (0 where not fitted). Their covariance (the scale's as a ratio
  // estimator, the others' from the within-step regression) is what compare_divisions()'s noise
  // rests on.
  bool column[3] = {true, false, false};
  double coef[3] = {};
  double cov[3][3] = {};
  double t_seconds = 0;        // seconds per earlier token of a cut (kv_wait / kv_tokens), 0: not measured
};

// The fit of `samples` (rows with step >= 0 and rank >= 0; idle rank-steps left out). Never throws
// on data: what cannot be fitted comes back with usable = false and the reason in `note`.
WindowFit fit_window(const std::vector<CostSample>& samples, const WindowFitOptions& opts);

// The fit's prediction of two divisions of the same steps, the plan in force and a candidate made
// with the fit (the same pieces in each step): per step, the busiest rank's seconds, each rank's
// work priced by the fitted coefficients x its fitted speed.
struct PlanComparison {
  uint64_t steps = 0;
  double current_seconds = 0;    // sum over the steps of the busiest rank's predicted seconds
  double candidate_seconds = 0;
  double gain_sd = 0;            // standard deviation of the difference, from the fit's noise
  double current_imbalance = 1;  // mean over the steps of busiest / mean predicted seconds
  double candidate_imbalance = 1;
  double gain() const { return current_seconds - candidate_seconds; }
  double relative_gain() const { return current_seconds > 0 ? gain() / current_seconds : 0; }
  // The candidate pays: its predicted gain is above kReplanGainNoise of its standard deviations and
  // above kReplanMinGain of the steps' time. The gain is systematic, step after step, so a small
  // one pays over the run (0.1% of the busiest rank's time is 0.0005 of sync_wait on 2 ranks, a
  // quarter of a quiet machine's whole floor); below kReplanMinGain it would not repay the re-plan.
  bool pays() const;
};
constexpr double kReplanGainNoise = 2;
constexpr double kReplanMinGain = 5e-4;
PlanComparison compare_divisions(const std::vector<StepView>& current, const std::vector<StepView>& candidate,
                                 const WindowFit& fit);

// One rank's work in one step of a plan, as the fit prices it.
struct RankWork {
  double tokens = 0, attn = 0, micro_batches = 0, kv_tokens = 0;
};
std::vector<RankWork> step_rank_work(const StepView& step);
// Predicted seconds of `work` on `rank` under `fit` (speed included).
double predicted_seconds(const WindowFit& fit, const RankWork& work, int rank);

}  // namespace kilter::balance
