// CudaModel's optimizer side (cuda_model_impl.cuh): the AdamW moments' copy policy (device
// memory, copies on the compute stream), the squared gradient norm and AdamW over every owned
// range in one launch each, from a device table of the owned ranges' parts (rebuilt when the
// ranges change: train.shard_optimizer), and under bf16 storage the weights' bf16 working copy,
// which AdamW writes in the same pass. Under a sharded optimizer with bf16 storage this is the
// distributed optimizer: the fp32 master only for the owned ranges, the working copy gathered
// (lib/model/model.h gathered_working_copy; the CPU twin is CpuModel's). Under train.shard =
// parameters with bf16 storage it is the model state too: the parameter holder gathers the
// working copy unit by unit, and nothing here reads or writes the whole buffers.
#include <algorithm>

#include "lib/backend/cuda_model_impl.cuh"
#include "lib/model/bf16_ops.h"

namespace kilter::backend {

float* CudaModel::allocate_moments(size_t floats) {
  cuda_device_index();
  float* moments = nullptr;
  const cudaError_t status = cudaMalloc(reinterpret_cast<void**>(&moments), sizeof(float) * floats);
  if (status != cudaSuccess) {
    cudaGetLastError();
    KILTER_FAIL("cuda backend: cannot allocate the AdamW moments (" << (sizeof(float) * floats >> 20) << " MiB) on device "
                << device_ << " (" << cudaGetErrorString(status) << "); set train.shard_optimizer = true to hold "
                << "1/world_size of them per rank, or use more ranks");
  }
  KILTER_CUDA_CHECK(cudaMemsetAsync(moments, 0, sizeof(float) * floats, stream_));
  return moments;
}

void CudaModel::free_moments(float* moments) {
  cudaStreamSynchronize(stream_);  // queued kernels may still use them; never throws (destructor)
  cudaFree(moments);
}

void CudaModel::upload(float* to, const float* host, size_t count) {
  cuda_device_index();
  KILTER_CUDA_CHECK(cudaMemcpyAsync(to, host, sizeof(float) * count, cudaMemcpyHostToDevice, stream_));
}

void CudaModel::download(float* host, const float* from, size_t count) const {
  cuda_device_index();
  KILTER_CUDA_CHECK(cudaMemcpyAsync(host, from, sizeof(float) * count, cudaMemcpyDeviceToHost, stream_));
}

void CudaModel::zero(float* to, size_t count) {
  cuda_device_index();
  KILTER_CUDA_CHECK(cudaMemsetAsync(to, 0, sizeof(float) * count, stream_));
}

void CudaModel::finish_copies() const { KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

void CudaModel::ensure_segments() {
  const std::vector<model::ParamRange>& owned_ranges = owned();
  const bool same = segments_ != nullptr && segments_for_.size() == owned_ranges.size() &&
                    std::equal(owned_ranges.begin(), owned_ranges.end(), segments_for_.begin(),
                               [](const model::ParamRange& a, const model::ParamRange& b) {
                                 return a.offset == b.offset && a.count == b.count;
                               });
  if (same) return;
  // Every tensor's part inside every owned range (unsharded: every tensor whole), with its decay
  // flag and its place among the moments: the table the one-launch AdamW and norm walk.
  std::vector<kc::AdamWSegment> table;
  uint64_t total = 0;
  model::for_each_owned_part(layout_, owned_ranges, [&](size_t lo, size_t hi, size_t k, bool decay) {
    table.push_back({lo, hi, k, total, decay ? 1.0f : 0.0f});
    total += hi - lo;
  });
  KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the old table may still be read
  cudaFree(segments_);
  segments_ = nullptr;
  KILTER_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&segments_), sizeof(kc::AdamWSegment) * std::max<size_t>(table.size(), 1)));
  KILTER_CUDA_CHECK(cudaMemcpy(segments_, table.data(), sizeof(kc::AdamWSegment) * table.size(), cudaMemcpyHostToDevice));
  segment_count_ = static_cast<int>(table.size());
  segment_total_ = total;
  segments_for_ = owned_ranges;
  segments_host_ = std::move(table);
}

