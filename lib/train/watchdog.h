// Watchdog: a thread that notices when this rank has been inside a collective longer
// than [comm] timeout_s, reports which ranks have not arrived (as far as it can tell) and ends the
// job with MPI_Abort instead of hanging. Owner: checkpoints.
#pragma once
#include <mpi.h>

#include <atomic>
#include <memory>
#include <string>

namespace kilter::train {

class Watchdog {
 public:
  // Collective over `world` (duplicates it for the watchdog's own queries). timeout_s <= 0
  // disables it. Asking other ranks where they are needs MPI_THREAD_MULTIPLE; without it the
  // watchdog still ends a stuck job but cannot name the ranks.
  Watchdog(MPI_Comm world, double timeout_s);
  // Waits for nothing: stops the thread. Call it (leave the scope) before MPI_Finalize.
  ~Watchdog();
  // Brackets a blocking section (collective) named `what` for step `step`. Bracket only
  // collectives that every rank enters in the same order (the ranks are compared by how many
  // sections they entered); sections do not nest. Cheap: one mutex, no MPI call.
  // `done`, for a section whose collective completes on another thread (the reducer's background
  // parameter gather) while this thread works on: once it is set, the section no longer counts as
  // waiting (it cannot time out, and other ranks' queries hear "working since <what>"), though it
  // lasts until leave(). A rank stalled elsewhere (its data, a hang) after such a collective is
  // then named by the ranks waiting for it at the next one, not blamed on the finished gather.
  void enter(const char* what, long step, std::shared_ptr<const std::atomic<bool>> done = nullptr);
  void leave();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kilter::train
