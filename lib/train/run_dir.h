// The run directory at the start of `kilter train` (issue 17): `--resume` must find a checkpoint
// to continue from, and a new run must not mix its checkpoints with those of a run of another
// config in the same output.dir. Rank 0 looks at the files and every rank gets the same answer,
// so a refusal is the same one-line error on every rank, never a hang.
#pragma once
#include <mpi.h>

#include <string>

#include "lib/core/config.h"

namespace kilter::train {

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
