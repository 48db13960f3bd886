// Fully sharded parameters on a CUDA device over NCCL (param_shards_nccl.h).
#include "lib/train/param_shards_nccl.h"

#include <chrono>
#include <sstream>
#include <string>
#include <vector>

#include "io/base/cuda_common.h"
#include "io/base/cuda_device.h"
#include "lib/comm/nccl_util.h"
#include "lib/comm/unit_chunks.h"
#include "lib/train/watchdog.h"

namespace kilter::train {

namespace {

class NcclParamShards final : public UnitShards {
 public:
  NcclParamShards(MPI_Comm group, MPI_Comm replicas, const model::ParamLayout& layout, float* params, float* grads,
                  bool reshard_after_forward, double timeout_s);
  ~NcclParamShards() override;

  // UnitShards
  void release_all() override;

  // model::ParamUnitHooks
  bool need(int unit) override;
  void prefetch(int unit) override;
  void forward_done(int unit) override;
  void grads_final(int unit) override;
  void pass_done() override;

  // comm::GradientReducer: the reduction happened unit by unit.
  void begin() override {}
  void ready(size_t, size_t) override {}
  double finish() override;
  std::vector<comm::BufferRange> owned() const override;
  void gather(float*) override {}

 private:
  enum class State { released, gathering, gathered };
  // Queues the unit's all-gather on the group's stream (its staging buffer, then into params).
  void gather_unit(int unit);
  void release_params(int unit);
  void clear_outside(float* buffer, int unit, cudaStream_t stream);
  // The group's stream, after what the compute stream has queued so far.
  cudaStream_t comm_after_compute(comm::NcclComm& nccl);
  // The compute stream, after what `nccl`'s stream has queued so far.
  void compute_after(comm::NcclComm& nccl, cudaEvent_t event);
  // Waits, bounded by comm.timeout_s and inside a watchdog section, for `nccl`'s queued work.
  void wait_for(comm::NcclComm& nccl, const char* what);
  comm::NcclFailureMessage failure_message(const comm::NcclComm& nccl, const char* what) const;
  int num_units() const { return chunks_.num_units(); }

