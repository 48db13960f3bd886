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
  Watchdog(MPI_Comm world, double timeout_s);
  ~Watchdog();
  // Brackets a blocking section (collective) named `what` for step `step`.
  void enter(const char* what, long step);
  void leave();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kilter::train
