// The training job (`kilter train`): plan -> reader/prefetch -> forward/backward -> gradient
// reduction -> clip -> AdamW, with per-rank diagnostics, checkpoints and preemption handling.
#pragma once
#include <mpi.h>

#include <string>

#include "lib/core/config.h"

namespace kilter::train {

struct RunOptions {
  std::string resume;   // "" | RUN_DIR | "latest" (= the config's output.dir)
  bool json = false;    // print summary.json's object last on rank 0's stdout
  bool move_aside = false;  // --force: rank 0 renames the run in output.dir first (move_run_aside)
  std::string note;         // rank 0 prints it first (the run directory's decision, run_dir.h)
};

// Runs the whole job on `world`; returns the process exit code (0, or kExitPreempted after a
// signalled checkpoint). Throws kilter::Error on failure (the caller aborts every rank).
int run_training(MPI_Comm world, const Config& cfg, const RunOptions& opts);

}  // namespace kilter::train
