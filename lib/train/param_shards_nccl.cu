// Fully sharded parameters on a CUDA device over NCCL (param_shards_nccl.h).
#include "lib/train/param_shards_nccl.h"

#include <algorithm>
#include <chrono>
#include <sstream>
#include <string>
#include <vector>

#include "io/base/cuda_common.h"
#include "io/base/cuda_device.h"
#include "io/base/cuda_virtual_buffer.h"
#include "lib/comm/nccl_util.h"
#include "lib/comm/unit_chunks.h"
#include "lib/comm/unit_pages.h"
#include "lib/train/watchdog.h"

namespace kilter::train {

namespace {

class NcclParamShards final : public UnitShards {
 public:
  NcclParamShards(MPI_Comm group, MPI_Comm replicas, const model::ParamLayout& layout, bool reshard_after_forward,
                  double timeout_s);
  ~NcclParamShards() override;

  // UnitShards
  void release_all() override;

  // model::ParamUnitHooks
  bool need(int unit) override;
  void prefetch(int unit) override;
  void forward_done(int unit) override;
  void grads_final(int unit) override;
  void pass_done() override;
  float* params_storage() override { return params_; }
  float* grads_storage() override { return grads_; }
  void* working_copy_storage(size_t element_bytes, const std::vector<model::ParamRange>& fp32_ranges) override;

  // comm::GradientReducer: the reduction happened unit by unit.
  double finish() override;
  std::vector<comm::BufferRange> owned() const override;

 private:
  enum class State { released, gathering, gathered };
  // Queues the unit's all-gather on the group's stream (its staging buffer, then into place: the
  // working copy where the model has one, else the parameters).
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
  // ---- the sparsely backed buffers: a unit's pages are held from its gather (parameters) or its
  // backward (gradients) until its release; a released unit's pages are given back once the
  // device is past the event recorded at the release (reap), the host waiting for the oldest
  // release only where the pages backed would pass the budget.
  struct Backed {
    backend::VirtualDeviceBuffer buffer;
    comm::PageRefs refs;
    size_t budget = 0;  // pages backed at most before a hold waits for a release to land
    Backed(size_t bytes, const char* what);
  };
  struct Retired {
    Backed* backed;
    comm::PageSpan span;
    cudaEvent_t event;
  };
  // What a gather fills: the working copy where the model asked for one, else the parameters.
  Backed& gathered_mem() { return copy_mem_ ? *copy_mem_ : *params_mem_; }
  size_t element_bytes(const Backed& b) const { return &b == copy_mem_.get() ? copy_element_ : sizeof(float); }
  comm::PageSpan unit_pages(const Backed& b, int unit) const;
  std::vector<comm::PageSpan> unit_spans(const Backed& b) const;
  void hold(Backed& b, comm::PageSpan span);
  // The unit's pages go back once `stream` has passed this point.
  void retire(Backed& b, int unit, cudaStream_t stream);
  // Gives back the pages of the releases the device has passed (every release: wait for them).
  void reap(bool wait_all);
  // The unit's parameters (and their working copy) get pages / go back after `stream`.
  void hold_params(int unit);
  void drop_params(int unit, cudaStream_t stream);
  void hold_grads(int unit);
  void drop_grads(int unit, cudaStream_t stream);

