// NcclKvChannel and the NCCL K/V exchange (kv_exchange_nccl.h). NCCL has no datatypes, so each
// run of a peer (one cut piece's rows) is its own ncclSend/ncclRecv inside the layer's group; both
// ends list a pair's runs in the step's cut order, and NCCL matches the operations between two
// ranks in the order they were issued. Buffers are stream-ordered allocations
// (cudaMallocAsync/cudaFreeAsync), freed on the stream that used them last.
#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "io/base/cuda_common.h"
#include "lib/comm/kv_exchange_nccl.h"
#include "lib/comm/nccl_util.h"

namespace kilter::comm {

namespace {

// dqkv rows += the packed dk|dv rows of one run: dqkv (rows, row_width) from its k column, in
// (rows, kv_width).
__global__ void add_kv_rows_kernel(float* dqkv, const float* in, int rows, model::KvRowLayout layout) {
  const int64_t n = int64_t(rows) * layout.kv_width;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / layout.kv_width, col = i % layout.kv_width;
    dqkv[row * layout.row_width + layout.kv_offset + col] += in[i];
  }
}

}  // namespace

// The NCCL communicator and stream every micro-batch's exchange uses: nccl_util.h's set-up,
// bounded wait and abort, with the exchange's own messages.
class NcclKvChannel : public NcclComm {
 public:
  NcclKvChannel(MPI_Comm comm, double timeout_s) : NcclComm(comm, timeout_s, "K/V exchange") {}

  // Polls `done` until it completed. An asynchronous NCCL error, a CUDA error or the timeout
  // aborts the communicator (no later exchange can use it) and throws with describe()'s message.
  void wait(cudaEvent_t done, const std::function<std::string()>& describe) {
    NcclComm::wait(done, [&](const std::string& cause) {
      return describe() + (cause.empty() ? "; NCCL communicator aborted" : " (" + cause + ")");
    });
  }
};

namespace {

class NcclKvExchange final : public CutExchange {
 public:
  NcclKvExchange(std::shared_ptr<NcclKvChannel> channel, KvSchedule schedule, const KvExchangeOptions& opts)
      : channel_(std::move(channel)), schedule_(std::move(schedule)), opts_(opts), rows_(opts.rows) {
    check_kv_options(opts);
    compute_ = backend::cuda_compute_stream();
    for (const KvPieceInfo& p : schedule_.pieces) {
      prefix_base_.push_back(prefix_rows_);
      prefix_rows_ += p.offset;
    }
    for (const KvPeer& peer : schedule_.later) {
      later_offset_.push_back(later_rows_);
      later_rows_ += peer.rows();
    }
    layers_.resize(size_t(opts.n_layer));
    for (Layer& l : layers_) {
      KILTER_CUDA_CHECK(cudaEventCreateWithFlags(&l.forward_done, cudaEventDisableTiming));
      KILTER_CUDA_CHECK(cudaEventCreateWithFlags(&l.backward_done, cudaEventDisableTiming));
    }
    KILTER_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
  }

  ~NcclKvExchange() override {
    // Stream-ordered frees: after whatever still uses the buffers on their streams.
    for (Layer& l : layers_) {
      if (l.prefix_kv) cudaFreeAsync(l.prefix_kv, compute_);
      if (l.prefix_dkv) cudaFreeAsync(l.prefix_dkv, channel_->stream());
      if (l.recv_dkv) cudaFreeAsync(l.recv_dkv, compute_);
      cudaEventDestroy(l.forward_done);
      cudaEventDestroy(l.backward_done);
    }
    cudaEventDestroy(ready_);
  }

  void forward_send(int layer, const float* qkv) override {
    Layer& l = at(layer);
    KILTER_CHECK(!l.forward_posted, "K/V exchange: forward_send(" << layer << ") called twice");
    l.forward_posted = true;
    const cudaStream_t s = after_compute();
    const int64_t row_floats = rows_.kv_width;
    float* send = nullptr;
    if (later_rows_ > 0) {
      KILTER_CUDA_CHECK(cudaMallocAsync(&send, size_t(later_rows_ * row_floats) * sizeof(float), s));
      float* out = send;
      for (const KvPeer& peer : schedule_.later)
        for (const KvRun& run : peer.runs) {
          // The k|v columns of the run's rows, packed: rows of row_width floats in, kv_width out.
          KILTER_CUDA_CHECK(cudaMemcpy2DAsync(out, size_t(row_floats) * sizeof(float),
                                              qkv + int64_t(run.row) * rows_.row_width + rows_.kv_offset,
                                              size_t(rows_.row_width) * sizeof(float),
                                              size_t(row_floats) * sizeof(float), size_t(run.rows),
                                              cudaMemcpyDeviceToDevice, s));
          out += int64_t(run.rows) * row_floats;
        }
    }
    if (prefix_rows_ > 0)
      KILTER_CUDA_CHECK(cudaMallocAsync(&l.prefix_kv, size_t(prefix_rows_ * row_floats) * sizeof(float), s));
    const ncclComm_t comm = channel_->get();
    KILTER_NCCL_CHECK(ncclGroupStart(), comm);
    for (const KvPeer& peer : schedule_.earlier)
      for (const KvRun& run : peer.runs)
        KILTER_NCCL_CHECK(ncclRecv(l.prefix_kv + (prefix_base_[size_t(run.piece)] + run.row) * row_floats,
                                   size_t(run.rows * row_floats), ncclFloat32, peer.rank, comm, s),
                          comm);
    const float* in = send;
    for (const KvPeer& peer : schedule_.later)
      for (const KvRun& run : peer.runs) {
        KILTER_NCCL_CHECK(ncclSend(in, size_t(run.rows * row_floats), ncclFloat32, peer.rank, comm, s), comm);
        in += int64_t(run.rows) * row_floats;
      }
    KILTER_NCCL_CHECK(ncclGroupEnd(), comm);
    if (send) KILTER_CUDA_CHECK(cudaFreeAsync(send, s));
    KILTER_CUDA_CHECK(cudaEventRecord(l.forward_done, s));
  }

