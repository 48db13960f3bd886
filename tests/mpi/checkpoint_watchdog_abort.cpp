// The watchdog ends a stuck job and names the rank that did not arrive: rank 1 "works" for 20 s
// while the others enter a bracketed barrier with a 1 s timeout. The watchdog aborts the job, so
// this test never returns: it passes when the output holds the watchdog's report (ctest
// PASS_REGULAR_EXPRESSION). If the watchdog never fired, the loop finishes after ~20 s and the
// test fails. GoogleTest, with the MPI main of tests/mpi/comm_test_main.cpp.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "lib/train/watchdog.h"

TEST(Watchdog, EndsAStuckJobNamingTheRankNotArrived) {
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
  ADD_FAILURE() << "rank " << rank << ": finished after " << seconds << " s without the watchdog firing";
}
