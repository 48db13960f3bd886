// `kilter report RUN_DIR`: loads a run directory (metrics CSVs, summary.json, config.ini),
// recomputes the diagnostics statistics from the per-step rows (so a crashed run without a
// summary still gets a report), and renders the text summary and the self-contained report.html.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/diag/step_record.h"

namespace kilter::diag {

struct RunData {
  std::string run_dir;
  int world_size = 0;
  std::vector<std::vector<StepRecord>> rows;   // [rank] -> the rank's rows, sorted by step
  std::vector<int64_t> steps;                  // steps every rank recorded, ascending
  nlohmann::json summary;                      // summary.json (null when absent)
  std::map<std::string, std::string> config;   // "section.key" -> value from config.ini
  std::string config_text;
  double stall_factor = 2.0;
};

// Reads RUN_DIR. Throws kilter::Error naming the file when the run directory or its metrics are
// missing or malformed.
RunData load_run(const std::string& run_dir);

// The statistics (RunStatistics::to_json fields) recomputed over the steps every rank recorded.
nlohmann::json recompute_statistics(const RunData& run);

// The text summary printed on stdout: run figures, plan statistics, straggler, stalls, memory
// and the per-rank phase table.
std::string report_text(const RunData& run, const nlohmann::json& stats);

// report.html: one file with inline CSS, JS and data (no network): a rank x step heatmap of
// compute time, stacked phase bars per rank, loss and tokens/s over steps, plan statistics.
std::string report_html(const RunData& run, const nlohmann::json& stats);

}  // namespace kilter::diag
