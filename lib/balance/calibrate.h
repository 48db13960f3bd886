// Calibration of the cost model cost = a * tokens_computed + b * sum(L^2) from measured step
// times: a least-squares fit over the (rank, step) rows of a run's metrics/rank-NNNNN.csv files.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kilter::balance {

// One rank's share of one step: its padded tokens, its sum of L^2 and its compute seconds.
struct CostSample {
  double tokens_computed = 0;
  double attn_work = 0;  // sum over the rank's pieces of len^2
  double seconds = 0;    // forward + backward
};

struct CostFit {
  double a = 0;          // seconds per computed token
  double b = 0;          // seconds per unit of sum(L^2)
  double intercept = 0;  // seconds per (rank, step) the model does not attribute (launches, ...)
  double r2 = 0;         // coefficient of determination of the fit
  uint64_t samples = 0;
  double b_over_a() const { return a > 0 ? b / a : 0; }
};

// Least squares of seconds ~ intercept + a tokens_computed + b attn_work. Throws kilter::Error
// when there are fewer than 3 samples or when tokens_computed and attn_work are (nearly)
// collinear, i.e. the lengths did not vary enough to tell a from b.
CostFit fit_cost_model(const std::vector<CostSample>& samples);

// Reads RUN_DIR/metrics/rank-*.csv: the header names the columns `step`, `tokens_computed`,
// `attn_work`, `forward` and `backward` (a `_s` suffix on the time columns is accepted). Rows
// with step < skip_steps (warm-up) and rows of idle ranks (tokens_computed = 0) are skipped.
// Throws kilter::Error naming the file and the missing column or bad value.
std::vector<CostSample> read_cost_samples(const std::string& run_dir, int64_t skip_steps);

}  // namespace kilter::balance
