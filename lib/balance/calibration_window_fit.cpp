// The in-run fit (see calibration_window_fit.h). The rows form a panel of (step, rank). The plan in force
// made its ranks' costs about equal under its own coefficients, so between the ranks of a step
// the work differs mostly along what that model trades (tokens against attention against
// micro-batches): the window tells well how far the true coefficients are from the plan's, and
// the scale from the level. The fit alternates: step factors and speeds as ratios of sums given
// the coefficients; the coefficients by least squares of seconds / (step factor x speed) on the
// plan's units, attention and micro-batches given the factors; until they settle.
#include "lib/balance/calibration_window_fit.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>

namespace kilter::balance {

namespace {

// The rows of the window as a panel: dense step and rank indices, and the columns' values.
struct Panel {
  size_t n = 0;
  size_t steps = 0;
  int ranks = 0;
  int segments = 1;                // speed segments (WindowFitOptions::speed_segments, merged to enough steps)
  int64_t last_segment_from = 0;   // the first step of the latest segment
  std::vector<size_t> step_of;
  std::vector<int64_t> step_id;    // per dense index: the step
  std::vector<int> rank_of;
  std::vector<int> group_of;       // the row's speed: rank + ranks x segment
  int groups() const { return ranks * segments; }
  std::vector<double> step_count, rank_count;
  std::vector<double> y;           // compute seconds
  std::vector<double> col[3];      // u (the plan's units), attention work, micro-batches
  std::vector<double> kv_tokens, kv_wait;
};

// Each row's speed group: its rank in its segment of steps. The segments start at `starts`; one
// with fewer than kFitMinSegmentSteps steps of the panel is merged with the one after it (the
// last, with the one before it).
void assign_segments(Panel& p, const std::vector<int64_t>& starts) {
  std::map<int64_t, size_t> raw_steps;  // raw segment (its index in starts + 1) -> steps
  const auto raw_of = [&starts](int64_t step) {
    return int64_t(std::upper_bound(starts.begin(), starts.end(), step) - starts.begin());
  };
  for (int64_t step : p.step_id) raw_steps[raw_of(step)] += 1;
  std::map<int64_t, int> merged;  // raw segment -> merged segment
  int segment = -1;
  size_t held = kFitMinSegmentSteps;  // steps of the merged segment being filled
  for (const auto& [raw, steps] : raw_steps) {
    if (held >= kFitMinSegmentSteps) ++segment, held = 0;
    merged[raw] = segment;
    held += steps;
  }
  if (segment > 0 && held < kFitMinSegmentSteps) {  // the last is short: it joins the one before
    for (auto& [raw, m] : merged)
      if (m == segment) m = segment - 1;
    --segment;
  }
  p.segments = std::max(segment + 1, 1);
  p.group_of.resize(p.n);
  p.last_segment_from = INT64_MAX;
  for (size_t i = 0; i < p.n; ++i) {
    const int64_t step = p.step_id[p.step_of[i]];
    const int seg = merged[raw_of(step)];
    p.group_of[i] = p.rank_of[i] + p.ranks * seg;
    if (seg == p.segments - 1) p.last_segment_from = std::min(p.last_segment_from, step);
  }
}

Panel make_panel(const std::vector<CostSample>& samples, const WindowFitOptions& opts,
                 const std::set<int64_t>& left_out = {}) {
  Panel p;
  p.ranks = opts.world_size;
  std::map<int64_t, size_t> step_index;
  for (const CostSample& s : samples) {
    if (!(s.tokens_computed > 0) || s.step < 0 || s.rank < 0 || s.rank >= opts.world_size) continue;
    if (left_out.count(s.step)) continue;
    const auto [it, inserted] = step_index.emplace(s.step, step_index.size());
    p.step_of.push_back(it->second);
    p.rank_of.push_back(s.rank);
    p.y.push_back(s.seconds);
    const CostModel& cur = opts.current;
    p.col[0].push_back(cur.a * s.tokens_computed + cur.b * s.attn_work + cur.c * s.micro_batches);
    p.col[1].push_back(s.attn_work);
    p.col[2].push_back(s.micro_batches);
    p.kv_tokens.push_back(s.kv_tokens);
    p.kv_wait.push_back(s.kv_wait);
  }
  p.n = p.y.size();
  p.steps = step_index.size();
  p.step_id.resize(p.steps);
  for (const auto& [step, index] : step_index) p.step_id[index] = step;
  p.step_count.assign(p.steps, 0);
  p.rank_count.assign(size_t(p.ranks), 0);
  for (size_t i = 0; i < p.n; ++i) p.step_count[p.step_of[i]] += 1, p.rank_count[size_t(p.rank_of[i])] += 1;
  assign_segments(p, opts.speed_segments);
  return p;
}

// The step effect and the rank effect of `v` (alternating means until they settle), either
// subtracted from it (demean) or returned in `rank_effect` (relative: only differences count).
void two_way(const Panel& p, std::vector<double>& v, std::vector<double>* rank_effect) {
  std::vector<double> step_sum(p.steps), rank_sum(size_t(p.ranks)), rank_total(size_t(p.ranks), 0.0);
  double scale = 0;
  for (double x : v) scale = std::max(scale, std::fabs(x));
  for (int iter = 0; iter < 100; ++iter) {
    std::fill(step_sum.begin(), step_sum.end(), 0.0);
    for (size_t i = 0; i < p.n; ++i) step_sum[p.step_of[i]] += v[i];
    for (size_t i = 0; i < p.n; ++i) v[i] -= step_sum[p.step_of[i]] / p.step_count[p.step_of[i]];
    std::fill(rank_sum.begin(), rank_sum.end(), 0.0);
    for (size_t i = 0; i < p.n; ++i) rank_sum[size_t(p.rank_of[i])] += v[i];
    double moved = 0;
    for (int r = 0; r < p.ranks; ++r) {
      if (p.rank_count[size_t(r)] > 0) rank_sum[size_t(r)] /= p.rank_count[size_t(r)];
      rank_total[size_t(r)] += rank_sum[size_t(r)];
      moved = std::max(moved, std::fabs(rank_sum[size_t(r)]));
    }
    for (size_t i = 0; i < p.n; ++i) v[i] -= rank_sum[size_t(p.rank_of[i])];
    if (moved <= 1e-13 * scale) break;
  }
  if (rank_effect) *rank_effect = rank_total;
}

// Inverts the k x k matrix m (k <= 3) in place by Gauss-Jordan with partial pivoting; false where
// a pivot is negligible (collinear columns; m is a correlation matrix, so the scale is 1).
bool invert(int k, double m[3][3]) {
  double inv[3][3] = {{1, 0, 0}, {0, 1, 0}, {0, 0, 1}};
  for (int col = 0; col < k; ++col) {
    int pivot = col;
    for (int row = col + 1; row < k; ++row)
      if (std::fabs(m[row][col]) > std::fabs(m[pivot][col])) pivot = row;
    if (std::fabs(m[pivot][col]) < 1e-9) return false;
    std::swap(m[pivot], m[col]);
    std::swap(inv[pivot], inv[col]);
    const double d = m[col][col];
    for (int j = 0; j < k; ++j) m[col][j] /= d, inv[col][j] /= d;
    for (int row = 0; row < k; ++row) {
      if (row == col) continue;
      const double f = m[row][col];
      for (int j = 0; j < k; ++j) m[row][j] -= f * m[col][j], inv[row][j] -= f * inv[col][j];
    }
  }
  for (int i = 0; i < k; ++i)
    for (int j = 0; j < k; ++j) m[i][j] = inv[i][j];
  return true;
}

// The within-step spread of column j over its mean: whether the window tells its coefficient.
double spread(const Panel& p, int j) {
  std::vector<double> v = p.col[j];
  double mean = 0;
  for (double x : v) mean += std::fabs(x);
  mean /= double(std::max<size_t>(p.n, 1));
  two_way(p, v, nullptr);
  double ss = 0;
  for (double x : v) ss += x * x;
  return mean > 0 ? std::sqrt(ss / double(std::max<size_t>(p.n, 1))) / mean : 0;
}

// The lower median: the speeds' reference. A typical rank is 1, and of two ranks the faster one (a
// slower rank then reads "1.15", not "1.07" against "0.93").
double lower_median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[(v.size() - 1) / 2];
}

// Each row's predicted work seconds at speed 1: the fitted columns.
std::vector<double> predicted(const Panel& p, const double coef[3]) {
  std::vector<double> out(p.n);
  for (size_t i = 0; i < p.n; ++i) {
    double work = 0;
    for (int j = 0; j < 3; ++j) work += coef[j] * p.col[j][i];
    out[i] = work;
  }
  return out;
}

// The model: seconds = m_s x f_r x (coef . columns), m_s how fast the machine ran in step s (the
// same for every rank of the step), f_r rank r's speed factor. State of the alternating fit.
struct Factors {
  std::vector<double> step;   // m_s, mean 1
  std::vector<double> speed;  // f_r, lower median 1
};

// m and f given the coefficients: ratios of sums, alternating (what the prediction gets wrong in a
// level every rank of a step shares cancels in them, as the plan gives the ranks of a step about
// the same predicted work). f is normalized to a lower median of 1, m to a mean of 1: the scale
// stays with the coefficients.
void update_factors(const Panel& p, const std::vector<double>& pred, bool fit_speeds, Factors& x) {
  std::vector<double> num(p.steps), den(p.steps), rank_num(size_t(p.groups())), rank_den(size_t(p.groups()));
  for (int round = 0; round < 3; ++round) {
    std::fill(num.begin(), num.end(), 0.0);
    std::fill(den.begin(), den.end(), 0.0);
    for (size_t i = 0; i < p.n; ++i) {
      num[p.step_of[i]] += p.y[i];
      den[p.step_of[i]] += x.speed[size_t(p.group_of[i])] * pred[i];
    }
    for (size_t s = 0; s < p.steps; ++s) x.step[s] = den[s] > 0 && num[s] > 0 ? num[s] / den[s] : 1.0;
    if (!fit_speeds) break;
    std::fill(rank_num.begin(), rank_num.end(), 0.0);
    std::fill(rank_den.begin(), rank_den.end(), 0.0);
    for (size_t i = 0; i < p.n; ++i) {
      rank_num[size_t(p.group_of[i])] += p.y[i];
      rank_den[size_t(p.group_of[i])] += x.step[p.step_of[i]] * pred[i];
    }
    // Each segment's speeds to a lower median of 1 (its steps' factors carry its level).
    for (int seg = 0; seg < p.segments; ++seg) {
      std::vector<double> seen;
      for (int g = seg * p.ranks; g < (seg + 1) * p.ranks; ++g) {
        if (rank_den[size_t(g)] > 0 && rank_num[size_t(g)] > 0)
          x.speed[size_t(g)] = rank_num[size_t(g)] / rank_den[size_t(g)];
        if (rank_num[size_t(g)] > 0) seen.push_back(x.speed[size_t(g)]);
      }
      const double mid = lower_median(seen);
      if (mid > 0)
        for (int g = seg * p.ranks; g < (seg + 1) * p.ranks; ++g) x.speed[size_t(g)] /= mid;
    }
  }
  double mean = 0;
  for (double m : x.step) mean += m;
  mean /= double(std::max<size_t>(p.steps, 1));
  if (mean > 0)
    for (double& m : x.step) m /= mean;
}

// The coefficients relative to the plan's units (coef[0] = 1) given the speeds, with the step
// factors eliminated: within a step, rank r's share of the seconds is its share of the predicted
// work, y_rs / Y_s = f_r (theta . z_rs) / sum_r' f_r' (theta . z_r's), which is linear in theta:
// theta . (y_rs F_s - Y_s f_r z_rs) = 0 with F_s = sum_r' f_r' z_r's. Least squares of the units'
// term on the others' (each row scaled by Y_s F_s[0], so every step weighs alike) gives beta and
// gamma per unit of the plan's cost: what b and c are off by, whatever the scale. Their covariance
// and the residual variance come with them. ok = false: collinear, or too few rows.
struct Regression {
  bool ok = false;
  double coef[3] = {1, 0, 0}, cov[3][3] = {};
  int dof = 0;
};
Regression regress_shares(const Panel& p, const std::vector<double>& speed, const bool use[3]) {
  Regression out;
  int cols[2], k = 0;
  for (int j = 1; j < 3; ++j)
    if (use[j]) cols[k++] = j;
  out.dof = int(p.n) - int(p.steps) - k;
  if (k == 0 || out.dof < 1) return out;
  std::vector<double> total(p.steps, 0.0);
  std::vector<std::array<double, 3>> work(p.steps, {0, 0, 0});
  for (size_t i = 0; i < p.n; ++i) {
    const size_t s = p.step_of[i];
    total[s] += p.y[i];
    for (int j = 0; j < 3; ++j) work[s][j] += speed[size_t(p.group_of[i])] * p.col[j][i];
  }
  // g_j per row; target -g_0, regressors g_cols.
  std::vector<std::array<double, 3>> g(p.n);
  for (size_t i = 0; i < p.n; ++i) {
    const size_t s = p.step_of[i];
    const double norm = total[s] * work[s][0];
    for (int j = 0; j < 3; ++j)
      g[i][j] = norm > 0 ? (p.y[i] * work[s][j] - total[s] * speed[size_t(p.group_of[i])] * p.col[j][i]) / norm : 0;
  }
  double scale[2] = {}, m[3][3] = {}, r[3] = {};
  for (int a = 0; a < k; ++a) {
    for (size_t i = 0; i < p.n; ++i) scale[a] += g[i][cols[a]] * g[i][cols[a]];
    scale[a] = std::sqrt(scale[a]);
    if (!(scale[a] > 0)) return out;
  }
  for (size_t i = 0; i < p.n; ++i)
    for (int a = 0; a < k; ++a) {
      r[a] += g[i][cols[a]] / scale[a] * -g[i][0];
      for (int b = 0; b < k; ++b) m[a][b] += g[i][cols[a]] / scale[a] * (g[i][cols[b]] / scale[b]);
    }
  if (!invert(k, m)) return out;
  double x[2] = {};
  for (int a = 0; a < k; ++a)
    for (int b = 0; b < k; ++b) x[a] += m[a][b] * r[b];
  double sse = 0;
  for (size_t i = 0; i < p.n; ++i) {
    double e = -g[i][0];
    for (int a = 0; a < k; ++a) e -= x[a] * g[i][cols[a]] / scale[a];
    sse += e * e;
  }
  const double sigma2 = sse / double(out.dof);
  for (int a = 0; a < k; ++a) {
    out.coef[cols[a]] = x[a] / scale[a];
    for (int b = 0; b < k; ++b) out.cov[cols[a]][cols[b]] = sigma2 * m[a][b] / (scale[a] * scale[b]);
  }
  out.ok = true;
  return out;
}

// The share of the within-step variation of the seconds the model explains, and each speed's
// standard error (the spread of its rows' ratios to the model, over the square root of its rows):
// of the recent segment's speeds, which the plan takes.
void goodness(const Panel& p, const Factors& x, const double coef[3], WindowFit& fit) {
  const std::vector<double> pred = predicted(p, coef);
  const size_t groups = size_t(p.groups());
  std::vector<double> step_mean(p.steps, 0.0), sum(groups, 0.0), sum2(groups, 0.0), count(groups, 0.0);
  for (size_t i = 0; i < p.n; ++i) step_mean[p.step_of[i]] += p.y[i] / p.step_count[p.step_of[i]];
  double sse = 0, sst = 0;
  for (size_t i = 0; i < p.n; ++i) {
    const double fitted = x.step[p.step_of[i]] * x.speed[size_t(p.group_of[i])] * pred[i];
    sse += (p.y[i] - fitted) * (p.y[i] - fitted);
    sst += (p.y[i] - step_mean[p.step_of[i]]) * (p.y[i] - step_mean[p.step_of[i]]);
    if (!(fitted > 0)) continue;
    const double ratio = p.y[i] / fitted;
    const size_t g = size_t(p.group_of[i]);
    sum[g] += ratio, sum2[g] += ratio * ratio, count[g] += 1;
  }
  fit.r2 = sst > 0 ? 1.0 - sse / sst : 1.0;
  fit.residual_ss = sse;
  fit.rank_speed_se.assign(size_t(p.ranks), 0.0);
  for (int r = 0; r < p.ranks; ++r) {
    const size_t g = size_t(r + (p.segments - 1) * p.ranks);
    const double n = count[g];
    if (!(n > 1)) continue;
    const double mean = sum[g] / n, var = std::max(0.0, sum2[g] / n - mean * mean);
    fit.rank_speed_se[size_t(r)] = x.speed[g] * std::sqrt(var / (n - 1));
  }
}

// The steps where a rank's seconds are far off the fit: more than kFitOutlier robust standard
// deviations (1.4826 x the median absolute deviation of every row's ratio to the fit) from it. A
// scheduler's stall on one rank for one step is such a step; a window of 20 steps has no room for
// one in a least-squares fit. None where more than kFitMaxOutlierShare of the steps would go.
std::set<int64_t> outlier_steps(const Panel& p, const WindowFit& fit) {
  const std::vector<double> pred = predicted(p, fit.coef);
  std::vector<double> step_num(p.steps, 0.0), step_den(p.steps, 0.0);
  for (size_t i = 0; i < p.n; ++i) {
    step_num[p.step_of[i]] += p.y[i];
    step_den[p.step_of[i]] += fit.segment_speed[size_t(p.group_of[i])] * pred[i];
  }
  std::vector<double> dev(p.n, 0.0);
  for (size_t i = 0; i < p.n; ++i) {
    const size_t s = p.step_of[i];
    const double speed = fit.segment_speed[size_t(p.group_of[i])];
    const double fitted = step_den[s] > 0 ? step_num[s] / step_den[s] * speed * pred[i] : 0;
    dev[i] = fitted > 0 ? std::fabs(p.y[i] / fitted - 1) : 0;
  }
  std::vector<double> sorted = dev;
  std::nth_element(sorted.begin(), sorted.begin() + long(sorted.size() / 2), sorted.end());
  const double sd = 1.4826 * (sorted.empty() ? 0 : sorted[sorted.size() / 2]);
  std::set<int64_t> out;
  if (!(sd > 0)) return out;
  for (size_t i = 0; i < p.n; ++i)
    if (dev[i] > kFitOutlier * sd) out.insert(p.step_id[p.step_of[i]]);
  if (double(out.size()) > kFitMaxOutlierShare * double(p.steps)) out.clear();
  return out;
}

// The ratio guards of a fit of b and/or c; "" where they hold.
std::string ratio_refusal(const WindowFit& fit, const WindowFitOptions& opts) {
  if (fit.r2 < kFitMinR2)
    return fmt::format("R^2 {:.2f} of the within-step differences is below {}", fit.r2, kFitMinR2);
  if (fit.b_fitted) {
    const double derived = opts.derived.b > 0 ? opts.derived.b : opts.current.b;
    if (!(fit.cost.b >= derived / kFitBRange && fit.cost.b <= derived * kFitBRange))
      return fmt::format("cost_b = {:.3g} is outside [{:.3g}, {:.3g}] around the model shape's {:.3g}", fit.cost.b,
                         derived / kFitBRange, derived * kFitBRange, derived);
  }
  if (fit.c_fitted && !(fit.cost.c >= 0 && fit.cost.c <= kFitCMaxTokens * opts.current.a))
    return fmt::format("cost_c = {:.3g} is outside [0, {:.4g}]", fit.cost.c, kFitCMaxTokens * opts.current.a);
  return "";
}

// The coefficients of the plan's units and of the columns in `use` (1: attention, 2:
// micro-batches, priced beyond what the units charge), the step factors and, with `fit_speeds`,
// the speeds (else every rank at 1), alternating until they settle; the scale (seconds per unit)
// from the level at the end. false: the regression could not be made (collinear columns, too few
// rows).
bool fit_coefficients(const Panel& p, const bool use[3], bool fit_speeds, WindowFit& fit) {
  Factors x{std::vector<double>(p.steps, 1.0), std::vector<double>(size_t(p.groups()), 1.0)};
  Regression reg;  // coefficients per unit of the plan's cost
  const bool deviations = use[1] || use[2];
  constexpr int kRounds = 50;
  for (int round = 0; round < kRounds; ++round) {
    update_factors(p, predicted(p, reg.coef), fit_speeds, x);
    if (!deviations) break;
    const double before[3] = {reg.coef[0], reg.coef[1], reg.coef[2]};
    const std::vector<double> speed_before = x.speed;
    reg = regress_shares(p, x.speed, use);
    if (!reg.ok) return false;
    double moved = 0;
    for (int j = 1; j < 3; ++j) moved = std::max(moved, std::fabs(reg.coef[j] - before[j]) * (p.col[j].empty() ? 0 : 1));
    for (size_t r = 0; r < x.speed.size(); ++r) moved = std::max(moved, std::fabs(x.speed[r] - speed_before[r]));
    if (round > 0 && moved < 1e-12) break;
  }
  const std::vector<double> pred = predicted(p, reg.coef);
  double seconds = 0, units = 0;
  for (size_t i = 0; i < p.n; ++i) seconds += p.y[i], units += x.speed[size_t(p.group_of[i])] * pred[i];
  const double scale = units > 0 ? seconds / units : 0;
  for (int j = 0; j < 3; ++j) {
    fit.coef[j] = scale * reg.coef[j];
    fit.column[j] = j == 0 || use[j];
    for (int k = 0; k < 3; ++k) fit.cov[j][k] = scale * scale * reg.cov[j][k];
  }
  fit.segment_speed = x.speed;
  fit.rank_speed.assign(x.speed.end() - p.ranks, x.speed.end());  // the recent segment's
  goodness(p, x, fit.coef, fit);
  const double unit = fit.coef[0];
  fit.cost = fit.units;
  fit.b_fitted = fit.column[1] && unit > 0;
  fit.c_fitted = fit.column[2] && unit > 0;
  if (fit.b_fitted) fit.cost.b = fit.units.b + fit.coef[1] / unit;
  if (fit.c_fitted) fit.cost.c = fit.units.c + fit.coef[2] / unit;
  return true;
}

// The fit with the deviations of b and c the window can tell: both where free, else (collinear,
// or refused by the guards: b and c often move together, when one rank of every step gets the long
// pieces and fewer micro-batches) b alone, then c alone; where none holds, neither. `refused`
// gathers why each try was refused. false: not even the scale could be fitted.
bool fit_deviations(const Panel& p, const bool can[3], const WindowFitOptions& opts, bool fit_speeds, WindowFit& fit,
                    std::string& refused) {
  const bool tries[3][3] = {{true, can[1], can[2]}, {true, can[1], false}, {true, false, can[2]}};
  for (const auto& use : tries) {
    if (!use[1] && !use[2]) continue;
    if (&use != &tries[0] && use[1] == tries[0][1] && use[2] == tries[0][2]) continue;  // the same as the first
    WindowFit attempt = fit;
    if (!fit_coefficients(p, use, fit_speeds, attempt)) continue;
    const std::string why = ratio_refusal(attempt, opts);
    if (why.empty()) {
      fit = attempt;
      return true;
    }
    const char* what = use[1] && use[2] ? "cost_b with cost_c" : use[1] ? "cost_b alone" : "cost_c alone";
    refused += fmt::format("{}{}: {}", refused.empty() ? "" : "; ", what, why);
  }
  const bool none[3] = {true, false, false};
  return fit_coefficients(p, none, fit_speeds, fit);
}

// The guards' F statistic for the speeds: does letting every rank have its own speed explain the
// within-step differences significantly better than the coefficients alone? (The speeds and b are
// confounded where one rank of every step gets the long pieces.)
double speed_f_statistic(const Panel& p, const WindowFit& with, const WindowFit& without) {
  int k = 0;
  for (int j = 1; j < 3; ++j) k += with.column[j] ? 1 : 0;
  const int extra = p.segments * (p.ranks - 1);
  const double dof = double(p.n) - double(p.steps) - k - extra;
  if (!(dof > 0) || extra < 1) return 0;
  if (!(with.residual_ss > 0)) return without.residual_ss > 0 ? INFINITY : 0;
  return (without.residual_ss - with.residual_ss) / extra / (with.residual_ss / dof);
}

// Speeds that do not differ from the plan's (else from 1) beyond their noise become that; the rest
// stay within the range. A speed the plan has already taken (other than 1) is not chased for every
// small move of a short segment's estimate (the steps of a stretch are not independent: the
// machine's noise comes in episodes, and the standard error is smaller than the estimate's real
// spread), but a rank still at 1 takes a small steady difference (a core a little slower).
void settle_speeds(WindowFit& fit, const std::vector<double>& planned) {
  std::vector<std::string> clamped;
  for (size_t r = 0; r < fit.rank_speed.size(); ++r) {
    double& f = fit.rank_speed[r];
    const double se = r < fit.rank_speed_se.size() ? fit.rank_speed_se[r] : 0;
    const double near = std::max(kFitMinSpeedGap, kFitSpeedNoise * se);
    const double in_force = r < planned.size() ? planned[r] : 1.0;
    const double hold = in_force != 1.0 ? std::max(kFitSpeedHold, near) : near;
    if (std::fabs(f - in_force) < hold * in_force) f = in_force;
    else if (std::fabs(f - 1) < near) f = 1;
    if (f > kFitSpeedRange || f < 1 / kFitSpeedRange) {
      clamped.push_back(std::to_string(r));
      f = std::clamp(f, 1 / kFitSpeedRange, kFitSpeedRange);
    }
  }
  if (!clamped.empty())
    fit.note += fmt::format("{}speed factors of ranks {} held within [1/{}, {}]", fit.note.empty() ? "" : "; ",
                            fmt::join(clamped, ", "), kFitSpeedRange, kFitSpeedRange);
}

// The transfer charge, as the cut-cost check measures it, where the window saw enough cuts.
void fit_transfer(const Panel& p, WindowFit& fit) {
  double waits = 0, kv = 0;
  std::set<size_t> kv_steps;
  uint64_t kv_rows = 0;
  for (size_t i = 0; i < p.n; ++i) {
    waits += p.kv_wait[i];
    if (p.kv_tokens[i] > 0) kv += p.kv_tokens[i], ++kv_rows, kv_steps.insert(p.step_of[i]);
  }
  if (kv_rows < kCutCostAdviceMinRows || kv_steps.size() < kCutCostAdviceMinSteps || !(kv > 0)) return;
  fit.t_seconds = waits / kv;
  fit.cost.t = fit.t_seconds / fit.seconds_per_unit;
  fit.cost.layers = 0;  // measured: as it is, not raised by the link-bound rule
  fit.t_fitted = true;
}

// The fit of one panel (fit_window's, with or without its outlier steps).
WindowFit fit_panel(const Panel& p, const WindowFitOptions& opts) {
  WindowFit fit;
  fit.cost = fit.units = opts.current;
  fit.rows = p.n;
  fit.steps = p.steps;
  fit.rank_speed.assign(size_t(std::max(opts.world_size, 1)), 1.0);
  if (opts.world_size < 2 || p.n == 0) {
    fit.note = "one rank: nothing to divide";
    return fit;
  }
  if (int(p.n) - int(p.steps) - p.ranks + 1 - 3 < kFitMinDegreesOfFreedom) {
    fit.note = fmt::format("{} (rank, step) rows over {} steps are too few", p.n, p.steps);
    return fit;
  }
  // The deviations the window can tell: of b and c where free and their work differed within steps.
  const bool can[3] = {true, opts.fit_b && spread(p, 1) >= kFitMinSpread, opts.fit_c && spread(p, 2) >= kFitMinSpread};
  std::string refused;
  if (!fit_deviations(p, can, opts, true, fit, refused)) {
    fit.note = "the seconds per unit of cost could not be fitted";
    return fit;
  }
  // The speeds only where they explain more than the coefficients do without them.
  WindowFit even = fit;
  std::string refused_even;
  if (fit_deviations(p, can, opts, false, even, refused_even) && speed_f_statistic(p, fit, even) < kFitSpeedMinF) {
    fit = even;
    refused = refused_even;
  }
  if (!refused.empty()) {
    const bool kept_b = can[1] && !fit.b_fitted, kept_c = can[2] && !fit.c_fitted;
    if (kept_b || kept_c)
      fit.note = refused + (kept_b && kept_c ? ": cost_b and cost_c kept" : kept_b ? ": cost_b kept" : ": cost_c kept");
  } else if (!can[1] && !can[2] && (opts.fit_b || opts.fit_c)) {
    fit.note = "the ranks' work did not differ within steps: cost_b and cost_c kept";
  }
  fit.speeds_from_step = p.last_segment_from;
  fit.seconds_per_unit = fit.coef[0];
  if (!(fit.seconds_per_unit > 0)) {
    fit.note = "the fitted seconds per unit of cost are not positive";
    return fit;
  }
  fit.usable = true;
  return fit;
}

}  // namespace

