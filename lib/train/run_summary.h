// The end of a training run: summary.json (rank 0, through diag::RankDiagnostics::finish, which
// adds the measured statistics) and the last log lines. The plan's figures carry the names
// `kilter plan --json` gives them (balance::plan_stats_json).
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/train/run_setup.h"

namespace kilter::train {

// What the step loop counted, for the summary.
struct RunProgress {
  int64_t first_step = 0;  // the step this process started at (> 0 after a resume)
  double t_loop = 0;       // now_seconds() when the loop began
  double elapsed = 0;      // seconds the loop ran
  double tokens_this_run = 0;
  double last_loss = NAN;
  double eval_loss = NAN;  // the latest evaluation (NaN: none)
  int64_t nonfinite_skipped = 0;
  int exit_code = 0;       // 0, or kExitPreempted after a stop signal
  nlohmann::json cut_cost_check;  // rank 0: the cut-cost check's verdict (null: none in this process)
  std::vector<uint64_t> tokens_per_source;  // a mixture: this run's target tokens per source
  nlohmann::json eval_loss_per_source;      // a mixture: the latest evaluation per source
  // The attention engines' graph builds in this process's first kGraphBuildSteps steps (cuDNN SDPA
  // per shape bucket: what new buckets cost at the start); recorded at that step or at the end.
  model::EngineBuildStats early_builds;
  int64_t early_build_steps = -1;  // steps they cover (-1: not recorded yet)
};
inline constexpr int64_t kGraphBuildSteps = 20;

// Collective (the diagnostics' last gather): writes summary.json on rank 0, prints the closing
// line there, and the summary object on stdout with --json.
void write_run_summary(Run& run, const RunProgress& progress);

}  // namespace kilter::train