  void forward_wait(int layer) override {
    Layer& l = at(layer);
    KILTER_CHECK(l.forward_posted, "K/V exchange: forward_wait(" << layer << ") before forward_send");
    timed_wait(layer, false, l.forward_done, schedule_.earlier);
    KILTER_CUDA_CHECK(cudaStreamWaitEvent(compute_, l.forward_done, 0));
    l.forward_done_waited = true;
  }

  const float* prefix_kv(int layer, int piece) override {
    Layer& l = at(layer);
    KILTER_CHECK(l.forward_done_waited && l.prefix_kv != nullptr && has_prefix(piece),
                 "K/V exchange: prefix_kv(" << layer << ", " << piece << ") outside forward_wait..backward_wait_add");
    return l.prefix_kv + prefix_base_[size_t(piece)] * rows_.kv_width;
  }

  float* prefix_dkv(int layer, int piece) override {
    Layer& l = at(layer);
    KILTER_CHECK(!l.backward_posted && has_prefix(piece),
                 "K/V exchange: prefix_dkv(" << layer << ", " << piece << ") after backward_send or without a prefix");
    if (!l.prefix_dkv) {
      const size_t bytes = size_t(prefix_rows_ * rows_.kv_width) * sizeof(float);
      KILTER_CUDA_CHECK(cudaMallocAsync(&l.prefix_dkv, bytes, compute_));
      KILTER_CUDA_CHECK(cudaMemsetAsync(l.prefix_dkv, 0, bytes, compute_));
    }
    return l.prefix_dkv + prefix_base_[size_t(piece)] * rows_.kv_width;
  }

  void backward_send(int layer) override {
    Layer& l = at(layer);
    KILTER_CHECK(l.forward_done_waited && !l.backward_posted,
                 "K/V exchange: backward_send(" << layer << ") out of order");
    l.backward_posted = true;
    const cudaStream_t s = after_compute();
    const int64_t row_floats = rows_.kv_width;
    if (prefix_rows_ > 0 && !l.prefix_dkv) {
      // A backend that wrote no prefix gradient still sends zeros: the owners wait for them.
      const size_t bytes = size_t(prefix_rows_ * row_floats) * sizeof(float);
      KILTER_CUDA_CHECK(cudaMallocAsync(&l.prefix_dkv, bytes, s));
      KILTER_CUDA_CHECK(cudaMemsetAsync(l.prefix_dkv, 0, bytes, s));
    }
    if (later_rows_ > 0)
      KILTER_CUDA_CHECK(cudaMallocAsync(&l.recv_dkv, size_t(later_rows_ * row_floats) * sizeof(float), s));
    const ncclComm_t comm = channel_->get();
    KILTER_NCCL_CHECK(ncclGroupStart(), comm);
    for (size_t i = 0; i < schedule_.later.size(); ++i) {
      float* out = l.recv_dkv + later_offset_[i] * row_floats;
      for (const KvRun& run : schedule_.later[i].runs) {
        KILTER_NCCL_CHECK(
            ncclRecv(out, size_t(run.rows * row_floats), ncclFloat32, schedule_.later[i].rank, comm, s), comm);
        out += int64_t(run.rows) * row_floats;
      }
    }
    for (const KvPeer& peer : schedule_.earlier)
      for (const KvRun& run : peer.runs)
        KILTER_NCCL_CHECK(ncclSend(l.prefix_dkv + (prefix_base_[size_t(run.piece)] + run.row) * row_floats,
                                   size_t(run.rows * row_floats), ncclFloat32, peer.rank, comm, s),
                          comm);
    KILTER_NCCL_CHECK(ncclGroupEnd(), comm);
    if (l.prefix_dkv) {
      KILTER_CUDA_CHECK(cudaFreeAsync(l.prefix_dkv, s));
      l.prefix_dkv = nullptr;
    }
    KILTER_CUDA_CHECK(cudaEventRecord(l.backward_done, s));
  }

