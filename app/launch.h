// Helpers shared by the MPI subcommands: the launcher's rank before MPI_Init (to print an option
// error once), MPI start-up with the thread level the communication thread needs, and the
// error path that ends every rank instead of leaving the others hanging.
#pragma once
#include <mpi.h>

#include <string>

namespace kilter::app {

// Rank from the launcher's environment (Open MPI, Slurm, PMI), 0 when not launched by one.
int launcher_rank();
// MPI_Init_thread(MPI_THREAD_MULTIPLE); returns the provided level.
int init_mpi(int* argc, char*** argv);
// Prints "kilter: <what>" on stderr and ends every rank of `comm` with MPI_Abort(code).
[[noreturn]] void abort_all(MPI_Comm comm, const std::string& what, int code = 1);

}  // namespace kilter::app
