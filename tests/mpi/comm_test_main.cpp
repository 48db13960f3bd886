// GoogleTest main for the comm MPI tests (see comm_test_main.h).
#include "tests/mpi/comm_test_main.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kilter::comm::testing {

static int g_ranks_per_node = 0;

long global_failures(long local_failures) {
  long total = 0;
  MPI_Allreduce(&local_failures, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  return total;
}

int ranks_per_node_arg() { return g_ranks_per_node; }

}  // namespace kilter::comm::testing

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i + 1 < argc; ++i)
    if (!std::strcmp(argv[i], "--ranks-per-node")) kilter::comm::testing::g_ranks_per_node = std::atoi(argv[i + 1]);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    // Other ranks report failures only (their assertion messages still print).
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int local = RUN_ALL_TESTS();
  int any = 0;
  MPI_Allreduce(&local, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (local != 0) std::fprintf(stderr, "rank %d: some tests failed\n", rank);
  MPI_Finalize();
  return any;
}
