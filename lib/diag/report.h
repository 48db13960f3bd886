// `kilter report RUN_DIR`: loads a run directory (metrics CSVs, summary.json, config.ini),
// recomputes the diagnostics statistics from the per-step rows (so a crashed run without a
// summary still gets a report), and renders the text summary and the self-contained report.html.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/diag/metrics_csv.h"
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
  std::vector<TrainRow> train;                 // metrics/train.csv ([] for runs without one)
  int64_t eval_every = 0, checkpoint_every = 0, sample_every = 0;  // from config.ini: stall causes
};

// What made a stalled step slow when the run itself did it between steps: "evaluation
// (train.eval_every = 50)", "checkpoint (output.checkpoint_every = 100)", "sample
// (output.sample_every = ...)", or "" when none of them falls there. Work done after step k's
// update is timed as the `outside` time of the next record, so a stall at record step j whose
// grown phase is `outside` is an evaluation when j is a multiple of train.eval_every.
std::string stall_cause(const RunData& run, int64_t step, const std::string& phase);

// `kilter report --compare RUN_A RUN_B ...`: one self-contained page with the runs side by side:
// train and eval loss against tokens, tokens/s over steps, a table of throughput and balance
// figures and one of mean phase times. stats[i] is recompute_statistics(runs[i]).
std::string compare_html(const std::vector<RunData>& runs, const std::vector<nlohmann::json>& stats);
// The same figures as text, one column per run.
std::string compare_text(const std::vector<RunData>& runs, const std::vector<nlohmann::json>& stats);

// The JavaScript of a line chart of several series, shared by report.html and the compare page:
// a global kilterMultiLine(id, series, xLabel, yLabel) with series [{name, color, dashed,
// points: [[x, y], ...]}]; each drawn series is a polyline of class "curve" with data-points =
// its number of points, named in a legend; returns 1 when it drew any. Self-contained.
const char* multi_line_chart_js();

// Text made safe inside HTML (& < > " ').
std::string html_escape(const std::string& s);

// Reads RUN_DIR. Throws kilter::Error naming the file when the run directory or its metrics are
// missing or malformed.
RunData load_run(const std::string& run_dir);

// The statistics (RunStatistics::to_json fields) recomputed over the steps every rank recorded.
nlohmann::json recompute_statistics(const RunData& run);

// The in-run calibration (summary.json cost_calibration; calibration_report.cpp): per window its
// fit and verdict, and per re-plan the predicted and measured imbalance before and after and the
// sync_wait it saved ("" where the run did not calibrate); and the rank speeds in force at the end
// with the tokens the plan gave each ("rank 5 runs 12% slower on equal work; the plan gives it 11%
// fewer tokens than the other ranks' mean").
std::string calibration_text(const RunData& run);
std::string rank_speed_text(const RunData& run);

// The text summary printed on stdout: run figures, plan statistics, straggler, stalls, memory
// and the per-rank phase table.
std::string report_text(const RunData& run, const nlohmann::json& stats);

// report.html: one file with inline CSS, JS and data (no network): a rank x step heatmap of
// compute time, stacked phase bars per rank, loss and tokens/s over steps, plan statistics.
std::string report_html(const RunData& run, const nlohmann::json& stats);

}  // namespace kilter::diag
