// Preemption signals (issue 8): SIGUSR1 / SIGTERM (Slurm's --signal, scancel, preemption) ask the
// run to finish the current step, checkpoint and exit with kExitPreempted, which slurm/train.sbatch
// turns into a requeue. Owner: checkpoints (issue 8).
#pragma once

namespace kilter::train {

constexpr int kExitPreempted = 85;  // documented in README and slurm/README.md

void install_stop_signal_handlers();
// Signal number received on this rank (0: none). Async-signal-safe flag read.
int stop_signal_received();

}  // namespace kilter::train
