// Watchdog (issue 8): a thread that notices when this rank has been inside a collective longer
// than [comm] timeout_s, reports which ranks have not arrived (as far as it can tell) and ends the
// job with MPI_Abort instead of hanging. Owner: checkpoints (issue 8).
#pragma once
#include <mpi.h>

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
  void enter(const char* what, long step);
  void leave();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kilter::train
