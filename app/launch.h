// Helpers shared by the MPI subcommands: the launcher's rank before MPI_Init (to print an option
// error once), MPI start-up with the thread level the communication thread needs, and the
// error path that ends every rank instead of leaving the others hanging.
#pragma once
#include <mpi.h>

#include <string>

namespace kilter::app {

// Rank from the launcher's environment (Open MPI, Slurm, PMI), 0 when not launched by one.
int launcher_rank();
// The exit code of a refusal before MPI starts, which every rank reaches alike and only the
// launcher's rank 0 prints: the other ranks wait a moment first (bounded), because a launcher that
// sees one rank exit non-zero kills the rest, and could kill rank 0 before its message is out.
int refused_before_mpi(int code);
// MPI_Init_thread(MPI_THREAD_MULTIPLE); returns the provided level.
int init_mpi(int* argc, char*** argv);
// Prints "kilter: <what>" on stderr and ends every rank of `comm` with MPI_Abort(code).
[[noreturn]] void abort_all(MPI_Comm comm, const std::string& what, int code = 1);

}  // namespace kilter::app