WindowFit fit_window(const std::vector<CostSample>& samples, const WindowFitOptions& opts) {
  const Panel all = make_panel(samples, opts);
  WindowFit fit = fit_panel(all, opts);
  if (fit.usable) {
    // Once more without the steps far off a fit of b that no guard holds back (a stall on one rank
    // spoils the guarded fit itself: its b may be refused, and then every step looks far off).
    WindowFit probe = fit;
    const bool flexible[3] = {true, opts.fit_b && spread(all, 1) >= kFitMinSpread, false};
    if (!flexible[1] || !fit_coefficients(all, flexible, true, probe)) probe = fit;
    const std::set<int64_t> outliers = outlier_steps(all, probe);
    if (!outliers.empty()) {
      const Panel kept = make_panel(samples, opts, outliers);
      WindowFit again = fit_panel(kept, opts);
      if (again.usable) {
        fit = again;
        fit.outlier_steps = outliers.size();
      }
    }
  }
  if (!fit.usable) return fit;
  settle_speeds(fit, opts.planned_speed);
  if (opts.fit_t) fit_transfer(all, fit);
  return fit;
}

bool PlanComparison::pays() const {
  return steps > 0 && gain() > kReplanGainNoise * gain_sd && gain() > kReplanMinGain * current_seconds;
}

