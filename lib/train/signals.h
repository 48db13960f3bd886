// Preemption signals: SIGUSR1 / SIGTERM (Slurm's --signal, scancel, preemption) ask the
// run to finish the current step, checkpoint and exit with kExitPreempted, which slurm/train.sbatch
// turns into a requeue. Owner: checkpoints.
#pragma once

namespace kilter::train {

constexpr int kExitPreempted = 85;  // documented in README and slurm/README.md

// Makes SIGUSR1 and SIGTERM set the stop flag: blocks them in the calling thread (and so in every
// thread it starts afterwards) and starts the one watcher thread that takes them (once per
// process); a handler (SA_RESTART) covers threads started before. Call it on the training thread
// before it starts any other thread. SIGINT and SIGKILL keep their default action: they end the
// process at once, without a checkpoint.
void install_stop_signal_handlers();
// Signal number received on this rank (0: none). Async-signal-safe flag read.
int stop_signal_received();
// Clears the flag (unit tests only: a run never un-receives a signal).
void reset_stop_signal_for_test();
// Sends `signo` to this process and returns once the watcher has taken it (tests and the
// KILTER_TEST_FAIL_MODE=sigusr1 hook: a preemption at an exact step). std::raise would leave it
// pending on the calling thread, which blocks it.
void raise_stop_signal_for_test(int signo);

}  // namespace kilter::train
