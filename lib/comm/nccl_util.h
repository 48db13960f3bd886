// What kilter's two NCCL users share, the communicator of the collectives (nccl_communicator.cu)
// and the K/V exchange of cut pieces (kv_exchange_nccl.cu): the one check macro for NCCL calls,
// and NcclComm, the NCCL communicator as both set it up and end it: bootstrapped through MPI
// (rank 0 makes the ncclUniqueId and MPI_Bcast's it, then ncclCommInitRank), with a stream of its
// own, waits that poll an event and ncclCommGetAsyncError without blocking, bounded by the
// watchdog's timeout (comm.timeout_s), and ncclCommAbort on a failure or a timeout so that no
// rank hangs. Included only by .cu files (it needs nccl.h; NCCL-less builds drop *nccl* sources).
#pragma once
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "io/base/error.h"
#include "lib/comm/abort_hooks.h"

namespace kilter::comm {

// " (ncclGetLastError's text)" for `comm` (nullptr: the last error of any), or "" when empty.
std::string nccl_last_error(ncclComm_t comm);

}  // namespace kilter::comm

// KILTER_NCCL_CHECK(ncclAllReduce(...), comm): throws with ncclGetErrorString and the detail of
// `comm` (nullptr when there is none yet). ncclInProgress is not a failure: a non-blocking call
// that goes on in the background (its errors come later, through ncclCommGetAsyncError).
#define KILTER_NCCL_CHECK(call, comm_for_message)                                                  \
  do {                                                                                             \
    ncclResult_t kilter_nccl_status_ = (call);                                                     \
    if (kilter_nccl_status_ != ncclSuccess && kilter_nccl_status_ != ncclInProgress)              \
      KILTER_FAIL("NCCL call " << #call << " failed: " << ncclGetErrorString(kilter_nccl_status_)    \
                               << ::kilter::comm::nccl_last_error(comm_for_message));              \
  } while (0)

namespace kilter::comm {

// The message of a failed or timed-out wait, from its cause: "" for a timeout, else what went
// wrong ("CUDA error ..." or "NCCL error ...").
using NcclFailureMessage = std::function<std::string(const std::string& cause)>;

class NcclComm {
 public:
  // Collective over `comm` (every rank calls it), on this process's CUDA device
  // (backend::cuda_device_index()). `purpose` names it in messages ("K/V exchange"). A timeout_s
  // of 0 or less waits without bound.
  NcclComm(MPI_Comm comm, double timeout_s, const char* purpose);
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  ncclComm_t get() const { return comm_; }
  cudaStream_t stream() const { return stream_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }
  double timeout_s() const { return timeout_s_; }
  bool aborted() const { return aborted_; }

  // True when `done` has completed, false while it is pending. A CUDA error on the event or an
  // asynchronous NCCL error aborts the communicator and throws message(cause).
  bool poll(cudaEvent_t done, const NcclFailureMessage& message);
  // Polls until `done` completes, sleeping 20 us growing to 1 ms between polls; past timeout_s
  // aborts the communicator and throws message("").
  void wait(cudaEvent_t done, const NcclFailureMessage& message);
  // ncclCommAbort, once: no later operation can use the communicator, and none hangs on it.
  void abort();

 private:
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  int rank_ = 0, size_ = 1, device_ = 0;
  double timeout_s_;
  std::string purpose_;
  std::atomic<bool> aborted_{false};
  uint64_t abort_hook_ = 0;
};

}  // namespace kilter::comm
