// CUDA twin of lib/optim/adamw.cpp (AdamW with decoupled weight decay, fp32 master weights and
// moments) and the deterministic sum of squares behind global-norm gradient clipping.
// Lives in lib/model because the CUDA twins of the model's ops are gathered there. The model runs
// AdamW and the norm over all of its owned ranges in one launch each (adamw_update_segments,
// sum_of_squares_segments; a device table of the ranges' parts), with the same per-element
// arithmetic as the per-range forms, which the tests keep as references.
#include <cmath>

#include "io/base/cuda_common.h"
#include "lib/model/cuda_ops.h"

namespace kilter::model::cuda {

namespace {

constexpr int kNormThreads = 256;
constexpr int kNormBlocks = 1024;  // partial sums; the final pass adds them in a fixed order

// The factors of one AdamW call, computed on the host once, as lib/optim/adamw.cpp does: the bias
// corrections in double, then rounded to float.
struct AdamWFactors {
  float step_size, inv_sqrt_bc2, decay_factor;
  AdamWFactors(float lr, float beta1, float beta2, float weight_decay, int64_t t) {
    const double bias_correction1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(t));
    const double bias_correction2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(t));
    step_size = static_cast<float>(lr / bias_correction1);
    inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bias_correction2));
    decay_factor = 1.0f - lr * weight_decay;
  }
};

// One element, with the same arithmetic in the same order as lib/optim/adamw.cpp (torch.optim.
// AdamW's form): the moments, then decoupled decay and the Adam step. Returns the new parameter.
// decays: the element's part's decay flag (0: no weight decay), null where every element decays.
// The factors are the kernels' own scalar parameters and the flag is read after the moments, as
// the kernels always did: with the factors in a struct, or the flag read first, nvcc contracts
// other products into FMAs (the PTX shows it) and the results move by an ulp.
__device__ __forceinline__ float adamw_element(float* param, float grad, float* m, float* v, const float* decays,
                                               float decay_factor, float beta1, float beta2, float eps,
                                               float grad_scale, float step_size, float inv_sqrt_bc2) {
  const float g = grad * grad_scale;
  const float mi = beta1 * *m + (1.0f - beta1) * g;
  const float vi = beta2 * *v + (1.0f - beta2) * g * g;
  *m = mi;
  *v = vi;
  const float denom = sqrtf(vi) * inv_sqrt_bc2 + eps;
  const float decay = decays == nullptr || *decays != 0.0f ? decay_factor : 1.0f;
  const float updated = *param * decay - step_size * mi / denom;
  *param = updated;
  return updated;
}

__global__ void adamw_kernel(float* params, const float* grads, float* m, float* v, size_t n, float decay_factor,
                             float beta1, float beta2, float eps, float grad_scale, float step_size,
                             float inv_sqrt_bc2) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    adamw_element(&params[i], grads[i], &m[i], &v[i], nullptr, decay_factor, beta1, beta2, eps, grad_scale, step_size,
                  inv_sqrt_bc2);
  }
}

// The block's sum of `local` (kNormThreads threads) in a fixed tree order; the result in thread 0.
__device__ double block_sum(double local, double* shared) {
  shared[threadIdx.x] = local;
  __syncthreads();
  for (int stride = kNormThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  return shared[0];
}

__global__ void sum_of_squares_partial(double* partial, const float* x, size_t n) {
  __shared__ double shared[kNormThreads];
  double local = 0.0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const double value = x[i];
    local += value * value;
  }
  const double sum = block_sum(local, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

__global__ void sum_partials(double* result, const double* partial, int count) {
  __shared__ double shared[kNormThreads];
  double local = 0.0;
  for (int i = threadIdx.x; i < count; i += kNormThreads) local += partial[i];
  const double sum = block_sum(local, shared);
  if (threadIdx.x == 0) *result = sum;
}

// The segment holding element i of the concatenated owned parts (segments[k].first <= i).
__device__ int segment_of(const AdamWSegment* segments, int count, uint64_t i) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (segments[mid].first <= i) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// adamw_kernel's arithmetic over every owned part at once; decay_factor applies where the part
// decays (1 elsewhere, what adamw_update computes for weight_decay 0).
__global__ void adamw_segments_kernel(float* params, const float* grads, float* m, float* v,
                                      const AdamWSegment* segments, int count, uint64_t total, float decay_factor,
                                      float beta1, float beta2, float eps, float grad_scale, float step_size,
                                      float inv_sqrt_bc2, bf16* params_bf16, bf16* head_bf16, uint64_t head_lo,
                                      uint64_t head_hi, bool compact_master) {
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const AdamWSegment& seg = segments[segment_of(segments, count, i)];
    const uint64_t offset = i - seg.first, p = seg.lo + offset, k = seg.moment + offset;
    float* master = compact_master ? &params[k] : &params[p];  // the distributed optimizer's: as the moments
    const float updated = adamw_element(master, grads[p], &m[k], &v[k], &seg.decay, decay_factor, beta1, beta2, eps,
                                        grad_scale, step_size, inv_sqrt_bc2);
    if (params_bf16 != nullptr) params_bf16[p] = __float2bfloat16_rn(updated);
    if (head_bf16 != nullptr && p >= head_lo && p < head_hi) head_bf16[p - head_lo] = __float2bfloat16_rn(updated);
  }
}

// sum_of_squares_partial over the segments, then the last block to finish adds the partials in
// their fixed order: one launch, the same sums as sum_of_squares_async over one range.
__global__ void sum_of_squares_segments_kernel(double* result, const float* grads, const AdamWSegment* segments,
                                               int count, uint64_t total, double* partial, unsigned* counter) {
  __shared__ double shared[kNormThreads];
  __shared__ bool last;
  double local = 0.0;
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const AdamWSegment& seg = segments[segment_of(segments, count, i)];
    const double value = grads[seg.lo + (i - seg.first)];
    local += value * value;
  }
  const double block = block_sum(local, shared);
  if (threadIdx.x == 0) {
    partial[blockIdx.x] = block;
    __threadfence();
    last = atomicAdd(counter, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  const volatile double* written = partial;  // other blocks' partials: read past this SM's L1
  double sum = 0.0;
  for (int b = threadIdx.x; b < static_cast<int>(gridDim.x); b += kNormThreads) sum += written[b];
  const double grid = block_sum(sum, shared);
  if (threadIdx.x == 0) {
    *result = grid;
    *counter = 0;  // ready for the next call
  }
}

__global__ void round_params_kernel(bf16* params_bf16, const float* params, size_t n, bf16* head_bf16, uint64_t head_lo,
                                    uint64_t head_hi) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const bf16 rounded = __float2bfloat16_rn(params[i]);
    params_bf16[i] = rounded;
    if (head_bf16 != nullptr && i >= head_lo && i < head_hi) head_bf16[i - head_lo] = rounded;
  }
}

}  // namespace

