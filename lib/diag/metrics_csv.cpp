// Metrics CSV writing and reading (see metrics_csv.h).
#include "lib/diag/metrics_csv.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "io/base/error.h"

namespace kilter::diag {

std::string metrics_path(const std::string& run_dir, int rank) {
  return fmt::format("{}/metrics/rank-{:05d}.csv", run_dir, rank);
}

std::string trace_path(const std::string& run_dir, int rank) {
  return fmt::format("{}/trace/rank-{:05d}.json", run_dir, rank);
}

std::string metrics_csv_header() {
  return "step,tokens,loss,data_wait,h2d,forward,backward,kv_wait,gather_wait,scatter_wait,comm_exposed,optimizer,"
         "step_total,"
         "compute,outside,start,arrival,tokens_computed,attn_work,rss_bytes,peak_rss_bytes,"
         "device_peak_bytes,micro_batches,kv_tokens,kv_bytes,kv_wait_peer";
}

std::string metrics_csv_row(const StepRecord& r) {
  return fmt::format("{},{},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},"
                     "{:.9f},{:.9f},{},{:.9g},{},{},{},{},{},{},{}",
                     r.step, r.tokens, r.loss, r.phase[kDataWait], r.phase[kH2D], r.phase[kForward],
                     r.phase[kBackward], r.phase[kKvWait], r.phase[kGatherWait], r.phase[kScatterWait],
                     r.phase[kCommExposed], r.phase[kOptimizer],
                     r.phase[kStepTotal], compute_seconds(r), r.outside, r.start, r.arrival,
                     r.tokens_computed, r.attn_work, r.rss_bytes, r.peak_rss_bytes,
                     r.device_peak_bytes, r.micro_batches, r.kv_tokens, r.kv_bytes, r.kv_wait_peer);
}

CsvAppender::CsvAppender(const std::string& path, const std::string& header, bool append) : path_(path) {
  if (!append) {
    // A new run never truncates rows another run wrote (run_dir.h moves such a run aside first).
    std::FILE* existing = std::fopen(path.c_str(), "r");
    if (existing) {
      std::fseek(existing, 0, SEEK_END);
      const long size = std::ftell(existing);
      std::fclose(existing);
      KILTER_USER_CHECK(size <= 0, "metrics file " << path << " already holds rows of another run; it is kept: "
                                                   << "continue that run, or start over with --force (moves it aside)");
    }
  }
  file_ = std::fopen(path.c_str(), "a");
  KILTER_CHECK(file_, "cannot create metrics file " << path << ": " << std::strerror(errno));
  std::fseek(file_, 0, SEEK_END);
  if (std::ftell(file_) == 0) append_line(header);
}

CsvAppender::~CsvAppender() {
  if (file_) std::fclose(file_);
}

void CsvAppender::append_line(std::string line) {
  line += '\n';
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0)
    KILTER_FAIL("cannot write metrics file " << path_ << ": " << std::strerror(errno));
}

std::string train_csv_path(const std::string& run_dir) { return run_dir + "/metrics/train.csv"; }

std::string train_csv_header() {
  return "step,tokens,loss,lr,grad_norm,tokens_per_second,eval_loss,eval_perplexity,elapsed_seconds";
}

std::string train_csv_row(const TrainRow& r) {
  std::string eval = ",";
  if (std::isfinite(r.eval_loss)) eval = fmt::format("{:.9g},{:.9g}", r.eval_loss, std::exp(r.eval_loss));
  return fmt::format("{},{:.0f},{:.9g},{:.9g},{:.9g},{:.9g},{},{:.3f}", r.step, r.tokens, r.loss, r.lr,
                     r.grad_norm, r.tokens_per_second, eval, r.elapsed_seconds);
}

namespace {
std::vector<std::string> split_csv_line(const std::string& line) {
  std::vector<std::string> out;
  std::string cell;
  std::istringstream is(line);
  while (std::getline(is, cell, ',')) out.push_back(cell);
  if (!line.empty() && line.back() == ',') out.emplace_back();
  return out;
}
}  // namespace

