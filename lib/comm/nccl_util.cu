// The NCCL communicator's set-up, polling and abort that both NCCL users share (see nccl_util.h).
#include "lib/comm/nccl_util.h"

#include <chrono>
#include <thread>

#include "io/base/cuda_common.h"
#include "io/base/cuda_device.h"

namespace kilter::comm {

std::string nccl_last_error(ncclComm_t comm) {
  const char* detail = ncclGetLastError(comm);
  return (detail != nullptr && *detail != '\0') ? std::string(" (") + detail + ")" : std::string();
}

NcclComm::NcclComm(MPI_Comm comm, double timeout_s, const char* purpose) : timeout_s_(timeout_s), purpose_(purpose) {
  MPI_Comm_rank(comm, &rank_);
  MPI_Comm_size(comm, &size_);
  device_ = backend::cuda_device_index();
  ncclUniqueId id{};
  if (rank_ == 0) KILTER_NCCL_CHECK(ncclGetUniqueId(&id), nullptr);
  KILTER_CHECK(MPI_Bcast(&id, int(sizeof id), MPI_BYTE, 0, comm) == MPI_SUCCESS,
               purpose_ << ": MPI_Bcast of the ncclUniqueId failed on rank " << rank_);
  KILTER_NCCL_CHECK(ncclCommInitRank(&comm_, size_, id, rank_), nullptr);
  KILTER_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  // The watchdog aborts it before it ends a stuck job (abort_hooks.h).
  abort_hook_ = register_abort_hook([this] { abort(); });
}

NcclComm::~NcclComm() {
  unregister_abort_hook(abort_hook_);
  if (!aborted_) {
    cudaStreamSynchronize(stream_);
    ncclCommDestroy(comm_);
  }
  cudaStreamDestroy(stream_);
}

bool NcclComm::poll(cudaEvent_t done, const NcclFailureMessage& message) {
  KILTER_CHECK(!aborted_, purpose_ << ": the NCCL communicator was aborted after an earlier failure");
  const cudaError_t query = cudaEventQuery(done);
  if (query == cudaSuccess) return true;
  if (query != cudaErrorNotReady) {
    abort();
    KILTER_FAIL(message(std::string("CUDA error ") + cudaGetErrorString(query)));
  }
  ncclResult_t async_status = ncclSuccess;
  const ncclResult_t status = ncclCommGetAsyncError(comm_, &async_status);
  if (status != ncclSuccess || (async_status != ncclSuccess && async_status != ncclInProgress)) {
    const std::string detail = nccl_last_error(comm_);  // before the abort clears it
    abort();
    KILTER_FAIL(message(std::string("NCCL error ") +
                        ncclGetErrorString(status != ncclSuccess ? status : async_status) + detail));
  }
  return false;
}

void NcclComm::wait(cudaEvent_t done, const NcclFailureMessage& message) {
  const auto start = std::chrono::steady_clock::now();
  auto pause = std::chrono::microseconds(20);
  for (;;) {
    if (poll(done, message)) return;
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (timeout_s_ > 0 && waited > timeout_s_) {
      abort();
      KILTER_FAIL(message(""));
    }
    std::this_thread::sleep_for(pause);
    if (pause < std::chrono::microseconds(1000)) pause *= 2;
  }
}

void NcclComm::abort() {
  if (aborted_.exchange(true)) return;  // once, whichever thread comes first (the watchdog's too)
  ncclCommAbort(comm_);
}

}  // namespace kilter::comm