void adamw_update_segments(float* params, const float* grads, float* m, float* v, const AdamWSegment* segments,
                           int count, uint64_t total, float lr, float beta1, float beta2, float eps,
                           float weight_decay, float grad_scale, int64_t t, cudaStream_t stream, bf16* params_bf16,
                           bf16* head_bf16, uint64_t head_lo, uint64_t head_hi, bool compact_master) {
  if (total == 0 || count == 0) return;
  KILTER_CHECK(t >= 1, "adamw_update_segments: step t must be >= 1, got " << t);
  const AdamWFactors factors(lr, beta1, beta2, weight_decay, t);
  adamw_segments_kernel<<<backend::grid_for(total, 256), 256, 0, stream>>>(
      params, grads, m, v, segments, count, total, factors.decay_factor, beta1, beta2, eps, grad_scale,
      factors.step_size, factors.inv_sqrt_bc2, params_bf16, head_bf16, head_lo, head_hi, compact_master);
  KILTER_CUDA_LAUNCH_CHECK();
}

void sum_of_squares_segments(double* result, const float* grads, const AdamWSegment* segments, int count,
                             uint64_t total, double* scratch, unsigned* counter, cudaStream_t stream) {
  if (count == 0 || total == 0) {
    KILTER_CUDA_CHECK(cudaMemsetAsync(result, 0, sizeof(double), stream));
    return;
  }
  sum_of_squares_segments_kernel<<<kNormBlocks, kNormThreads, 0, stream>>>(result, grads, segments, count, total,
                                                                           scratch, counter);
  KILTER_CUDA_LAUNCH_CHECK();
}

void round_params_bf16(bf16* params_bf16, const float* params, size_t n, bf16* head_bf16, uint64_t head_lo,
                       uint64_t head_hi, cudaStream_t stream) {
  if (n == 0) return;
  round_params_kernel<<<backend::grid_for(n, 256), 256, 0, stream>>>(params_bf16, params, n, head_bf16, head_lo,
                                                                     head_hi);
  KILTER_CUDA_LAUNCH_CHECK();
}

void adamw_update(float* params, const float* grads, float* m, float* v, size_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, float grad_scale, int64_t t, cudaStream_t stream) {
  if (n == 0) return;
  KILTER_CHECK(t >= 1, "adamw_update: step t must be >= 1, got " << t);
  const AdamWFactors factors(lr, beta1, beta2, weight_decay, t);
  adamw_kernel<<<backend::grid_for(n, 256), 256, 0, stream>>>(params, grads, m, v, n, factors.decay_factor, beta1,
                                                              beta2, eps, grad_scale, factors.step_size,
                                                              factors.inv_sqrt_bc2);
  KILTER_CUDA_LAUNCH_CHECK();
}

size_t sum_of_squares_scratch_doubles() { return kNormBlocks; }

void sum_of_squares_async(double* result, const float* x, size_t n, double* scratch, cudaStream_t stream) {
  // Always kNormBlocks blocks (idle ones write 0): the summation order does not depend on n.
  sum_of_squares_partial<<<kNormBlocks, kNormThreads, 0, stream>>>(scratch, x, n);
  KILTER_CUDA_LAUNCH_CHECK();
  sum_partials<<<1, kNormThreads, 0, stream>>>(result, scratch, kNormBlocks);
  KILTER_CUDA_LAUNCH_CHECK();
}

}  // namespace kilter::model::cuda
