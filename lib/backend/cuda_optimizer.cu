// CudaModel's optimizer side (cuda_model_impl.cuh): the AdamW moments' copy policy (device
// memory, copies on the compute stream), the squared gradient norm and AdamW over every owned
// range in one launch each, from a device table of the owned ranges' parts (rebuilt when the
// ranges change: train.shard_optimizer), and under bf16 storage the weights' bf16 working copy,
// which AdamW writes in the same pass.
#include <algorithm>

#include "lib/backend/cuda_model_impl.cuh"

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
  kc::adamw_update_segments(params_, grads_, moment_m(), moment_v(), segments_, segment_count_, segment_total_, p.lr,
                            p.beta1, p.beta2, p.eps, p.weight_decay, p.grad_scale, p.t, stream_,
                            bf16_storage_ ? params_bf16_ : nullptr, bf16_storage_ ? head_bf16_ : nullptr, head,
                            head_end);
}

void CudaModel::refresh_working_copy() {
  cuda_device_index();
  const size_t head = offsets_.head, head_end = head + static_cast<size_t>(cfg_.vocab_size) * cfg_.n_embd;
  kc::round_params_bf16(params_bf16_, params_, layout_.padded_size, head_bf16_, head, head_end, stream_);
}

}  // namespace kilter::backend
