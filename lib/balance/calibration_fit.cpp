// Cost-model calibration (see calibration_fit.h). The fit centers and scales every column first, which
// removes the intercept from the normal equations and keeps the system well conditioned even
// though sum(L^2) is orders of magnitude larger than the token and micro-batch counts.
#include "lib/balance/calibration_fit.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "io/base/error.h"

namespace kilter::balance {

namespace {

// Solves the k x k system m x = r (k <= 3) by Gaussian elimination with partial pivoting.
// Returns false when a pivot is negligible (the columns are collinear).
bool solve(int k, double m[3][3], double r[3], double x[3]) {
  for (int col = 0; col < k; ++col) {
    int pivot = col;
    for (int row = col + 1; row < k; ++row)
      if (std::fabs(m[row][col]) > std::fabs(m[pivot][col])) pivot = row;
    if (std::fabs(m[pivot][col]) < 1e-9) return false;
    std::swap(m[pivot], m[col]);
    std::swap(r[pivot], r[col]);
    for (int row = col + 1; row < k; ++row) {
      const double f = m[row][col] / m[col][col];
      for (int j = col; j < k; ++j) m[row][j] -= f * m[col][j];
      r[row] -= f * r[col];
    }
  }
  for (int row = k - 1; row >= 0; --row) {
    double v = r[row];
    for (int j = row + 1; j < k; ++j) v -= m[row][j] * x[j];
    x[row] = v / m[row][row];
  }
  return true;
}

// Centered, scaled least squares of y on the first k of (tokens, attn, micro-batches) with an
// intercept; scaling every column to unit variance makes the normal equations the correlation
// matrix, so "collinear" means the same thing whatever the units. false: collinear.
bool fit_terms(const std::vector<CostSample>& samples, int k, double coef[3], double* intercept, double* r2) {
  const size_t n = samples.size();
  auto column = [](const CostSample& s, int j) {
    return j == 0 ? s.tokens_computed : j == 1 ? s.attn_work : s.micro_batches;
  };
  double mean[3] = {0, 0, 0}, mean_y = 0;
  for (const CostSample& s : samples) {
    for (int j = 0; j < k; ++j) mean[j] += column(s, j);
    mean_y += s.seconds;
  }
  for (int j = 0; j < k; ++j) mean[j] /= double(n);
  mean_y /= double(n);
  double scale[3] = {0, 0, 0};
  for (const CostSample& s : samples)
    for (int j = 0; j < k; ++j) scale[j] += (column(s, j) - mean[j]) * (column(s, j) - mean[j]);
  for (int j = 0; j < k; ++j) {
    if (!(scale[j] > 0)) return false;  // a constant column
    scale[j] = std::sqrt(scale[j]);
  }
  double m[3][3] = {}, r[3] = {}, syy = 0;
  for (const CostSample& s : samples) {
    double z[3];
    for (int j = 0; j < k; ++j) z[j] = (column(s, j) - mean[j]) / scale[j];
    const double y = s.seconds - mean_y;
    for (int i = 0; i < k; ++i) {
      for (int j = 0; j < k; ++j) m[i][j] += z[i] * z[j];
      r[i] += z[i] * y;
    }
    syy += y * y;
  }
  double x[3] = {0, 0, 0};
  if (!solve(k, m, r, x)) return false;
  *intercept = mean_y;
  for (int j = 0; j < 3; ++j) coef[j] = 0;
  for (int j = 0; j < k; ++j) {
    coef[j] = x[j] / scale[j];
    *intercept -= coef[j] * mean[j];
  }
  double residual = 0;
  for (const CostSample& s : samples) {
    double e = s.seconds - *intercept;
    for (int j = 0; j < k; ++j) e -= coef[j] * column(s, j);
    residual += e * e;
  }
  *r2 = syy > 0 ? 1.0 - residual / syy : 1.0;
  return true;
}

}  // namespace

CostFit fit_cost_model(const std::vector<CostSample>& samples) {
  const size_t n = samples.size();
  KILTER_CHECK(n >= 4, "cost-model fit: " << n << " samples; at least 4 (rank, step) rows are needed");
  CostFit fit;
  fit.samples = n;
  double coef[3] = {0, 0, 0};
  if (fit_terms(samples, 3, coef, &fit.intercept, &fit.r2)) {
    fit.a = coef[0], fit.b = coef[1], fit.c = coef[2];
    return fit;
  }
  // micro_batches constant or collinear: c and the intercept are one term.
  KILTER_CHECK(fit_terms(samples, 2, coef, &fit.intercept, &fit.r2),
               "cost-model fit: tokens_computed and attn_work are collinear over the " << n
               << " samples (all sequences about the same length?); a and b cannot be told apart");
  fit.a = coef[0], fit.b = coef[1];
  double mean_mb = 0;
  for (const CostSample& s : samples) mean_mb += s.micro_batches;
  mean_mb /= double(n);
  fit.c = fit.intercept / std::max(mean_mb, 1.0);
  fit.intercept = 0;
  fit.c_from_intercept = true;
  return fit;
}

TransferFit fit_transfer_cost(const std::vector<CostSample>& samples) {
  TransferFit fit;
  double waits = 0, kv_tokens = 0;
  for (const CostSample& s : samples) {
    waits += s.kv_wait;  // every rank's wait, the earlier parts' ranks' included
    if (!(s.kv_tokens > 0)) continue;
    kv_tokens += s.kv_tokens;
    ++fit.samples;
  }
  fit.measured = fit.samples > 0 && kv_tokens > 0;
  fit.seconds_per_token = fit.measured ? waits / kv_tokens : 0;
  return fit;
}

namespace {

std::vector<std::string> split_csv_line(const std::string& line) {
  std::vector<std::string> fields;
  std::string field;
  std::istringstream is(line);
  while (std::getline(is, field, ',')) {
    field.erase(0, field.find_first_not_of(" \t\r"));
    field.erase(field.find_last_not_of(" \t\r") + 1);
    fields.push_back(field);
  }
  return fields;
}

long find_optional_column(const std::vector<std::string>& header, std::initializer_list<const char*> names) {
  for (const char* name : names)
    for (size_t i = 0; i < header.size(); ++i)
      if (header[i] == name) return static_cast<long>(i);
  return -1;
}

long find_column(const std::vector<std::string>& header, std::initializer_list<const char*> names,
                 const std::string& file) {
  const long found = find_optional_column(header, names);
  if (found >= 0) return found;
  KILTER_FAIL(file << ": no column " << *names.begin() << " in the header (the run's diagnostics "
              "must record tokens_computed, attn_work, forward and backward per step)");
}

double parse_number(const std::string& text, const std::string& file, size_t line_no, const std::string& column) {
  try {
    size_t used = 0;
    const double v = std::stod(text, &used);
    if (used == text.size() && std::isfinite(v)) return v;
  } catch (const std::exception&) {
  }
  KILTER_FAIL(file << ":" << line_no << ": column " << column << " holds '" << text << "', not a number");
}

}  // namespace

std::vector<CostSample> read_cost_samples(const std::string& run_dir, int64_t skip_steps) {
  namespace fs = std::filesystem;
  const fs::path metrics = fs::path(run_dir) / "metrics";
  KILTER_CHECK(fs::is_directory(metrics), run_dir << ": no metrics/ directory (is this a kilter run directory?)");
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(metrics)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("rank-", 0) == 0 && entry.path().extension() == ".csv") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  KILTER_CHECK(!files.empty(), metrics.string() << ": no rank-NNNNN.csv files");

