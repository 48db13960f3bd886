// NcclCommunicator: sum-collectives on device buffers through NCCL, ordered after the CUDA
// model's compute stream by events, with waits that poll ncclCommGetAsyncError and a timeout so
// that a failed or stuck collective ends the job with a message (see nccl_communicator.h).
#include <nccl.h>

#include <chrono>
#include <string>
#include <thread>

#include "lib/backend/cuda_common.h"
#include "lib/backend/cuda_model.h"
#include "lib/comm/nccl_communicator.h"

namespace kilter::comm {

namespace {

#define KILTER_NCCL_CHECK(call, comm_for_message)                                              \
  do {                                                                                         \
    ncclResult_t kilter_nccl_status_ = (call);                                                 \
    if (kilter_nccl_status_ != ncclSuccess && kilter_nccl_status_ != ncclInProgress)          \
      KILTER_FAIL("NCCL call " << #call << " failed: " << ncclGetErrorString(kilter_nccl_status_) \
                               << last_nccl_error(comm_for_message));                          \
  } while (0)

std::string last_nccl_error(ncclComm_t comm) {
  const char* detail = ncclGetLastError(comm);
  return (detail != nullptr && *detail != '\0') ? std::string(" (") + detail + ")" : std::string();
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::i64: return ncclInt64;
  }
  KILTER_FAIL("NCCL communicator: unsupported data type");
}

class NcclCommunicator;

// One in-flight collective: an event recorded on the communication stream after it.
class NcclRequest final : public Request {
 public:
  NcclRequest(NcclCommunicator* owner, cudaEvent_t done, const char* what) : owner_(owner), done_(done), what_(what) {}
  ~NcclRequest() override { cudaEventDestroy(done_); }
  void wait() override;
  bool test() override;

 private:
  NcclCommunicator* owner_;
  cudaEvent_t done_;
  const char* what_;
  bool complete_ = false;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(MPI_Comm comm, double timeout_s) : timeout_s_(timeout_s) {
    KILTER_CHECK(timeout_s > 0, "comm.timeout_s must be positive, got " << timeout_s);
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &size_);
    device_ = backend::cuda_device_index();
    ncclUniqueId id{};
    if (rank_ == 0) KILTER_NCCL_CHECK(ncclGetUniqueId(&id), nullptr);
    const int mpi_status = MPI_Bcast(&id, static_cast<int>(sizeof id), MPI_BYTE, 0, comm);
    KILTER_CHECK(mpi_status == MPI_SUCCESS, "NCCL bootstrap: MPI_Bcast of the ncclUniqueId failed on rank " << rank_);
    KILTER_NCCL_CHECK(ncclCommInitRank(&comm_, size_, id, rank_), nullptr);
    KILTER_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    KILTER_CUDA_CHECK(cudaEventCreateWithFlags(&compute_ready_, cudaEventDisableTiming));
  }