  void backward_wait_add(int layer, float* dqkv) override {
    Layer& l = at(layer);
    KILTER_CHECK(l.backward_posted && !l.backward_done_waited,
                 "K/V exchange: backward_wait_add(" << layer << ") out of order");
    timed_wait(layer, true, l.backward_done, schedule_.later);
    l.backward_done_waited = true;
    KILTER_CUDA_CHECK(cudaStreamWaitEvent(compute_, l.backward_done, 0));
    const float* in = l.recv_dkv;
    for (const KvPeer& peer : schedule_.later)
      for (const KvRun& run : peer.runs) {
        const unsigned threads = 256;
        add_kv_rows_kernel<<<backend::grid_for(size_t(run.rows) * rows_.kv_width, threads), threads, 0, compute_>>>(
            dqkv + int64_t(run.row) * rows_.row_width, in, run.rows, rows_);
        KILTER_CUDA_LAUNCH_CHECK();
        in += int64_t(run.rows) * rows_.kv_width;
      }
    // Valid until now (kv_exchange.h): freed after the compute stream's last use.
    if (l.recv_dkv) KILTER_CUDA_CHECK(cudaFreeAsync(l.recv_dkv, compute_));
    if (l.prefix_kv) KILTER_CUDA_CHECK(cudaFreeAsync(l.prefix_kv, compute_));
    l.recv_dkv = nullptr;
    l.prefix_kv = nullptr;
  }

  void finish() override {
    for (size_t layer = 0; layer < layers_.size(); ++layer)
      KILTER_CHECK(!layers_[layer].forward_posted || layers_[layer].backward_done_waited,
                   "K/V exchange: finish() before backward_wait_add(" << layer << ")");
    // Every send of this micro-batch was in a group whose completion some wait saw, except the
    // last layers' sends to peers we never wait on: drain the channel's stream.
    KILTER_CUDA_CHECK(cudaEventRecord(ready_, channel_->stream()));
    channel_->wait(ready_, [&]() {
      return "K/V exchange: step " + std::to_string(schedule_.step) + ", micro-batch " +
             std::to_string(schedule_.slot) + ": rank " + std::to_string(channel_->rank()) +
             "'s last sends did not complete within comm.timeout_s; check the other ranks' logs";
    });
  }

  const KvSchedule& schedule() const override { return schedule_; }
  double wait_seconds() const override { return wait_seconds_; }

 private:
  struct Layer {
    float* prefix_kv = nullptr;
    float* prefix_dkv = nullptr;
    float* recv_dkv = nullptr;
    cudaEvent_t forward_done = nullptr, backward_done = nullptr;
    bool forward_posted = false, forward_done_waited = false, backward_posted = false, backward_done_waited = false;
  };

  Layer& at(int layer) {
    KILTER_CHECK(layer >= 0 && size_t(layer) < layers_.size(), "K/V exchange: layer " << layer);
    return layers_[size_t(layer)];
  }
  bool has_prefix(int piece) const {
    return piece >= 0 && size_t(piece) < schedule_.pieces.size() && schedule_.pieces[size_t(piece)].offset > 0;
  }
  // The channel's stream, made to wait for the work queued so far on the compute stream.
  cudaStream_t after_compute() {
    KILTER_CUDA_CHECK(cudaEventRecord(ready_, compute_));
    KILTER_CUDA_CHECK(cudaStreamWaitEvent(channel_->stream(), ready_, 0));
    return channel_->stream();
  }
  // Waits for a layer's group; a timeout names every peer of the direction (NCCL does not say
  // which of a group's operations is missing).
  void timed_wait(int layer, bool backward, cudaEvent_t done, const std::vector<KvPeer>& peers) {
    const int64_t begin = now_ns();
    std::vector<int> all;
    for (size_t i = 0; i < peers.size(); ++i) all.push_back(int(i));
    channel_->wait(done, [&]() {
      return describe_missing_kv(schedule_, channel_->rank(), layer, backward, all, channel_->timeout_s());
    });
    const int64_t end = now_ns();
    wait_seconds_ += double(end - begin) * 1e-9;
    // A group completes as one: its last peer stands for it.
    if (opts_.on_wait && !peers.empty())
      opts_.on_wait(kv_wait_event(layer, backward, begin, end, peers, int(peers.size()) - 1));
  }
  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  std::shared_ptr<NcclKvChannel> channel_;
  KvSchedule schedule_;
  KvExchangeOptions opts_;
  model::KvRowLayout rows_;  // where K and V sit in the q|k|v rows
  cudaStream_t compute_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  std::vector<int64_t> prefix_base_, later_offset_;
  int64_t prefix_rows_ = 0, later_rows_ = 0;
  std::vector<Layer> layers_;
  double wait_seconds_ = 0;
};

}  // namespace

std::shared_ptr<NcclKvChannel> make_nccl_kv_channel(MPI_Comm comm, double timeout_s) {
  return std::make_shared<NcclKvChannel>(comm, timeout_s);
}

std::unique_ptr<CutExchange> make_nccl_kv_exchange(std::shared_ptr<NcclKvChannel> channel, KvSchedule schedule,
                                                   const KvExchangeOptions& opts) {
  return std::make_unique<NcclKvExchange>(std::move(channel), std::move(schedule), opts);
}

}  // namespace kilter::comm
