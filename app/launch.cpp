// See launch.h.
#include "app/launch.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace kilter::app {

int launcher_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (const char* v = std::getenv(var)) return std::atoi(v);
  }
  return 0;
}

int refused_before_mpi(int code) {
  // Rank 0 exits as soon as it has printed, and the launcher then ends this rank: the wait costs
  // nothing in the common case and only bounds the rare one where rank 0 has not printed.
  if (code != 0 && launcher_rank() != 0) std::this_thread::sleep_for(std::chrono::seconds(5));
  return code;
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
