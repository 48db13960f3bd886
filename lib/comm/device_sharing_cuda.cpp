// check_nccl_devices (device_sharing.h): this process's CUDA device into the one-GPU-per-rank
// check. A host file of the CUDA build (it needs the CUDA backend: *_cuda.cpp).
#include <mpi.h>

#include "io/base/error.h"
#include "io/base/cuda_device.h"
#include "lib/comm/device_sharing.h"

namespace kilter::comm {

void check_nccl_devices(MPI_Comm comm) {
  const backend::CudaDeviceIdentity device = backend::cuda_device_identity();
  int rank = error_rank();  // the world rank, for messages; a caller without one names comm ranks
  if (rank < 0) MPI_Comm_rank(comm, &rank);
  check_one_device_per_rank(comm, local_rank_device(rank, device.id, device.label));
}

}  // namespace kilter::comm