std::vector<RankWork> step_rank_work(const StepView& step) {
  std::vector<RankWork> work(size_t(step.world_size()));
  MicroBatch mb;
  for (int r = 0; r < step.world_size(); ++r) {
    const auto [first, end] = step.rank_micro_batches(r);
    for (uint32_t m = first; m < end; ++m) {
      step.micro_batch(m, mb);
      work[size_t(r)].tokens += double(mb.tokens_computed());
      work[size_t(r)].attn += mb.attention_work();
      work[size_t(r)].kv_tokens += mb.kv_tokens();
      work[size_t(r)].micro_batches += 1;
    }
  }
  return work;
}

namespace {
// The fit's columns of one rank's work: its units under the plan the window ran, its attention
// work and its micro-batches.
void columns_of(const WindowFit& fit, const RankWork& w, double out[3]) {
  const CostModel& u = fit.units;
  out[0] = u.a * w.tokens + u.b * w.attn + u.c * w.micro_batches;
  out[1] = w.attn;
  out[2] = w.micro_batches;
}
}  // namespace

double predicted_seconds(const WindowFit& fit, const RankWork& work, int rank) {
  if (!(work.micro_batches > 0)) return 0;
  double col[3];
  columns_of(fit, work, col);
  double seconds = 0;
  for (int j = 0; j < 3; ++j) seconds += fit.coef[j] * col[j];
  const double speed = size_t(rank) < fit.rank_speed.size() ? fit.rank_speed[size_t(rank)] : 1.0;
  return speed * seconds + fit.t_seconds * work.kv_tokens;
}

