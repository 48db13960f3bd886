// metrics/rank-NNNNN.csv: one row per step per rank (DESIGN.md, "Run directory"). Written row by
// row and flushed, so a crashed run keeps every finished step; read back by `kilter report`.
#pragma once
#include <cstdio>
#include <string>
#include <vector>

#include "lib/diag/step_record.h"

namespace kilter::diag {

// "RUN_DIR/metrics/rank-00003.csv" and "RUN_DIR/trace/rank-00003.json".
std::string metrics_path(const std::string& run_dir, int rank);
std::string trace_path(const std::string& run_dir, int rank);

// The header line (no newline) and one row (no newline) in the same column order.
std::string metrics_csv_header();
std::string metrics_csv_row(const StepRecord& r);

class MetricsCsvWriter {
 public:
  // Opens `path` for writing and writes the header. With `append` (a resumed run) an existing
  // file keeps its rows and gets no second header.
  explicit MetricsCsvWriter(const std::string& path, bool append = false);
  ~MetricsCsvWriter();
  MetricsCsvWriter(const MetricsCsvWriter&) = delete;
  MetricsCsvWriter& operator=(const MetricsCsvWriter&) = delete;
  void append(const StepRecord& r);  // writes and flushes one row

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

// Reads a metrics CSV (columns found by name, so older or extended files still read). Throws
// kilter::Error naming the file and line for a missing column or a malformed number. A last
// line cut short by a crash is skipped; when a step appears twice (a resumed run appends the
// steps after its checkpoint again) the later row wins and rows come back sorted by step.
std::vector<StepRecord> read_metrics_csv(const std::string& path, int rank);

}  // namespace kilter::diag
