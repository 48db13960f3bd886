// The row kernels of LayerNorm and RMSNorm over fp32 or bf16 rows (T), shared by layernorm.cu
// (GPT-2's fp32 LayerNorm), rmsnorm.cu (the fp32 RMSNorm of the Llama family) and residual_norm.cu
// (the bf16 datapath's norms, fused with the residual add). One warp per row, kRowsPerBlock rows
// per block, fp32 arithmetic; the weight and bias gradients are chunked column sums added in a
// fixed order (deterministic). Included by .cu files only.
#pragma once
#include "io/base/cuda_common.h"
#include "lib/model/cuda_ops.h"
#include "lib/model/bf16_device.cuh"

namespace kilter::model::cuda::norm_detail {
namespace {  // each including .cu file gets its own kernels

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = 8;
using scratch_detail::kColumnChunks;  // as column_sum_scratch_floats (kernel_scratch.h)

// Row `row` of the input: a, or with kResidual the stored sum round(a + b) (written to residual),
// so that a plain norm of the stored sum later reads exactly these values.
template <typename T, bool kResidual>
__device__ __forceinline__ float row_value(const T* a, const T* b, size_t i) {
  if constexpr (kResidual) return load_f(store_f<T>(load_f(a[i]) + load_f(b[i])));
  return load_f(a[i]);
}

// out = norm(x) * weight (+ bias); x = a or round(a + b). LayerNorm: (x - mean) rstd w + b;
// RMSNorm: w (x rstd), rstd = 1 / sqrt(mean(x^2) + eps) (the CPU twins' expressions).
template <typename T, bool kResidual, bool kRms>
__global__ void norm_forward_kernel(T* residual, T* out, float* mean, float* rstd, const T* a, const T* b,
                                    const float* weight, const float* bias, int N, int C, float eps) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.y;
  const int lane = threadIdx.x;
  if (row >= N) return;
  const size_t base = static_cast<size_t>(row) * C;
  float sum = 0.0f;
  for (int i = lane; i < C; i += kWarp) {
    const float x = row_value<T, kResidual>(a, b, base + i);
    if constexpr (kResidual) residual[base + i] = store_f<T>(x);
    sum += kRms ? x * x : x;
  }
  sum = warp_reduce_sum(sum);
  float m = 0.0f, s;
  if constexpr (kRms) {
    s = rsqrtf(sum / C + eps);
  } else {
    m = sum / C;
    float sq = 0.0f;
    for (int i = lane; i < C; i += kWarp) {
      const float d = row_value<T, kResidual>(a, b, base + i) - m;
      sq += d * d;
    }
    s = rsqrtf(warp_reduce_sum(sq) / C + eps);
  }
  for (int i = lane; i < C; i += kWarp) {
    const float x = row_value<T, kResidual>(a, b, base + i);
    const float y = kRms ? weight[i] * (x * s) : (x - m) * s * weight[i] + bias[i];
    out[base + i] = store_f<T>(y);
  }
  if (lane == 0) {
    if (!kRms) mean[row] = m;
    rstd[row] = s;
  }
}

// dinp (fp32) += the norm's input gradient; dinp_copy (bf16, may be null) = round(dinp).
// LayerNorm's sum of dnorm xhat is (dnorm (x - mean)) rstd, as the CPU twins take it, or with
// kXhatFirst dnorm ((x - mean) rstd): the fp32 LayerNorm's order (layernorm.cu), kept so that its
// results do not move by an ulp.
template <typename T, bool kRms, bool kXhatFirst = false>
__global__ void norm_backward_input_kernel(float* dinp, __nv_bfloat16* dinp_copy, const T* dout, const T* inp,
                                           const float* weight, const float* mean, const float* rstd, int N, int C) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.y;
  const int lane = threadIdx.x;
  if (row >= N) return;
  const size_t base = static_cast<size_t>(row) * C;
  const float m = kRms ? 0.0f : mean[row];
  const float s = rstd[row];
  float first = 0.0f, second = 0.0f;  // LayerNorm: sums of dnorm and dnorm xhat; RMSNorm: of dnorm x
  for (int i = lane; i < C; i += kWarp) {
    const float x = load_f(inp[base + i]);
    const float dnorm = weight[i] * load_f(dout[base + i]);
    if (kRms) {
      first += dnorm * x;
    } else {
      first += dnorm;
      second += kXhatFirst ? dnorm * ((x - m) * s) : dnorm * (x - m) * s;
    }
  }
  first = warp_reduce_sum(first);
  if (!kRms) second = warp_reduce_sum(second);
  const float rms_scale = s * s * s * first / C;
  const float dnorm_mean = first / C, dnorm_xhat_mean = second / C;
  for (int i = lane; i < C; i += kWarp) {
    const float x = load_f(inp[base + i]);
    const float dnorm = weight[i] * load_f(dout[base + i]);
    const float dx = kRms ? dnorm * s - x * rms_scale : (dnorm - dnorm_mean - (x - m) * s * dnorm_xhat_mean) * s;
    const float total = dinp[base + i] + dx;
    dinp[base + i] = total;
    if (dinp_copy != nullptr) dinp_copy[base + i] = __float2bfloat16_rn(total);
  }
}

