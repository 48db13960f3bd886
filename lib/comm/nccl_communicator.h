// The NCCL implementation of kilter::comm::Communicator (device buffers), bootstrapped through
// MPI: rank 0 of the given communicator makes the ncclUniqueId and MPI_Bcast's it. Collectives run
// on a dedicated communication stream that first waits (by event) for the work already queued on
// the CUDA model's compute stream, so a bucket the model reports ready is reduced after the
// kernels that produced it, while later backward kernels keep running. Request::wait/test poll
// the collective's completion event and ncclCommGetAsyncError; a failed collective, or one not
// done within the timeout, aborts the NCCL communicator (ncclCommAbort) and throws a
// kilter::Error naming the operation, the rank and the cause, instead of hanging.
// Owner: gpu. Implementation: lib/comm/nccl_communicator.cu.
#pragma once
#include <mpi.h>

#include <memory>
#include <string>

#include "lib/comm/communicator.h"

namespace kilter::comm {

// Collective over `comm` (every rank calls it). Each rank uses its CUDA device of
// kilter::backend::cuda_device_index(); ranks sharing a device in one communicator are an NCCL
// error. timeout_s bounds every wait (comm.timeout_s).
std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, double timeout_s = 300.0);

// "NCCL x.y.z" of the library this process runs with (for --version and logs).
std::string nccl_version_string();

}  // namespace kilter::comm