  ~NcclCommunicator() override {
    if (!aborted_) {
      cudaStreamSynchronize(stream_);
      ncclCommDestroy(comm_);
    }
    cudaEventDestroy(compute_ready_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::unique_ptr<Request> iallreduce(void* buf, size_t count, DType t) override {
    begin_collective("allreduce");
    KILTER_NCCL_CHECK(ncclAllReduce(buf, buf, count, nccl_type(t), ncclSum, comm_, stream_), comm_);
    return end_collective("allreduce");
  }

  std::unique_ptr<Request> ireduce_scatter(const void* send, void* recv, size_t count, DType t) override {
    begin_collective("reduce_scatter");
    KILTER_NCCL_CHECK(ncclReduceScatter(send, recv, count, nccl_type(t), ncclSum, comm_, stream_), comm_);
    return end_collective("reduce_scatter");
  }

  std::unique_ptr<Request> iallgather(const void* send, void* recv, size_t count, DType t) override {
    begin_collective("allgather");
    KILTER_NCCL_CHECK(ncclAllGather(send, recv, count, nccl_type(t), comm_, stream_), comm_);
    return end_collective("allgather");
  }

  void broadcast(void* buf, size_t bytes, int root) override {
    KILTER_CHECK(root >= 0 && root < size_, "NCCL broadcast: root " << root << " outside [0, " << size_ << ")");
    begin_collective("broadcast");
    KILTER_NCCL_CHECK(ncclBroadcast(buf, buf, bytes, ncclUint8, root, comm_, stream_), comm_);
    end_collective("broadcast")->wait();
  }

  // Polls until `done` completes; throws (after ncclCommAbort) on an asynchronous NCCL error or
  // when the collective outlives the timeout.
  void wait_for(cudaEvent_t done, const char* what) {
    const auto start = std::chrono::steady_clock::now();
    auto pause = std::chrono::microseconds(20);
    for (;;) {
      if (poll(done, what)) return;
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited > timeout_s_) {
        abort_communicator();
        KILTER_FAIL("NCCL " << what << " did not complete within comm.timeout_s=" << timeout_s_ << " s on rank "
                            << rank_ << " of " << size_ << " (device " << device_
                            << "): another rank is stuck or gone; communicator aborted");
      }
      std::this_thread::sleep_for(pause);
      if (pause < std::chrono::microseconds(1000)) pause *= 2;
    }
  }

  // True when `done` has completed; throws on errors (see wait_for).
  bool poll(cudaEvent_t done, const char* what) {
    KILTER_CHECK(!aborted_, "NCCL " << what << ": the communicator was aborted after an earlier failure");
    const cudaError_t query = cudaEventQuery(done);
    if (query == cudaSuccess) return true;
    if (query != cudaErrorNotReady) {
      abort_communicator();
      KILTER_FAIL("NCCL " << what << " on rank " << rank_ << ": CUDA error " << cudaGetErrorString(query));
    }
    ncclResult_t async_status = ncclSuccess;
    const ncclResult_t status = ncclCommGetAsyncError(comm_, &async_status);
    if (status != ncclSuccess || (async_status != ncclSuccess && async_status != ncclInProgress)) {
      const std::string detail = last_nccl_error(comm_);
      abort_communicator();
      KILTER_FAIL("NCCL " << what << " failed on rank " << rank_ << " of " << size_ << ": "
                          << ncclGetErrorString(status != ncclSuccess ? status : async_status) << detail
                          << "; communicator aborted");
    }
    return false;
  }

 private:
  void begin_collective(const char* what) {
    KILTER_CHECK(!aborted_, "NCCL " << what << ": the communicator was aborted after an earlier failure");
    KILTER_CUDA_CHECK(cudaSetDevice(device_));  // callers may be on another thread
    // Order after everything queued so far on the model's compute stream.
    KILTER_CUDA_CHECK(cudaEventRecord(compute_ready_, backend::cuda_compute_stream()));
    KILTER_CUDA_CHECK(cudaStreamWaitEvent(stream_, compute_ready_, 0));
  }

  std::unique_ptr<Request> end_collective(const char* what) {
    cudaEvent_t done = nullptr;
    KILTER_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    KILTER_CUDA_CHECK(cudaEventRecord(done, stream_));
    return std::make_unique<NcclRequest>(this, done, what);
  }

  void abort_communicator() {
    if (aborted_) return;
    aborted_ = true;
    ncclCommAbort(comm_);
  }

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t compute_ready_ = nullptr;
  int rank_ = 0, size_ = 1, device_ = 0;
  double timeout_s_;
  bool aborted_ = false;
};

void NcclRequest::wait() {
  if (complete_) return;
  owner_->wait_for(done_, what_);
  complete_ = true;
}

bool NcclRequest::test() {
  if (!complete_) complete_ = owner_->poll(done_, what_);
  return complete_;
}

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, double timeout_s) {
  return std::make_unique<NcclCommunicator>(comm, timeout_s);
}

std::string nccl_version_string() {
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess) return "NCCL (version unknown)";
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
  return "NCCL " + std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
         std::to_string(version % 100);
}

}  // namespace kilter::comm