  std::vector<CostSample> samples;
  for (const fs::path& path : files) {
    const std::string file = path.string();
    const std::string stem = path.stem().string();  // rank-NNNNN
    const int rank = std::atoi(stem.c_str() + std::min<size_t>(stem.size(), 5));
    std::ifstream in(path);
    KILTER_CHECK(in, "cannot open " << file);
    std::string line;
    KILTER_CHECK(std::getline(in, line), file << ": empty file, no header line");
    const std::vector<std::string> header = split_csv_line(line);
    const long c_step = find_column(header, {"step"}, file);
    const long c_tokens = find_column(header, {"tokens_computed"}, file);
    const long c_attn = find_column(header, {"attn_work"}, file);
    const long c_fwd = find_column(header, {"forward", "forward_s"}, file);
    const long c_bwd = find_column(header, {"backward", "backward_s"}, file);
    const long c_mb = find_optional_column(header, {"micro_batches"});
    const long c_kv_wait = find_optional_column(header, {"kv_wait", "kv_wait_s"});
    const long c_kv_tokens = find_optional_column(header, {"kv_tokens"});
    const size_t needed =
        1 + static_cast<size_t>(std::max({c_step, c_tokens, c_attn, c_fwd, c_bwd, c_mb, c_kv_wait, c_kv_tokens}));
    for (size_t line_no = 2; std::getline(in, line); ++line_no) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const std::vector<std::string> f = split_csv_line(line);
      KILTER_CHECK(f.size() >= needed, file << ":" << line_no << ": " << f.size() << " fields, the header names "
                   << header.size());
      if (parse_number(f[c_step], file, line_no, "step") < double(skip_steps)) continue;
      CostSample s;
      s.rank = rank;
      s.step = int64_t(parse_number(f[c_step], file, line_no, "step"));
      s.tokens_computed = parse_number(f[c_tokens], file, line_no, "tokens_computed");
      s.attn_work = parse_number(f[c_attn], file, line_no, "attn_work");
      s.seconds = parse_number(f[c_fwd], file, line_no, header[c_fwd]) +
                  parse_number(f[c_bwd], file, line_no, header[c_bwd]);
      if (c_mb >= 0) s.micro_batches = parse_number(f[c_mb], file, line_no, "micro_batches");
      if (c_kv_wait >= 0 && c_kv_tokens >= 0) {
        s.kv_wait = parse_number(f[c_kv_wait], file, line_no, header[c_kv_wait]);
        s.kv_tokens = parse_number(f[c_kv_tokens], file, line_no, "kv_tokens");
      }
      if (s.tokens_computed <= 0) continue;  // an idle rank in this step
      samples.push_back(s);
    }
  }
  return samples;
}