void CudaModel::shard_optimizer(const std::vector<model::ParamRange>& owned_ranges) {
  KILTER_CHECK(!master_sharded_, "cuda backend: the distributed optimizer's ranges are set once (the master of "
                                 "other ranges is not held here to move)");
  ModelBase::shard_optimizer(owned_ranges);
  // Only bf16 storage computes with a working copy; on the fp32 datapath the parameters are the
  // master, which every rank keeps whole (the parameters are gathered).
  if (!bf16_storage_) return;
  cuda_device_index();
  ensure_segments();
  // As the moments: owned_floats() (the owned ranges, range after range), a part's master at its
  // moment index.
  const size_t master_floats = owned_floats();
  KILTER_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&master_), sizeof(float) * std::max<size_t>(master_floats, 1)));
  KILTER_CUDA_CHECK(cudaMemsetAsync(master_, 0, sizeof(float) * master_floats, stream_));
  norm_ranges_ = model::norm_tensor_ranges(layout_);
  if (copy_gathered_) {
    // The holder's buffers stay (set_param_units): its chunks of the working copy are written from
    // master_ at the first write (load_owned_master) and by AdamW, the norms widened and the head's
    // copy refreshed as each unit is gathered (unit_copy_derived). The ranges are the holder's
    // chunks (run_setup gives the reducer's owned(), which the holder is).
    master_sharded_ = true;
    KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return;
  }
  if (params_ != nullptr) {
    // Already written whole (a test, or set up after an initialization): keep the owned master
    // and make sure the working copy is its rounding, then give the whole buffer back (never a
    // parameter holder's: one that gathers the working copy took the branch above).
    KILTER_CHECK(!state_borrowed_, "cuda backend: the distributed optimizer under sharded parameters needs a holder "
                                   "that gathers the bf16 working copy (ParamUnitHooks::working_copy_storage)");
    for (const kc::AdamWSegment& seg : segments_host_)
      KILTER_CUDA_CHECK(cudaMemcpyAsync(master_ + seg.moment, params_ + seg.lo, sizeof(float) * (seg.hi - seg.lo),
                                        cudaMemcpyDeviceToDevice, stream_));
    refresh_working_copy();
    KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));
    cudaFree(params_);
    params_ = nullptr;
  }
  // The norms' widened weights at their offsets: a managed allocation only their pages touch
  // (the device's first writes, widen_norms, place them in device memory).
  const size_t padded = align_up(layout_.padded_size);
  const cudaError_t status = cudaMallocManaged(reinterpret_cast<void**>(&params_), sizeof(float) * padded);
  if (status != cudaSuccess) {
    cudaGetLastError();
    KILTER_FAIL("cuda backend: the distributed optimizer (train.shard = optimizer with bf16 storage) cannot reserve "
                "the norms' widened weights as managed memory on device " << device_ << " ("
                << cudaGetErrorString(status) << "); set train.bf16_storage = off or train.shard = none");
  }
  master_sharded_ = true;
  widen_norms();
  KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaModel::widen_norms() {
  for (const model::ParamRange& r : norm_ranges_)
    kc::to_float(params_ + r.offset, params_bf16_ + r.offset, r.count, stream_);
}

void CudaModel::working_copy_gathered() {
  check_not_unit_wise("the whole working copy's norms and head refreshed (params_changed)");
  cuda_device_index();
  unit_copy_derived({0, layout_.padded_size});
}

void CudaModel::unit_copy_derived(const model::ParamRange& r) {
  for (const model::ParamRange& n : norm_ranges_)
    if (n.offset >= r.offset && n.offset + n.count <= r.offset + r.count)
      kc::to_float(params_ + n.offset, params_bf16_ + n.offset, n.count, stream_);
  const size_t head = offsets_.head, head_floats = static_cast<size_t>(cfg_.vocab_size) * cfg_.n_embd;
  if (head >= r.offset && head + head_floats <= r.offset + r.count)
    KILTER_CUDA_CHECK(cudaMemcpyAsync(head_bf16_, params_bf16_ + head, sizeof(kc::bf16) * head_floats,
                                      cudaMemcpyDeviceToDevice, stream_));
}

void CudaModel::check_not_unit_wise(const char* what) const {
  KILTER_CHECK(!copy_gathered_, "cuda backend: " << what << " under train.shard = parameters with bf16 storage, where "
                                "each rank holds only its chunks of the parameters (the fp32 master and the bf16 "
                                "working copy) and the units in use; use train.shard = optimizer for what needs the "
                                "whole model on a rank");
}

void CudaModel::load_owned_master(const float* host, size_t count) {
  // Range after range, as the moments: the master from the host, its rounding into the working
  // copy's chunk (backed for good by the holder). Beyond `count` (the padding): zeros.
  size_t at = 0;
  for (const model::ParamRange& r : owned()) {
    if (r.count == 0) continue;
    const size_t have = r.offset < count ? std::min(r.count, count - r.offset) : 0;
    if (have > 0)
      KILTER_CUDA_CHECK(cudaMemcpyAsync(master_ + at, host + r.offset, sizeof(float) * have, cudaMemcpyHostToDevice,
                                        stream_));
    if (have < r.count)
      KILTER_CUDA_CHECK(cudaMemsetAsync(master_ + at + have, 0, sizeof(float) * (r.count - have), stream_));
    kc::round_params_bf16(params_bf16_ + r.offset, master_ + at, r.count, nullptr, 0, 0, stream_);
    at += r.count;
  }
  KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));  // `host` may go out of scope
}