// Partial column sums over one chunk of rows of dout * xhat (dweight; RMSNorm: dout x rstd) and
// of dout (dbias, LayerNorm). grid (ceil(C/32), kColumnChunks), block (32, 8).
template <typename T, bool kRms>
__global__ void norm_backward_params_partial(float* partial_w, float* partial_b, const T* dout, const T* inp,
                                             const float* mean, const float* rstd, int N, int C) {
  __shared__ float shared_w[kRowsPerBlock][kWarp + 1];
  __shared__ float shared_b[kRowsPerBlock][kWarp + 1];
  const int c = blockIdx.x * kWarp + threadIdx.x;
  const int rows_per_chunk = (N + kColumnChunks - 1) / kColumnChunks;
  const int row_begin = blockIdx.y * rows_per_chunk;
  const int row_end = min(N, row_begin + rows_per_chunk);
  float sum_w = 0.0f, sum_b = 0.0f;
  if (c < C) {
    for (int r = row_begin + threadIdx.y; r < row_end; r += kRowsPerBlock) {
      const size_t i = static_cast<size_t>(r) * C + c;
      const float g = load_f(dout[i]), x = load_f(inp[i]);
      sum_w += kRms ? g * (x * rstd[r]) : g * (x - mean[r]) * rstd[r];
      sum_b += g;
    }
  }
  shared_w[threadIdx.y][threadIdx.x] = sum_w;
  shared_b[threadIdx.y][threadIdx.x] = sum_b;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float w = 0.0f, b = 0.0f;
    for (int y = 0; y < kRowsPerBlock; ++y) {
      w += shared_w[y][threadIdx.x];
      b += shared_b[y][threadIdx.x];
    }
    partial_w[static_cast<size_t>(blockIdx.y) * C + c] = w;
    partial_b[static_cast<size_t>(blockIdx.y) * C + c] = b;
  }
}

__global__ void norm_backward_params_final(float* dweight, float* dbias, const float* partial_w,
                                                  const float* partial_b, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float w = 0.0f, b = 0.0f;
  for (int k = 0; k < kColumnChunks; ++k) {
    w += partial_w[static_cast<size_t>(k) * C + c];
    b += partial_b[static_cast<size_t>(k) * C + c];
  }
  dweight[c] += w;
  if (dbias != nullptr) dbias[c] += b;
}

template <typename T, bool kResidual, bool kRms>
void launch_forward(T* residual, T* out, float* mean, float* rstd, const T* a, const T* b, const float* weight,
                    const float* bias, int N, int C, float eps, cudaStream_t stream) {
  if (N == 0) return;
  const unsigned grid = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  norm_forward_kernel<T, kResidual, kRms>
      <<<grid, dim3(kWarp, kRowsPerBlock), 0, stream>>>(residual, out, mean, rstd, a, b, weight, bias, N, C, eps);
  KILTER_CUDA_LAUNCH_CHECK();
}

template <typename T, bool kRms, bool kXhatFirst = false>
void launch_backward(float* dinp, __nv_bfloat16* dinp_copy, float* dweight, float* dbias, const T* dout, const T* inp,
                     const float* weight, const float* mean, const float* rstd, int N, int C, float* scratch,
                     cudaStream_t stream) {
  if (N == 0) return;
  const dim3 block(kWarp, kRowsPerBlock);
  const unsigned grid = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  norm_backward_input_kernel<T, kRms, kXhatFirst>
      <<<grid, block, 0, stream>>>(dinp, dinp_copy, dout, inp, weight, mean, rstd, N, C);
  KILTER_CUDA_LAUNCH_CHECK();
  float* partial_w = scratch;
  float* partial_b = scratch + column_sum_scratch_floats(C);
  norm_backward_params_partial<T, kRms><<<dim3((C + kWarp - 1) / kWarp, kColumnChunks), block, 0, stream>>>(
      partial_w, partial_b, dout, inp, mean, rstd, N, C);
  KILTER_CUDA_LAUNCH_CHECK();
  norm_backward_params_final<<<(C + 255) / 256, 256, 0, stream>>>(dweight, dbias, partial_w, partial_b, C);
  KILTER_CUDA_LAUNCH_CHECK();
}

}  // namespace
}  // namespace kilter::model::cuda::norm_detail
