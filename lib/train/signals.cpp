// Preemption signals (see signals.h). SIGUSR1 and SIGTERM are blocked in the thread that installs
// the handlers, so every thread it starts afterwards (the GEMM engine's OpenMP workers, the
// communication thread, reader workers, the watchdog, the checkpoint writer) has them blocked too,
// and one watcher thread takes them with sigwait(). Why not a plain handler: a handler runs on the
// stack of whichever thread the signal lands on, and oneDNN's JIT sgemm kernels (Debian's 2.6;
// fixed upstream by oneDNN pull request 4855) point the stack pointer into a heap workspace
// while they run, so the kernel's signal frame was written into the heap: the "free(): invalid
// pointer" / "corrupted size vs. prev_size" aborts of rank 1 in e2e_fault_signal. The handler
// stays installed for threads started before (MPI's own), which never run GEMMs; it only stores
// the signal number in a lock-free atomic (async-signal-safe). The trainer reads the flag once per
// step and the ranks agree on it in the step's small allreduce.
#include "lib/train/signals.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <mutex>
#include <thread>

#include "io/error.h"

namespace kilter::train {
namespace {

std::atomic<int> g_stop_signal{0};
std::atomic<long> g_signals_seen{0};  // every stop signal taken, for raise_stop_signal_for_test
static_assert(std::atomic<int>::is_always_lock_free, "the signal flag must be lock-free to be async-signal-safe");
static_assert(std::atomic<long>::is_always_lock_free, "the signal count must be lock-free to be async-signal-safe");

void record_stop_signal(int signo) {
  // The first signal wins; repeats (Slurm may signal the step and the batch shell) change nothing.
  int expected = 0;
  g_stop_signal.compare_exchange_strong(expected, signo);
  g_signals_seen.fetch_add(1);
}

extern "C" void on_stop_signal(int signo) { record_stop_signal(signo); }

sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  sigaddset(&set, SIGTERM);
  return set;
}

// The one thread that takes the stop signals (they are blocked in it too: sigwait needs that).
void watch_stop_signals(sigset_t set) {
  for (;;) {
    int signo = 0;
    if (sigwait(&set, &signo) == 0) record_stop_signal(signo);
  }
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
  const sigset_t set = stop_signals();
  const int rc = pthread_sigmask(SIG_BLOCK, &set, nullptr);
  KILTER_CHECK(rc == 0, "cannot block the stop signals in the training thread: " << std::strerror(rc));
  // Started once per process and left running (detached): it holds nothing but its stack, and a
  // process never stops listening for preemption.
  static std::once_flag watcher_started;
  std::call_once(watcher_started, [set] { std::thread(watch_stop_signals, set).detach(); });
}

int stop_signal_received() { return g_stop_signal.load(std::memory_order_relaxed); }

void reset_stop_signal_for_test() { g_stop_signal.store(0); }

void raise_stop_signal_for_test(int signo) {
  const long before = g_signals_seen.load();
  KILTER_CHECK(::kill(::getpid(), signo) == 0, "kill(" << signo << ") failed: " << std::strerror(errno));
  // Taken by the watcher thread: wait (bounded) until it has recorded it.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (g_signals_seen.load() == before) {
    KILTER_CHECK(std::chrono::steady_clock::now() < deadline,
                 "signal " << signo << " was not taken within 30 s (install_stop_signal_handlers not called?)");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace kilter::train
