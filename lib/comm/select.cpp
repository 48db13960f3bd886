// The one place that picks a Communicator implementation: "mpi" (host buffers, always built)
// or "nccl" (device buffers, built only with KILTER_WITH_NCCL), after checking that no two of its
// ranks share a GPU (device_sharing.h), which NCCL would refuse later with less to go on.
#include "io/base/error.h"
#include "lib/comm/communicator.h"
#ifdef KILTER_WITH_NCCL
#include "lib/comm/device_sharing.h"
#include "lib/comm/nccl_communicator.h"
#endif

namespace kilter::comm {

std::unique_ptr<Communicator> make_communicator(const std::string& kind, MPI_Comm comm, double timeout_s) {
  if (kind == "mpi") return make_mpi_communicator(comm);
  if (kind == "nccl") {
#ifdef KILTER_WITH_NCCL
    check_nccl_devices(comm);
    return make_nccl_communicator(comm, timeout_s);
#else
    (void)timeout_s;
    KILTER_FAIL("communicator 'nccl' is not compiled into this kilter (backends: see kilter --version); "
                "rebuild with -DENABLE_CUDA=ON -DENABLE_NCCL=ON, or train on the cpu backend");
#endif
  }
  KILTER_FAIL("unknown communicator kind '" << kind << "': expected mpi | nccl");
}

}  // namespace kilter::comm
