// Cost-model calibration (see calibrate.h). The fit centers every column first, which removes
// the intercept from the normal equations and keeps the 2x2 system well conditioned even though
// sum(L^2) is orders of magnitude larger than the token counts.
#include "lib/balance/calibrate.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "io/error.h"

namespace kilter::balance {

CostFit fit_cost_model(const std::vector<CostSample>& samples) {
  const size_t n = samples.size();
  KILTER_CHECK(n >= 3, "cost-model fit: " << n << " samples; at least 3 (rank, step) rows are needed");
  double mean_t = 0, mean_w = 0, mean_y = 0;
  for (const CostSample& s : samples) mean_t += s.tokens_computed, mean_w += s.attn_work, mean_y += s.seconds;
  mean_t /= double(n), mean_w /= double(n), mean_y /= double(n);
  double stt = 0, sww = 0, stw = 0, sty = 0, swy = 0, syy = 0;
  for (const CostSample& s : samples) {
    const double t = s.tokens_computed - mean_t, w = s.attn_work - mean_w, y = s.seconds - mean_y;
    stt += t * t, sww += w * w, stw += t * w, sty += t * y, swy += w * y, syy += y * y;
  }
  const double det = stt * sww - stw * stw;
  // det / (stt sww) = 1 - corr(t, w)^2: near 0 when the two columns carry the same information.
  KILTER_CHECK(stt > 0 && sww > 0 && det > 1e-9 * stt * sww,
               "cost-model fit: tokens_computed and attn_work are collinear over the " << n
               << " samples (all sequences about the same length?); a and b cannot be told apart");
  CostFit fit;
  fit.samples = n;
  fit.a = (sww * sty - stw * swy) / det;
  fit.b = (stt * swy - stw * sty) / det;
  fit.intercept = mean_y - fit.a * mean_t - fit.b * mean_w;
  double residual = 0;
  for (const CostSample& s : samples) {
    const double e = s.seconds - (fit.intercept + fit.a * s.tokens_computed + fit.b * s.attn_work);
    residual += e * e;
  }
  fit.r2 = syy > 0 ? 1.0 - residual / syy : 1.0;
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

long find_column(const std::vector<std::string>& header, std::initializer_list<const char*> names,
                 const std::string& file) {
  for (const char* name : names)
    for (size_t i = 0; i < header.size(); ++i)
      if (header[i] == name) return static_cast<long>(i);
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
    const size_t needed = 1 + static_cast<size_t>(std::max({c_step, c_tokens, c_attn, c_fwd, c_bwd}));
    for (size_t line_no = 2; std::getline(in, line); ++line_no) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const std::vector<std::string> f = split_csv_line(line);
      KILTER_CHECK(f.size() >= needed, file << ":" << line_no << ": " << f.size() << " fields, the header names "
                   << header.size());
      if (parse_number(f[c_step], file, line_no, "step") < double(skip_steps)) continue;
      CostSample s;
      s.tokens_computed = parse_number(f[c_tokens], file, line_no, "tokens_computed");
      s.attn_work = parse_number(f[c_attn], file, line_no, "attn_work");
      s.seconds = parse_number(f[c_fwd], file, line_no, header[c_fwd]) +
                  parse_number(f[c_bwd], file, line_no, header[c_bwd]);
      if (s.tokens_computed <= 0) continue;  // an idle rank in this step
      samples.push_back(s);
    }
  }
  return samples;
}

}  // namespace kilter::balance
