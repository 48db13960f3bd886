// See launch.h.
#include "app/launch.h"

#include <cstdio>
#include <cstdlib>

namespace kilter::app {

int launcher_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (const char* v = std::getenv(var)) return std::atoi(v);
  }
  return 0;
}

int init_mpi(int* argc, char*** argv) {
  int provided = 0;
  MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  // Errors come back as codes so they can be reported with the rank and the call.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  return provided;
}

void abort_all(MPI_Comm comm, const std::string& what, int code) {
  std::fprintf(stderr, "kilter: %s\n", what.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  int size = 1;
  MPI_Comm_size(comm, &size);
  if (size > 1) MPI_Abort(comm, code);
  MPI_Finalize();
  std::exit(code);
}

}  // namespace kilter::app