  comm::UnitChunks chunks_;
  comm::NcclComm group_;
  std::unique_ptr<comm::NcclComm> replicas_;  // null: the group is the world
  std::unique_ptr<Backed> params_mem_, grads_mem_;
  // The model's working copy, where it has one: then the units gather it alone (2 bytes an
  // element), and params_mem_ backs only the fp32 ranges the model derives from it.
  std::unique_ptr<Backed> copy_mem_;
  size_t copy_element_ = 0;
  size_t padded_ = 0;  // the layout's padded floats
  float* params_ = nullptr;  // params_mem_'s range
  float* grads_ = nullptr;   // grads_mem_'s range
  std::vector<Retired> retired_;
  std::vector<cudaEvent_t> spare_events_;
  std::vector<bool> params_held_, grads_held_;
  std::vector<int> needs_;  // need() calls this pass: the second is the unit's backward
  bool reshard_after_forward_ = true;
  cudaStream_t compute_ = nullptr;
  std::vector<State> state_;
  std::vector<cudaEvent_t> gathered_;   // per unit: its gather's copy into params is done
  std::vector<cudaEvent_t> reduced_;    // per unit: its reduce-scatter's copy into grads is done
  std::vector<bool> reduce_pending_;    // the compute stream has not waited on reduced_ yet
  cudaEvent_t compute_ready_ = nullptr, comm_done_ = nullptr;
  // G * chunk floats of the largest unit, then one chunk (the scatter's result); a working copy's
  // gather uses its first G * chunk elements.
  float* staging_ = nullptr;
  float* scatter_ = nullptr;
};

NcclParamShards::Backed::Backed(size_t bytes, const char* what)
    : buffer(bytes, what), refs(buffer.pages()) {}

NcclParamShards::NcclParamShards(MPI_Comm group, MPI_Comm replicas, const model::ParamLayout& layout,
                                 bool reshard_after_forward, double timeout_s)
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
      reshard_after_forward_(reshard_after_forward) {
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
  padded_ = layout.padded_size;
  params_held_.assign(units, false);
  grads_held_.assign(units, false);
  needs_.assign(units, 0);
  // The whole padded buffers as virtual ranges; this rank's chunks backed for good (zeros).
  params_mem_ = std::make_unique<Backed>(sizeof(float) * layout.padded_size, "sharded parameters");
  grads_mem_ = std::make_unique<Backed>(sizeof(float) * layout.padded_size, "sharded gradients");
  params_ = static_cast<float*>(params_mem_->buffer.data());
  grads_ = static_cast<float*>(grads_mem_->buffer.data());
  for (const model::ParamRange& r : chunks_.owned()) {
    const comm::PageSpan span =
        comm::covering_pages(r.offset, r.count, sizeof(float), params_mem_->buffer.page_bytes());
    hold(*params_mem_, span);
    hold(*grads_mem_, span);
    KILTER_CUDA_CHECK(cudaMemsetAsync(params_ + r.offset, 0, sizeof(float) * r.count, compute_));
    KILTER_CUDA_CHECK(cudaMemsetAsync(grads_ + r.offset, 0, sizeof(float) * r.count, compute_));
  }
  // Beyond the chunks: at most unit_page_budget's pages.
  const comm::PageBudget budget = comm::unit_page_budget(unit_spans(*params_mem_), !reshard_after_forward_);
  params_mem_->budget = params_mem_->refs.held() + budget.params;
  grads_mem_->budget = grads_mem_->refs.held() + budget.grads;
  KILTER_CUDA_CHECK(cudaStreamSynchronize(compute_));
}

comm::PageSpan NcclParamShards::unit_pages(const Backed& b, int unit) const {
  const comm::UnitChunk& c = chunks_.unit(unit);
  return comm::covering_pages(c.offset, c.count, element_bytes(b), b.buffer.page_bytes());
}

std::vector<comm::PageSpan> NcclParamShards::unit_spans(const Backed& b) const {
  std::vector<comm::PageSpan> spans;
  for (int u = 0; u < num_units(); ++u) spans.push_back(unit_pages(b, u));
  return spans;
}

void* NcclParamShards::working_copy_storage(size_t element_bytes, const std::vector<model::ParamRange>& fp32_ranges) {
  KILTER_CHECK(element_bytes == 2, "sharded parameters: the working copy gathered is bf16 (2-byte elements), not "
                                       << element_bytes << "-byte ones");
  KILTER_CHECK(!copy_mem_, "sharded parameters: a second working copy asked for");
  KILTER_CHECK(std::find(params_held_.begin(), params_held_.end(), true) == params_held_.end(),
               "sharded parameters: the working copy asked for after a gather");
  KILTER_CUDA_CHECK(cudaSetDevice(group_.device()));
  KILTER_CUDA_CHECK(cudaStreamSynchronize(compute_));  // the chunks' zeroing is done before their pages go
  copy_element_ = element_bytes;
  copy_mem_ = std::make_unique<Backed>(element_bytes * padded_, "sharded parameters' working copy");
  char* copy = static_cast<char*>(copy_mem_->buffer.data());
  // The copy's chunks are backed for good (the model's optimizer writes them from its master),
  // zeros until the model's first write.
  const size_t page = copy_mem_->buffer.page_bytes();
  for (const model::ParamRange& r : chunks_.owned()) {
    hold(*copy_mem_, comm::covering_pages(r.offset, r.count, element_bytes, page));
    KILTER_CUDA_CHECK(cudaMemsetAsync(copy + element_bytes * r.offset, 0, element_bytes * r.count, compute_));
  }
  copy_mem_->budget =
      copy_mem_->refs.held() + comm::unit_page_budget(unit_spans(*copy_mem_), !reshard_after_forward_).params;
  // The fp32 parameters: no chunk (the master is the model's) and no unit, only the model's fp32
  // ranges, for good; the chunks' pages go back to the device, not to the pool.
  const size_t fp32_page = params_mem_->buffer.page_bytes();
  for (const model::ParamRange& r : fp32_ranges)
    hold(*params_mem_, comm::covering_pages(r.offset, r.count, sizeof(float), fp32_page));
  for (const model::ParamRange& r : chunks_.owned())
    for (const comm::PageSpan& run :
         params_mem_->refs.drop(comm::covering_pages(r.offset, r.count, sizeof(float), fp32_page)))
      params_mem_->buffer.unback(run.first, run.end);
  params_mem_->buffer.trim_pool(0);
  params_mem_->budget = params_mem_->refs.held();
  KILTER_CUDA_CHECK(cudaStreamSynchronize(compute_));
  return copy;
}

void NcclParamShards::hold_params(int unit) {
  if (params_held_[size_t(unit)]) return;
  Backed& into = gathered_mem();
  hold(into, unit_pages(into, unit));
  params_held_[size_t(unit)] = true;
}

void NcclParamShards::drop_params(int unit, cudaStream_t stream) {
  if (!params_held_[size_t(unit)]) return;
  retire(gathered_mem(), unit, stream);
  params_held_[size_t(unit)] = false;
}

void NcclParamShards::hold(Backed& b, comm::PageSpan span) {
  reap(false);
  // The release the device has not reached yet, oldest first, until the new pages fit.
  while (b.refs.held() + span.count() > b.budget) {
    auto oldest = std::find_if(retired_.begin(), retired_.end(), [&b](const Retired& r) { return r.backed == &b; });
    if (oldest == retired_.end()) break;  // the schedule holds more than the budget: back them anyway
    KILTER_CUDA_CHECK(cudaEventSynchronize(oldest->event));
    reap(false);
  }
  for (const comm::PageSpan& run : b.refs.hold(span)) b.buffer.back(run.first, run.end);
}

void NcclParamShards::retire(Backed& b, int unit, cudaStream_t stream) {
  cudaEvent_t event = nullptr;
  if (spare_events_.empty()) {
    KILTER_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  } else {
    event = spare_events_.back();
    spare_events_.pop_back();
  }
  KILTER_CUDA_CHECK(cudaEventRecord(event, stream));
  retired_.push_back({&b, unit_pages(b, unit), event});
}

void NcclParamShards::reap(bool wait_all) {
  std::vector<Retired> waiting;
  for (const Retired& r : retired_) {
    if (wait_all) KILTER_CUDA_CHECK(cudaEventSynchronize(r.event));
    const cudaError_t done = cudaEventQuery(r.event);
    if (done == cudaErrorNotReady) {
      waiting.push_back(r);
      continue;
    }
    KILTER_CUDA_CHECK(done);
    for (const comm::PageSpan& run : r.backed->refs.drop(r.span)) r.backed->buffer.unback(run.first, run.end);
    spare_events_.push_back(r.event);
  }
  retired_.swap(waiting);
}

void NcclParamShards::hold_grads(int unit) {
  const size_t u = size_t(unit);
  if (grads_held_[u]) return;
  // The unit's gradients are written by this pass's backward only after the last reduce-scatter
  // of them has read them.
  if (reduce_pending_[u]) {
    KILTER_CUDA_CHECK(cudaStreamWaitEvent(compute_, reduced_[u], 0));
    reduce_pending_[u] = false;
  }
  hold(*grads_mem_, unit_pages(*grads_mem_, unit));
  clear_outside(grads_, unit, compute_);  // fresh pages hold anything; the chunk keeps its sum
  grads_held_[u] = true;
}

void NcclParamShards::drop_grads(int unit, cudaStream_t stream) {
  if (!grads_held_[size_t(unit)]) return;
  retire(*grads_mem_, unit, stream);
  grads_held_[size_t(unit)] = false;
}

NcclParamShards::~NcclParamShards() {
  cudaStreamSynchronize(group_.stream());
  if (replicas_) cudaStreamSynchronize(replicas_->stream());
  cudaStreamSynchronize(compute_);
  for (const Retired& r : retired_) cudaEventDestroy(r.event);
  for (cudaEvent_t e : spare_events_) cudaEventDestroy(e);
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
  hold_params(unit);
  const cudaStream_t stream = comm_after_compute(group_);
  // The working copy where the model has one (bf16, half the bytes: no fp32 page of the unit is
  // backed), else the fp32 parameters. This rank's part into its slot of the staging buffer (the
  // slot's tail past the unit is never read back), everyone's slots gathered, the unit copied
  // into place.
  Backed& into = gathered_mem();
  const size_t element = element_bytes(into);
  const ncclDataType_t type = element == sizeof(float) ? ncclFloat32 : ncclBfloat16;
  char* base = static_cast<char*>(into.buffer.data());
  char* staging = reinterpret_cast<char*>(staging_);
  char* slot = staging + element * size_t(rank) * c.chunk;
  if (c.part(rank) > 0)
    KILTER_CUDA_CHECK(cudaMemcpyAsync(slot, base + element * (c.offset + c.lo(rank)), element * c.part(rank),
                                      cudaMemcpyDeviceToDevice, stream));
  KILTER_NCCL_CHECK(ncclAllGather(slot, staging, c.chunk, type, group_.get(), stream), group_.get());
  KILTER_CUDA_CHECK(
      cudaMemcpyAsync(base + element * c.offset, staging, element * c.count, cudaMemcpyDeviceToDevice, stream));
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
  // The second need of a pass is the unit's backward: its gradients get pages (the embeddings'
  // with the final unit's, which a tied head's backward writes first).
  if (++needs_[u] >= 2) {
    if (unit == num_units() - 1) hold_grads(0);
    hold_grads(unit);
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
  // The pages go back once the compute stream is past the unit; gradients held but not written
  // (a release inside the forward) with them.
  drop_params(unit, compute_);
  if (!reduce_pending_[size_t(unit)]) drop_grads(unit, compute_);
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
  KILTER_CUDA_CHECK(cudaEventRecord(reduced_[size_t(unit)], stream));
  reduce_pending_[size_t(unit)] = true;
  drop_grads(unit, stream);  // the next backward clears what is outside the chunk again
  // The backward kept the unit above (its norm may be read again); the embeddings end the pass.
  release_params(unit + 1);
  if (unit == 0) release_params(0);
}

void NcclParamShards::pass_done() {
  for (int u = 0; u < num_units(); ++u) release_params(u);
  std::fill(needs_.begin(), needs_.end(), 0);
  // The host meets the group once per pass, bounded: a rank that died or stalls inside a gather or
  // a reduce-scatter is noticed here (and named by the watchdog), not in a later device wait.
  wait_for(group_, "parameter all-gather / gradient reduce-scatter");
  reap(false);
}

void NcclParamShards::release_all() {
  for (int u = 0; u < num_units(); ++u) {
    const size_t i = size_t(u);
    if (state_[i] == State::gathering) KILTER_CUDA_CHECK(cudaStreamWaitEvent(compute_, gathered_[i], 0));
    if (reduce_pending_[i]) KILTER_CUDA_CHECK(cudaStreamWaitEvent(compute_, reduced_[i], 0));
    reduce_pending_[i] = false;
    drop_params(u, compute_);
    drop_grads(u, compute_);
    needs_[i] = 0;
    state_[i] = State::released;
  }
  // A whole-buffer write landed on the scratch pages outside the chunks too: the gradients'
  // must read zero again (a norm or an update over the whole buffer reads them).
  reap(true);
  KILTER_CUDA_CHECK(
      cudaMemsetAsync(grads_mem_->buffer.scratch_page(), 0, grads_mem_->buffer.page_bytes(), compute_));
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
                                                   bool reshard_after_forward, double timeout_s) {
  return std::make_unique<NcclParamShards>(group, replicas, layout, reshard_after_forward, timeout_s);
}

}  // namespace kilter::train