  comm::UnitChunks chunks_;
  comm::NcclComm group_;
  std::unique_ptr<comm::NcclComm> replicas_;  // null: the group is the world
  float* params_ = nullptr;
  float* grads_ = nullptr;
  bool reshard_after_forward_ = true;
  cudaStream_t compute_ = nullptr;
  std::vector<State> state_;
  std::vector<cudaEvent_t> gathered_;   // per unit: its gather's copy into params is done
  std::vector<cudaEvent_t> reduced_;    // per unit: its reduce-scatter's copy into grads is done
  std::vector<bool> reduce_pending_;    // the compute stream has not waited on reduced_ yet
  cudaEvent_t compute_ready_ = nullptr, comm_done_ = nullptr;
  float* staging_ = nullptr;  // G * chunk floats of the largest unit, then one chunk (the scatter's result)
  float* scatter_ = nullptr;
};

NcclParamShards::NcclParamShards(MPI_Comm group, MPI_Comm replicas, const model::ParamLayout& layout, float* params,
                                 float* grads, bool reshard_after_forward, double timeout_s)
    : chunks_(comm::UnitChunks::of(layout, [group] {
        int size = 1;
        MPI_Comm_size(group, &size);
        return size;
      }(), [group] {
        int rank = 0;
        MPI_Comm_rank(group, &rank);
        return rank;
      }())),
      // The watchdog brackets every wait and fires first, after timeout_s, naming the ranks that
      // did not arrive; the communicators' own bound is the backstop.
      group_(group, 2 * timeout_s, "parameter shards (train.shard = parameters)"),
      params_(params), grads_(grads), reshard_after_forward_(reshard_after_forward) {
  if (replicas != MPI_COMM_NULL)
    replicas_ =
        std::make_unique<comm::NcclComm>(replicas, 2 * timeout_s, "parameter shard replicas (train.shard_group)");
  KILTER_CUDA_CHECK(cudaSetDevice(group_.device()));
  compute_ = backend::cuda_compute_stream();
  const size_t units = size_t(num_units());
  state_.assign(units, State::released);
  reduce_pending_.assign(units, false);
  gathered_.assign(units, nullptr);
  reduced_.assign(units, nullptr);
  for (size_t u = 0; u < units; ++u) {
    KILTER_CUDA_CHECK(cudaEventCreateWithFlags(&gathered_[u], cudaEventDisableTiming));
    KILTER_CUDA_CHECK(cudaEventCreateWithFlags(&reduced_[u], cudaEventDisableTiming));
  }
  KILTER_CUDA_CHECK(cudaEventCreateWithFlags(&compute_ready_, cudaEventDisableTiming));
  KILTER_CUDA_CHECK(cudaEventCreateWithFlags(&comm_done_, cudaEventDisableTiming));
  const size_t staging = chunks_.staging_floats(), chunk = chunks_.largest_chunk();
  const cudaError_t status = cudaMalloc(&staging_, sizeof(float) * (staging + chunk));
  KILTER_CHECK(status == cudaSuccess, "train.shard = parameters: no device memory for the gather staging ("
                                          << sizeof(float) * (staging + chunk) << " bytes) on device "
                                          << group_.device() << ": " << cudaGetErrorString(status));
  scatter_ = staging_ + staging;
}

NcclParamShards::~NcclParamShards() {
  cudaStreamSynchronize(group_.stream());
  if (replicas_) cudaStreamSynchronize(replicas_->stream());
  cudaFree(staging_);
  for (cudaEvent_t e : gathered_) cudaEventDestroy(e);
  for (cudaEvent_t e : reduced_) cudaEventDestroy(e);
  cudaEventDestroy(compute_ready_);
  cudaEventDestroy(comm_done_);
}

comm::NcclFailureMessage NcclParamShards::failure_message(const comm::NcclComm& nccl, const char* what) const {
  return [&nccl, what, this](const std::string& cause) {
    std::ostringstream message;
    message << "NCCL " << what << " (train.shard = parameters, step " << step_ << ")";
    if (cause.empty())
      message << " did not complete within comm.timeout_s=" << nccl.timeout_s() << " s on rank " << nccl.rank()
              << " of " << nccl.size() << " (device " << nccl.device()
              << "): another rank is stuck or gone; communicator aborted";
    else
      message << " failed on rank " << nccl.rank() << " of " << nccl.size() << ": " << cause
              << "; communicator aborted";
    return message.str();
  };
}

cudaStream_t NcclParamShards::comm_after_compute(comm::NcclComm& nccl) {
  KILTER_CHECK(!nccl.aborted(), "train.shard = parameters: the NCCL communicator was aborted after an earlier failure");
  KILTER_CUDA_CHECK(cudaSetDevice(nccl.device()));
  KILTER_CUDA_CHECK(cudaEventRecord(compute_ready_, compute_));
  KILTER_CUDA_CHECK(cudaStreamWaitEvent(nccl.stream(), compute_ready_, 0));
  return nccl.stream();
}

void NcclParamShards::compute_after(comm::NcclComm& nccl, cudaEvent_t event) {
  KILTER_CUDA_CHECK(cudaEventRecord(event, nccl.stream()));
  KILTER_CUDA_CHECK(cudaStreamWaitEvent(compute_, event, 0));
}

void NcclParamShards::wait_for(comm::NcclComm& nccl, const char* what) {
  KILTER_CUDA_CHECK(cudaEventRecord(comm_done_, nccl.stream()));
  if (watchdog_) watchdog_->enter(what, step_);
  try {
    nccl.wait(comm_done_, failure_message(nccl, what));
  } catch (...) {
    if (watchdog_) watchdog_->leave();
    throw;
  }
  if (watchdog_) watchdog_->leave();
}

void NcclParamShards::clear_outside(float* buffer, int unit, cudaStream_t stream) {
  for (const model::ParamRange& r : chunks_.outside(unit))
    KILTER_CUDA_CHECK(cudaMemsetAsync(buffer + r.offset, 0, sizeof(float) * r.count, stream));
}

void NcclParamShards::gather_unit(int unit) {
  const comm::UnitChunk& c = chunks_.unit(unit);
  const int rank = chunks_.rank();
  const cudaStream_t stream = comm_after_compute(group_);
  // This rank's part into its slot of the staging buffer (the slot's tail past the unit is never
  // read back), everyone's slots gathered, the unit copied into place.
  float* slot = staging_ + size_t(rank) * c.chunk;
  if (c.part(rank) > 0)
    KILTER_CUDA_CHECK(cudaMemcpyAsync(slot, params_ + c.offset + c.lo(rank), sizeof(float) * c.part(rank),
                                      cudaMemcpyDeviceToDevice, stream));
  KILTER_NCCL_CHECK(ncclAllGather(slot, staging_, c.chunk, ncclFloat32, group_.get(), stream), group_.get());
  KILTER_CUDA_CHECK(cudaMemcpyAsync(params_ + c.offset, staging_, sizeof(float) * c.count, cudaMemcpyDeviceToDevice,
                                    stream));
  KILTER_CUDA_CHECK(cudaEventRecord(gathered_[size_t(unit)], stream));
  state_[size_t(unit)] = State::gathering;
}

void NcclParamShards::prefetch(int unit) {
  if (unit < 0 || unit >= num_units() || state_[size_t(unit)] != State::released) return;
  gather_unit(unit);
}

bool NcclParamShards::need(int unit) {
  if (unit < 0 || unit >= num_units()) return false;
  const size_t u = size_t(unit);
  // The unit's gradients are written by this pass's backward only after the last reduce-scatter
  // of them has read them and cleared the rest.
  if (reduce_pending_[u]) {
    KILTER_CUDA_CHECK(cudaStreamWaitEvent(compute_, reduced_[u], 0));
    reduce_pending_[u] = false;
  }
  if (state_[u] == State::gathered) return false;
  if (state_[u] == State::released) gather_unit(unit);
  KILTER_CUDA_CHECK(cudaStreamWaitEvent(compute_, gathered_[u], 0));
  state_[u] = State::gathered;
  return true;
}

void NcclParamShards::release_params(int unit) {
  if (unit < 0 || unit >= num_units() || state_[size_t(unit)] == State::released) return;
  // A prefetched unit nobody used: its copy into params must land before the clearing.
  if (state_[size_t(unit)] == State::gathering)
    KILTER_CUDA_CHECK(cudaStreamWaitEvent(compute_, gathered_[size_t(unit)], 0));
  clear_outside(params_, unit, compute_);
  state_[size_t(unit)] = State::released;
}

void NcclParamShards::forward_done(int unit) {
  // The embeddings (a tied head reads them) and the final unit stay for the head and the backward.
  if (reshard_after_forward_ && unit > 0 && unit < num_units() - 1) release_params(unit);
}

void NcclParamShards::grads_final(int unit) {
  const comm::UnitChunk& c = chunks_.unit(unit);
  const int rank = chunks_.rank(), size = chunks_.group_size();
  const cudaStream_t stream = comm_after_compute(group_);
  // The chunk already holds the earlier micro-batches' reduced sum (plus this rank's new part), the
  // rest of the unit only this micro-batch's: the sum over ranks adds the others' new parts to it.
  // Padded to G equal slots in the staging buffer (zeros past the unit).
  KILTER_CUDA_CHECK(cudaMemcpyAsync(staging_, grads_ + c.offset, sizeof(float) * c.count, cudaMemcpyDeviceToDevice,
                                    stream));
  const size_t padded = c.chunk * size_t(size);
  if (padded > c.count)
    KILTER_CUDA_CHECK(cudaMemsetAsync(staging_ + c.count, 0, sizeof(float) * (padded - c.count), stream));
  KILTER_NCCL_CHECK(ncclReduceScatter(staging_, scatter_, c.chunk, ncclFloat32, ncclSum, group_.get(), stream),
                    group_.get());
  if (c.part(rank) > 0)
    KILTER_CUDA_CHECK(cudaMemcpyAsync(grads_ + c.offset + c.lo(rank), scatter_, sizeof(float) * c.part(rank),
                                      cudaMemcpyDeviceToDevice, stream));
  clear_outside(grads_, unit, stream);
  KILTER_CUDA_CHECK(cudaEventRecord(reduced_[size_t(unit)], stream));
  reduce_pending_[size_t(unit)] = true;
  // The backward kept the unit above (its norm may be read again); the embeddings end the pass.
  release_params(unit + 1);
  if (unit == 0) release_params(0);
}

void NcclParamShards::pass_done() {
  for (int u = 0; u < num_units(); ++u) release_params(u);
  // The host meets the group once per pass, bounded: a rank that died or stalls inside a gather or
  // a reduce-scatter is noticed here (and named by the watchdog), not in a later device wait.
  wait_for(group_, "parameter all-gather / gradient reduce-scatter");
}

void NcclParamShards::release_all() {
  for (int u = 0; u < num_units(); ++u) {
    const size_t i = size_t(u);
    if (state_[i] == State::gathering) KILTER_CUDA_CHECK(cudaStreamWaitEvent(compute_, gathered_[i], 0));
    if (reduce_pending_[i]) KILTER_CUDA_CHECK(cudaStreamWaitEvent(compute_, reduced_[i], 0));
    reduce_pending_[i] = false;
    clear_outside(params_, u, compute_);
    clear_outside(grads_, u, compute_);
    state_[i] = State::released;
  }
}

double NcclParamShards::finish() {
  const auto start = std::chrono::steady_clock::now();
  for (int u = 0; u < num_units(); ++u) {
    if (!reduce_pending_[size_t(u)]) continue;
    KILTER_CUDA_CHECK(cudaStreamWaitEvent(compute_, reduced_[size_t(u)], 0));
    reduce_pending_[size_t(u)] = false;
  }
  if (!replicas_) return 0.0;
  // HSDP: each chunk's step sum across the groups (the ranks of this index in every group).
  const cudaStream_t stream = comm_after_compute(*replicas_);
  KILTER_NCCL_CHECK(ncclGroupStart(), replicas_->get());
  for (const comm::BufferRange& r : owned())
    KILTER_NCCL_CHECK(ncclAllReduce(grads_ + r.offset, grads_ + r.offset, r.count, ncclFloat32, ncclSum,
                                    replicas_->get(), stream),
                      replicas_->get());
  KILTER_NCCL_CHECK(ncclGroupEnd(), replicas_->get());
  compute_after(*replicas_, comm_done_);
  wait_for(*replicas_, "gradient chunk all-reduce across the shard groups");
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::vector<comm::BufferRange> NcclParamShards::owned() const {
  std::vector<comm::BufferRange> ranges;
  for (const model::ParamRange& r : chunks_.owned()) ranges.push_back({r.offset, r.count});
  return ranges;
}

}  // namespace

std::unique_ptr<UnitShards> make_nccl_param_shards(MPI_Comm group, MPI_Comm replicas, const model::ParamLayout& layout,
                                                   float* params, float* grads, bool reshard_after_forward,
                                                   double timeout_s) {
  return std::make_unique<NcclParamShards>(group, replicas, layout, params, grads, reshard_after_forward, timeout_s);
}

}  // namespace kilter::train
