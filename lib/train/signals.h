// Preemption signals (issue 8): SIGUSR1 / SIGTERM (Slurm's --signal, scancel, preemption) ask the
// run to finish the current step, checkpoint and exit with kExitPreempted, which slurm/train.sbatch
// turns into a requeue. Owner: checkpoints (issue 8).
#pragma once

namespace kilter::train {

constexpr int kExitPreempted = 85;  // documented in README and slurm/README.md

// Installs the SIGUSR1 and SIGTERM handlers (SA_RESTART). SIGINT and SIGKILL keep their default
// action: they end the process at once, without a checkpoint.
void install_stop_signal_handlers();
// Signal number received on this rank (0: none). Async-signal-safe flag read.
int stop_signal_received();
// Clears the flag (unit tests only: a run never un-receives a signal).
void reset_stop_signal_for_test();

}  // namespace kilter::train