namespace {
// The cut-cost rule shared by the report's advice and the trainer's check: the excess of the
// measured charge over the planned one, as a share of the computed tokens of the rows that
// received K/V.
double excess_share(const std::vector<CostSample>& samples, double measured, double planned) {
  double kv_tokens = 0, computed = 0;
  for (const CostSample& s : samples)
    if (s.kv_tokens > 0) kv_tokens += s.kv_tokens, computed += s.tokens_computed;
  return computed > 0 ? (measured - planned) * kv_tokens / computed : 0;
}
constexpr double kCutCostRatio = 1.5;     // measured above this many times the planned charge
constexpr double kCutCostShare = 0.02;    // and the miss costs at least this share of a step
}  // namespace

std::string cut_cost_advice(const CutCostCheck& check) {
  if (!check.replan) return "";
  return cut_cost_miss(check.measured_t, check.rows, check.planned_t, check.excess_share, check.steps) +
         cut_cost_remedy(check.measured_t) + " or data.cut_pieces = false";
}

std::string cut_cost_remedy(double measured_t) {
  char line[160];
  std::snprintf(line, sizeof line,
                ", so its cuts can make steps slower here; set data.cost_t = %.3g (the plan then cuts only where that "
                "pays)",
                measured_t);
  return line;
}

std::string cut_cost_miss(double measured_t, uint64_t rows, double planned_t, double excess_share,
                          uint64_t steps) {
  char sample[96];
  if (steps > 0)
    std::snprintf(sample, sizeof sample, "%llu (rank, step) rows over %llu steps", static_cast<unsigned long long>(rows),
                  static_cast<unsigned long long>(steps));
  else
    std::snprintf(sample, sizeof sample, "%llu (rank, step) rows", static_cast<unsigned long long>(rows));
  char line[384];
  std::snprintf(line, sizeof line,
                "cut pieces cost more than the plan charged: their kv_wait measured t = %.3g dense tokens per earlier "
                "token (%s), the plan cut with t = %.3g, a miss of about %.0f%% of the step of a rank that received "
                "K/V",
                measured_t, sample, planned_t, 100 * excess_share);
  return line;
}