std::vector<StepRecord> read_metrics_csv(const std::string& path, int rank) {
  std::ifstream in(path);
  KILTER_CHECK(in, "cannot open metrics file " << path << ": " << std::strerror(errno));
  std::string line;
  KILTER_CHECK(std::getline(in, line), "metrics file " << path << " is empty (no header)");
  std::vector<std::string> header = split_csv_line(line);
  std::map<std::string, size_t> col;
  for (size_t i = 0; i < header.size(); ++i) col[header[i]] = i;
  for (const char* required : {"step", "tokens", "loss", "data_wait", "h2d", "forward", "backward",
                               "comm_exposed", "optimizer", "step_total", "arrival"})
    KILTER_CHECK(col.count(required), "metrics file " << path << ": no column '" << required << "'");

  std::vector<StepRecord> rows;
  std::vector<std::string> lines;
  while (std::getline(in, line))
    if (!line.empty()) lines.push_back(line);
  for (size_t li = 0; li < lines.size(); ++li) {
    std::vector<std::string> cells = split_csv_line(lines[li]);
    if (cells.size() < header.size()) {
      // A row cut short by a crash can only be the last one.
      KILTER_CHECK(li + 1 == lines.size(), "metrics file " << path << " line " << li + 2 << ": "
                                                            << cells.size() << " columns, expected "
                                                            << header.size());
      break;
    }
    auto num = [&](const char* name, double fallback) -> double {
      auto it = col.find(name);
      if (it == col.end()) return fallback;
      const std::string& s = cells[it->second];
      char* end = nullptr;
      double v = std::strtod(s.c_str(), &end);
      KILTER_CHECK(!s.empty() && end && *end == '\0',
                   "metrics file " << path << " line " << li + 2 << ": column " << name << " = '"
                                   << s << "' is not a number");
      return v;
    };
    StepRecord r;
    r.rank = rank;
    r.step = int64_t(num("step", 0));
    r.tokens = int64_t(num("tokens", 0));
    r.loss = num("loss", 0);
    for (int p = 0; p < kNumPhases; ++p) r.phase[p] = num(phase_name(p), 0);
    r.outside = num("outside", 0);
    r.start = num("start", 0);
    r.arrival = num("arrival", 0);
    r.tokens_computed = int64_t(num("tokens_computed", 0));
    r.attn_work = num("attn_work", 0);
    r.rss_bytes = uint64_t(num("rss_bytes", 0));
    r.peak_rss_bytes = uint64_t(num("peak_rss_bytes", double(r.rss_bytes)));
    r.device_peak_bytes = uint64_t(num("device_peak_bytes", 0));
    r.micro_batches = int32_t(num("micro_batches", 0));
    r.kv_tokens = int64_t(num("kv_tokens", 0));
    r.kv_bytes = int64_t(num("kv_bytes", 0));
    r.kv_wait_peer = int32_t(num("kv_wait_peer", -1));
    rows.push_back(r);
  }
  // A resumed run appends the steps after its checkpoint again: the later row of a step wins.
  std::map<int64_t, StepRecord> by_step;
  for (const StepRecord& r : rows) by_step[r.step] = r;
  if (by_step.size() != rows.size()) {
    rows.clear();
    for (const auto& kv : by_step) rows.push_back(kv.second);
  }
  return rows;
}

std::vector<TrainRow> read_train_csv(const std::string& path) {
  std::ifstream in(path);
  if (!in) return {};
  std::string line;
  if (!std::getline(in, line)) return {};
  const std::vector<std::string> header = split_csv_line(line);
  std::map<std::string, size_t> col;
  for (size_t i = 0; i < header.size(); ++i) col[header[i]] = i;
  KILTER_USER_CHECK(col.count("step") && col.count("tokens") && col.count("loss"),
                    "metrics file " << path << ": not a train.csv (no step, tokens, loss columns)");
  std::map<int64_t, TrainRow> by_step;
  for (size_t line_no = 2; std::getline(in, line); ++line_no) {
    const std::vector<std::string> cells = split_csv_line(line);
    if (cells.size() < header.size()) continue;  // a row cut short by a crash
    auto num = [&](const char* name) -> double {
      auto it = col.find(name);
      if (it == col.end() || cells[it->second].empty()) return NAN;
      return std::strtod(cells[it->second].c_str(), nullptr);
    };
    TrainRow r;
    r.step = int64_t(num("step"));
    r.tokens = num("tokens");
    r.loss = num("loss");
    r.lr = num("lr");
    r.grad_norm = num("grad_norm");
    r.tokens_per_second = num("tokens_per_second");
    r.eval_loss = num("eval_loss");
    r.elapsed_seconds = num("elapsed_seconds");
    by_step[r.step] = r;
  }
  std::vector<TrainRow> rows;
  for (const auto& kv : by_step) rows.push_back(kv.second);
  return rows;
}

}  // namespace kilter::diag