PlanComparison compare_divisions(const std::vector<StepView>& current, const std::vector<StepView>& candidate,
                                 const WindowFit& fit) {
  PlanComparison out;
  const size_t steps = std::min(current.size(), candidate.size());
  double g[3] = {};                         // the columns' difference between the busiest ranks
  std::vector<double> speed_diff(fit.rank_speed.size(), 0.0);  // per rank: its unscaled work as busiest, current - candidate
  double imbalance[2] = {0, 0};
  for (size_t s = 0; s < steps; ++s) {
    for (int which = 0; which < 2; ++which) {
      const std::vector<RankWork> work = step_rank_work(which == 0 ? current[s] : candidate[s]);
      int busiest = 0;
      double top = -1, total = 0;
      for (size_t r = 0; r < work.size(); ++r) {
        const double t = predicted_seconds(fit, work[r], int(r));
        total += t;
        if (t > top) top = t, busiest = int(r);
      }
      (which == 0 ? out.current_seconds : out.candidate_seconds) += top;
      imbalance[which] += total > 0 ? top * double(work.size()) / total : 1.0;
      double col[3];
      columns_of(fit, work[size_t(busiest)], col);
      const double speed = size_t(busiest) < fit.rank_speed.size() ? fit.rank_speed[size_t(busiest)] : 1.0;
      const double sign = which == 0 ? 1.0 : -1.0;
      double unscaled = 0;
      for (int j = 0; j < 3; ++j) g[j] += sign * speed * col[j], unscaled += fit.coef[j] * col[j];
      if (size_t(busiest) < speed_diff.size()) speed_diff[size_t(busiest)] += sign * unscaled;
    }
  }
  out.steps = steps;
  if (steps > 0) out.current_imbalance = imbalance[0] / double(steps), out.candidate_imbalance = imbalance[1] / double(steps);
  double var = 0;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) var += g[i] * fit.cov[i][j] * g[j];
  for (size_t r = 0; r < speed_diff.size() && r < fit.rank_speed_se.size(); ++r)
    var += (fit.rank_speed_se[r] * speed_diff[r]) * (fit.rank_speed_se[r] * speed_diff[r]);
  out.gain_sd = std::sqrt(std::max(var, 0.0));
  return out;
}

}  // namespace kilter::balance
