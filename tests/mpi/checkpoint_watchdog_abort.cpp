// The watchdog ends a stuck job and names the rank that did not arrive: rank 1 "works" for 20 s
// while the others enter a bracketed barrier with a 1 s timeout. The test passes when the output
// holds the watchdog's report (ctest PASS_REGULAR_EXPRESSION); if the watchdog never fired, the
// program finishes after ~20 s printing no report, and the test fails.
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "lib/train/watchdog.h"

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const auto start = std::chrono::steady_clock::now();
  {
    kilter::train::Watchdog watchdog(MPI_COMM_WORLD, 1.0);
    for (long step = 0; step < 3; ++step) {
      if (rank == 1 && step == 2) std::this_thread::sleep_for(std::chrono::seconds(20));
      watchdog.enter("test barrier", step);
      MPI_Barrier(MPI_COMM_WORLD);
      watchdog.leave();
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("rank %d: finished after %.1f s without the watchdog firing\n", rank, seconds);
  MPI_Finalize();
  return 1;
}
