// NcclCommunicator: sum-collectives on device buffers through NCCL, ordered after the CUDA
// model's compute stream by events, with waits that poll ncclCommGetAsyncError and a timeout so
// that a failed or stuck collective ends the job with a message (see nccl_communicator.h).
#include <memory>
#include <sstream>
#include <string>

#include "io/base/cuda_common.h"
#include "lib/comm/nccl_communicator.h"
#include "lib/comm/nccl_util.h"

namespace kilter::comm {

namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::i64: return ncclInt64;
    case DType::bf16: return ncclBfloat16;  // gathered only (the reducer sums in fp32)
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
  NcclCommunicator(MPI_Comm comm, double timeout_s) : nccl_(comm, check_timeout(timeout_s), "NCCL collectives") {
    KILTER_CUDA_CHECK(cudaEventCreateWithFlags(&compute_ready_, cudaEventDisableTiming));
  }

  ~NcclCommunicator() override { cudaEventDestroy(compute_ready_); }

  int rank() const override { return nccl_.rank(); }
  int size() const override { return nccl_.size(); }

  std::unique_ptr<Request> iallreduce(void* buf, size_t count, DType t) override {
    const cudaStream_t stream = begin_collective("allreduce");
    KILTER_NCCL_CHECK(ncclAllReduce(buf, buf, count, nccl_type(t), ncclSum, nccl_.get(), stream), nccl_.get());
    return end_collective("allreduce");
  }

  std::unique_ptr<Request> ireduce_scatter(const void* send, void* recv, size_t count, DType t) override {
    const cudaStream_t stream = begin_collective("reduce_scatter");
    KILTER_NCCL_CHECK(ncclReduceScatter(send, recv, count, nccl_type(t), ncclSum, nccl_.get(), stream), nccl_.get());
    return end_collective("reduce_scatter");
  }

  std::unique_ptr<Request> iallgather(const void* send, void* recv, size_t count, DType t) override {
    const cudaStream_t stream = begin_collective("allgather");
    KILTER_NCCL_CHECK(ncclAllGather(send, recv, count, nccl_type(t), nccl_.get(), stream), nccl_.get());
    return end_collective("allgather");
  }

  void broadcast(void* buf, size_t bytes, int root) override {
    KILTER_CHECK(root >= 0 && root < size(), "NCCL broadcast: root " << root << " outside [0, " << size() << ")");
    const cudaStream_t stream = begin_collective("broadcast");
    KILTER_NCCL_CHECK(ncclBroadcast(buf, buf, bytes, ncclUint8, root, nccl_.get(), stream), nccl_.get());
    end_collective("broadcast")->wait();
  }

  // Polls until `done` completes; throws (after ncclCommAbort) on an asynchronous NCCL error or
  // when the collective outlives the timeout.
  void wait_for(cudaEvent_t done, const char* what) { nccl_.wait(done, failure_message(what)); }

  // True when `done` has completed; throws on errors (see wait_for).
  bool poll(cudaEvent_t done, const char* what) { return nccl_.poll(done, failure_message(what)); }

 private:
  static double check_timeout(double timeout_s) {
    KILTER_CHECK(timeout_s > 0, "comm.timeout_s must be positive, got " << timeout_s);
    return timeout_s;
  }

  NcclFailureMessage failure_message(const char* what) const {
    return [this, what](const std::string& cause) {
      std::ostringstream message;
      message << "NCCL " << what;
      if (cause.empty())
        message << " did not complete within comm.timeout_s=" << nccl_.timeout_s() << " s on rank " << rank()
                << " of " << size() << " (device " << nccl_.device()
                << "): another rank is stuck or gone; communicator aborted";
      else
        message << " failed on rank " << rank() << " of " << size() << ": " << cause << "; communicator aborted";
      return message.str();
    };
  }

  // The communication stream, ordered after everything queued so far on the model's compute stream.
  cudaStream_t begin_collective(const char* what) {
    KILTER_CHECK(!nccl_.aborted(), "NCCL " << what << ": the communicator was aborted after an earlier failure");
    KILTER_CUDA_CHECK(cudaSetDevice(nccl_.device()));  // callers may be on another thread
    KILTER_CUDA_CHECK(cudaEventRecord(compute_ready_, backend::cuda_compute_stream()));
    KILTER_CUDA_CHECK(cudaStreamWaitEvent(nccl_.stream(), compute_ready_, 0));
    return nccl_.stream();
  }

  std::unique_ptr<Request> end_collective(const char* what) {
    cudaEvent_t done = nullptr;
    KILTER_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    KILTER_CUDA_CHECK(cudaEventRecord(done, nccl_.stream()));
    return std::make_unique<NcclRequest>(this, done, what);
  }

  NcclComm nccl_;
  cudaEvent_t compute_ready_ = nullptr;
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
