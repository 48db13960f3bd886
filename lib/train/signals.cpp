// Preemption signals (see signals.h). The handler only stores the signal number in a lock-free
// atomic: async-signal-safe, and read by the trainer once per step (then agreed on by all ranks
// in the step's small allreduce). SA_RESTART keeps reads, writes and MPI's system calls from
// failing with EINTR when the signal lands in the middle of them.
#include "lib/train/signals.h"

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>

#include "io/error.h"

namespace kilter::train {
namespace {

std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal flag must be lock-free to be async-signal-safe");

extern "C" void on_stop_signal(int signo) {
  // The first signal wins; repeats (Slurm may signal the step and the batch shell) change nothing.
  int expected = 0;
  g_stop_signal.compare_exchange_strong(expected, signo);
}

}  // namespace

void install_stop_signal_handlers() {
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int signo : {SIGUSR1, SIGTERM}) {
    KILTER_CHECK(sigaction(signo, &action, nullptr) == 0,
                 "cannot install the handler for signal " << signo << ": " << std::strerror(errno));
  }
}

int stop_signal_received() { return g_stop_signal.load(std::memory_order_relaxed); }

void reset_stop_signal_for_test() { g_stop_signal.store(0); }

}  // namespace kilter::train
