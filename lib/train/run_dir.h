// The run directory at the start of `kilter train` (issues 17, 25). Before MPI starts, every rank
// looks at the files alone and reaches the same decision (decide_run_dir): a new run, a re-run of
// the same command that continues from the newest checkpoint, a refusal naming the keys that
// differ, or, with --force, the old run moved aside (never truncated). After MPI starts,
// `--resume` must find a checkpoint; rank 0 looks and every rank gets the same answer, so a
// refusal is the same one-line error on every rank, never a hang.
#pragma once
#include <mpi.h>

#include <string>

#include "lib/core/config.h"

namespace kilter::train {

// What `kilter train` does with its run directory, decided before MPI_Init.
struct RunDirDecision {
  enum class Action {
    fresh,         // no run there yet: start at step 0
    resume,        // the same config with checkpoints: continue from the newest (resume_arg)
    move_aside,    // --force over an existing run: rename it to RUN_DIR.old-TIMESTAMP, then fresh
    nothing_to_do  // the same config already finished train.steps
  };
  Action action = Action::fresh;
  std::string run_dir;
  std::string resume_arg;  // for RunOptions::resume (Action::resume)
  std::string note;        // one line for rank 0's stderr ("" for none)
};

// Checks data.dir (present, an index that loads) and resolves model.vocab_size from it into
// `cfg`, as the run will. Throws a user kilter::Error naming data.dir and what to do.
void check_dataset_before_launch(Config& cfg);

// The decision for a run of `cfg` (resolved by check_dataset_before_launch) with `--resume
// resume_arg` ("" for none) and `--force`. Not collective: every rank reads the same files and
// decides the same. Throws a user kilter::Error for a refusal: a run of another config (naming
// the keys that differ), a run that wrote metrics but no checkpoint, --force with --resume.
RunDirDecision decide_run_dir(const Config& cfg, const std::string& resume_arg, bool force);

// Rank 0 (after MPI_Init, before anything is written): renames `run_dir` to
// RUN_DIR.old-YYYYMMDD-HHMMSS (a new name when that exists) and returns the new name.
std::string move_run_aside(const std::string& run_dir);

// Collective. The newest complete checkpoint of `run_dir` (or the file named directly) for
// `--resume resume_arg`; throws kilter::Error on every rank when there is none, saying whether
// the folder is missing, holds no checkpoint, or only the temp file of a write that did not
// finish, and what to do.
std::string find_resume_checkpoint(MPI_Comm world, const std::string& run_dir, const std::string& resume_arg);

// Collective. For a new run (no --resume) into `run_dir`: when the folder already holds
// checkpoints of a run whose config.ini differs from `cfg` in a key that changes the numbers,
// throws kilter::Error on every rank naming the folder and the keys; with the same config it
// warns (rank 0) that the run starts again at step 0.
void check_new_run_dir(MPI_Comm world, const std::string& run_dir, const Config& cfg);

}  // namespace kilter::train
