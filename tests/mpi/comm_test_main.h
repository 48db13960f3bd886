// Shared by the comm MPI tests: a GoogleTest main that runs inside MPI (MPI_THREAD_MULTIPLE,
// errors returned as codes), prints only rank 0's results and fails on every rank when any rank
// failed; plus a helper that agrees on a verdict across ranks, so that no rank returns early
// from a test while the others wait in a collective.
#pragma once
#include <mpi.h>

namespace kilter::comm::testing {

// Sum of `local_failures` over MPI_COMM_WORLD (every rank gets the same number).
long global_failures(long local_failures);
// Value of `--ranks-per-node L` on the test's command line (0 when absent).
int ranks_per_node_arg();

}  // namespace kilter::comm::testing
