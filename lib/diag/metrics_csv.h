// The run's CSV files, written row by row and flushed, so a crashed run keeps every finished step;
// read back by `kilter report`. metrics/rank-NNNNN.csv: one row per step per rank (timings,
// docs/design.md "Run directory"); metrics/train.csv: rank 0's training curve, one row per logged
// or evaluated step (loss, lr, grad norm, tokens/s, eval loss and perplexity; README). A new run
// never truncates a file that holds rows; a resumed run appends.
#pragma once
#include <cstdio>
#include <limits>
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

// A CSV file written a row at a time, each row flushed. Opening writes the header into an empty
// file; with `append` (a resumed run) an existing file keeps its rows and gets no second header.
// Without `append` a file that already holds rows is refused (kilter::Error), never truncated.
class CsvAppender {
 public:
  CsvAppender(const std::string& path, const std::string& header, bool append);
  ~CsvAppender();
  CsvAppender(const CsvAppender&) = delete;
  CsvAppender& operator=(const CsvAppender&) = delete;
  void append_line(std::string line);  // writes and flushes one row (no newline in `line`)

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

class MetricsCsvWriter {
 public:
  explicit MetricsCsvWriter(const std::string& path, bool append = false)
      : file_(path, metrics_csv_header(), append) {}
  void append(const StepRecord& r) { file_.append_line(metrics_csv_row(r)); }

 private:
  CsvAppender file_;
};

// One row of metrics/train.csv. eval_loss is NaN where the step was not evaluated (an empty
// cell, as are eval_perplexity and, on an eval-only row, the training figures).
struct TrainRow {
  int64_t step = 0;                // optimizer steps completed
  double tokens = 0;               // target tokens seen since step 0 (all ranks)
  double loss = 0;                 // training loss of this step (mean over its target tokens)
  double lr = 0;                   // learning rate of this step's update
  double grad_norm = 0;            // global gradient norm before clipping
  double tokens_per_second = 0;    // since the previous row
  double eval_loss = std::numeric_limits<double>::quiet_NaN();  // held-out loss (NaN: not evaluated at this step)
  double elapsed_seconds = 0;      // since this process's loop started
};

std::string train_csv_path(const std::string& run_dir);  // RUN_DIR/metrics/train.csv
std::string train_csv_header();
std::string train_csv_row(const TrainRow& r);
// Rows by step (a resumed run's repeated steps: the later row wins); [] when the file is absent.
std::vector<TrainRow> read_train_csv(const std::string& path);

// Reads a metrics CSV (columns found by name, so older or extended files still read). Throws
// kilter::Error naming the file and line for a missing column or a malformed number. A last
// line cut short by a crash is skipped; when a step appears twice (a resumed run appends the
// steps after its checkpoint again) the later row wins and rows come back sorted by step.
std::vector<StepRecord> read_metrics_csv(const std::string& path, int rank);

}  // namespace kilter::diag
