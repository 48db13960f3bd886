// CUDA twin of lib/optim/adamw.cpp (AdamW with decoupled weight decay, fp32 master weights and
// moments) and the deterministic sum of squares behind global-norm gradient clipping.
// Lives in lib/model because the CUDA twins of the model's ops are gathered there.
#include <cmath>

#include "lib/backend/cuda_common.h"
#include "lib/backend/cuda_ops.h"

namespace kilter::model::cuda {

namespace {

constexpr int kNormThreads = 256;
constexpr int kNormBlocks = 1024;  // partial sums; the final pass adds them in a fixed order

// Same arithmetic, in the same order, as lib/optim/adamw.cpp (torch.optim.AdamW's form):
// decoupled decay first, then the Adam step with host-computed bias-correction factors.
__global__ void adamw_kernel(float* params, const float* grads, float* m, float* v, size_t n, float decay_factor,
                             float beta1, float beta2, float eps, float grad_scale, float step_size,
                             float inv_sqrt_bc2) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float g = grads[i] * grad_scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float denom = sqrtf(vi) * inv_sqrt_bc2 + eps;
    params[i] = params[i] * decay_factor - step_size * mi / denom;
  }
}

__global__ void sum_of_squares_partial(double* partial, const float* x, size_t n) {
  __shared__ double shared[kNormThreads];
  double local = 0.0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const double value = x[i];
    local += value * value;
  }
  shared[threadIdx.x] = local;
  __syncthreads();
  for (int stride = kNormThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = shared[0];
}

__global__ void sum_partials(double* result, const double* partial, int count) {
  __shared__ double shared[kNormThreads];
  double local = 0.0;
  for (int i = threadIdx.x; i < count; i += kNormThreads) local += partial[i];
  shared[threadIdx.x] = local;
  __syncthreads();
  for (int stride = kNormThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) *result = shared[0];
}

}  // namespace

void adamw_update(float* params, const float* grads, float* m, float* v, size_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, float grad_scale, int64_t t, cudaStream_t stream) {
  if (n == 0) return;
  KILTER_CHECK(t >= 1, "adamw_update: step t must be >= 1, got " << t);
  // Bias corrections in double on the host, exactly as the CPU computes them once per call.
  const double bias_correction1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(t));
  const double bias_correction2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(t));
  const float step_size = static_cast<float>(lr / bias_correction1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bias_correction2));
  const float decay_factor = 1.0f - lr * weight_decay;
  adamw_kernel<<<backend::grid_for(n, 256), 256, 0, stream>>>(params, grads, m, v, n, decay_factor, beta1, beta2,
                                                              eps, grad_scale, step_size, inv_sqrt_bc2);
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