CutCostCheck check_cut_cost(const std::vector<CostSample>& samples, const CostModel& plan_cost) {
  CutCostCheck check;
  check.planned_t = std::max(plan_cost.t, 0.0);
  const TransferFit transfer = fit_transfer_cost(samples);
  double seconds = 0, units = 0;
  for (const CostSample& s : samples) {
    if (!(s.tokens_computed > 0)) continue;
    seconds += s.seconds;
    units += plan_cost.a * s.tokens_computed + plan_cost.b * s.attn_work + std::max(plan_cost.c, 0.0) * s.micro_batches;
  }
  check.rows = transfer.samples;
  std::set<int64_t> kv_steps;
  for (const CostSample& s : samples)
    if (s.kv_tokens > 0 && s.step >= 0) kv_steps.insert(s.step);
  check.steps = kv_steps.size();
  if (!transfer.measured || !(seconds > 0) || !(units > 0)) return check;
  check.measured = true;
  check.measured_t = transfer.cost_t(seconds / units);
  check.excess_share = excess_share(samples, check.measured_t, check.planned_t);
  check.replan = check.measured_t > kCutCostRatio * check.planned_t && check.excess_share >= kCutCostShare;
  return check;
}

namespace {
// "the run's cut-cost check (steps 2-11, 9 rows)": the check's window and its sample.
std::string run_check_text(const RunCutCostCheck& run_check) {
  return fmt::format("the run's cut-cost check (steps {}-{}, {} rows)", run_check.window_begin, run_check.window_end,
                     run_check.rows);
}

// "the whole run's 40 (rank, step) rows that received K/V over 30 steps"
std::string whole_run_text(const CutCostCheck& whole_run) {
  return fmt::format("the whole run's {} (rank, step) rows that received K/V over {} steps", whole_run.rows,
                     whole_run.steps);
}
}  // namespace

std::string report_cut_cost_advice(const CutCostCheck& whole_run, const RunCutCostCheck& run_check) {
  if (run_check.replanned) return "";  // the run already followed the advice
  const bool check_missed = run_check.ran && run_check.measured && !run_check.charge_held;
  if (whole_run.rows < kCutCostAdviceMinRows || whole_run.steps < kCutCostAdviceMinSteps) {
    // Too small a sample to advise on. Where the check warned in the training log, the report says
    // why it does not repeat the settings rather than leave the warning unanswered.
    if (!check_missed) return "";
    return fmt::format("none: {} found that cut pieces cost more than the plan charged, but {} are fewer than the {} "
                       "over {} steps this advice needs (docs/plan.md, \"The report's advice\"); a longer run "
                       "would tell",
                       run_check_text(run_check), whole_run_text(whole_run), kCutCostAdviceMinRows,
                       kCutCostAdviceMinSteps);
  }
  // The check judged as many rows as the report has (the run ended with its window): the same
  // data, so the report follows the check's verdict and adds nothing to it (nothing at all where
  // the figures disagree on those rows, as a later epoch's cost model could make them).
  if (run_check.ran && run_check.rows >= whole_run.rows)
    return check_missed && whole_run.replan ? cut_cost_advice(whole_run) : "";
  // From here the whole run's verdict, on more rows than the check's window held.
  if (whole_run.replan) {
    if (!run_check.ran || check_missed) return cut_cost_advice(whole_run);
    return cut_cost_advice(whole_run) +
           fmt::format(". This differs from {}, which {}: the report read more rows, the whole run's",
                       run_check_text(run_check),
                       run_check.measured ? "found the charge held" : "saw no rank receive K/V");
  }
  if (!check_missed || !whole_run.measured) return "";
  return fmt::format("none: unlike {}, {} measured t = {:.3g} against the planned {:.3g}, a difference of {:.1f}% of "
                     "the step of a rank that received K/V: the charge held over the run, and data.cost_t can stay "
                     "(the check's window was dearer than the rest)",
                     run_check_text(run_check), whole_run_text(whole_run), whole_run.measured_t,
                     whole_run.planned_t, 100 * whole_run.excess_share);
}

}  // namespace kilter::balance