void CudaModel::load_sharded_master(const float* host, size_t count) {
  cuda_device_index();
  if (copy_gathered_) return load_owned_master(host, count);
  const size_t padded = layout_.padded_size;
  KILTER_CUDA_CHECK(cudaMemcpyAsync(grads_, host, sizeof(float) * count, cudaMemcpyHostToDevice, stream_));
  if (count < padded) KILTER_CUDA_CHECK(cudaMemsetAsync(grads_ + count, 0, sizeof(float) * (padded - count), stream_));
  const size_t head = offsets_.head, head_end = head + static_cast<size_t>(cfg_.vocab_size) * cfg_.n_embd;
  kc::round_params_bf16(params_bf16_, grads_, padded, head_bf16_, head, head_end, stream_);
  for (const kc::AdamWSegment& seg : segments_host_)
    KILTER_CUDA_CHECK(cudaMemcpyAsync(master_ + seg.moment, grads_ + seg.lo, sizeof(float) * (seg.hi - seg.lo),
                                      cudaMemcpyDeviceToDevice, stream_));
  widen_norms();
  KILTER_CUDA_CHECK(cudaMemsetAsync(grads_, 0, sizeof(float) * padded, stream_));
  KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));  // `host` may go out of scope
}

void CudaModel::read_working_copy(float* host) const {
  std::vector<model::bf16> bits(layout_.num_params);
  KILTER_CUDA_CHECK(cudaMemcpyAsync(bits.data(), params_bf16_, sizeof(model::bf16) * bits.size(),
                                    cudaMemcpyDeviceToHost, stream_));
  KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));
  model::bf16_to_floats(host, bits.data(), bits.size());
}

void CudaModel::copy_params_to_host(float* host, size_t offset, size_t count) {
  cuda_device_index();
  const float* from = params_ + offset;
  if (master_sharded_) {
    // Only the owned ranges hold a master, range after range as the moments (a sharded
    // checkpoint reads each rank's own).
    from = nullptr;
    size_t at = 0;
    for (const model::ParamRange& r : owned()) {
      if (offset >= r.offset && offset + count <= r.offset + r.count) from = master_ + at + (offset - r.offset);
      at += r.count;
    }
    KILTER_CHECK(from != nullptr, "cuda backend: copy_params_to_host [" << offset << ", " << offset + count
                                  << "): under the distributed optimizer (train.shard = optimizer or parameters with "
                                  "bf16 storage) this rank holds the fp32 master of its owned ranges only");
  }
  KILTER_CUDA_CHECK(cudaMemcpyAsync(host, from, sizeof(float) * count, cudaMemcpyDeviceToHost, stream_));
  KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaModel::round_grads_bf16(size_t offset, size_t count) {
  cuda_device_index();
  kc::round_bf16_inplace(grads_ + offset, count, stream_);
}

double CudaModel::grad_norm_squared() {
  cuda_device_index();
  ensure_segments();
  // Over every owned part in one launch (deterministic: fixed partial sums, added in order; over
  // one unsharded range the same sums as before).
  kc::sum_of_squares_segments(loss_device_ + 1, grads_, segments_, segment_count_, segment_total_, loss_device_ + 2,
                              norm_counter_, stream_);
  double total = 0.0;
  KILTER_CUDA_CHECK(cudaMemcpyAsync(&total, loss_device_ + 1, sizeof(double), cudaMemcpyDeviceToHost, stream_));
  KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return total;
}

void CudaModel::adamw_step(const model::AdamWParams& p) {
  cuda_device_index();
  ensure_moments();
  ensure_segments();
  // Every owned part in one launch, each with its own decay, writing the bf16 working copy (and
  // the padded head's) in the same pass under bf16 storage. Sharded, the all-gather brings the
  // other ranks' parameters and params_changed() rounds them.
  const size_t head = offsets_.head, head_end = head + static_cast<size_t>(cfg_.vocab_size) * cfg_.n_embd;
  // Under the distributed optimizer the master is master_, indexed as the moments.
  kc::adamw_update_segments(master_sharded_ ? master_ : params_, grads_, moment_m(), moment_v(), segments_,
                            segment_count_, segment_total_, p.lr, p.beta1, p.beta2, p.eps, p.weight_decay,
                            p.grad_scale, p.t, stream_, bf16_storage_ ? params_bf16_ : nullptr,
                            bf16_storage_ ? head_bf16_ : nullptr, head, head_end, master_sharded_);
}

void CudaModel::refresh_working_copy() {
  check_not_unit_wise("the whole working copy rounded from the fp32 parameters");
  cuda_device_index();
  const size_t head = offsets_.head, head_end = head + static_cast<size_t>(cfg_.vocab_size) * cfg_.n_embd;
  kc::round_params_bf16(params_bf16_, params_, layout_.padded_size, head_bf16_, head, head_end, stream_);
}

}  // namespace kilter::backend
