// Moves rows between a packed micro-batch's token matrix (N, W) and the padded layout of its
// attention groups (lib/model/attention_groups.h), so that the padded (B,T) attention engines
// (attention.cu, attention_cudnn.cu, attention_bf16.cu) run a packed batch with work
// proportional to sum(len^2); fp32 rows, or bf16 rows for the bf16 datapath.
#include "io/base/cuda_common.h"
#include "lib/model/cuda_ops.h"
#include "lib/model/bf16_device.cuh"

namespace kilter::model::cuda {

namespace {

template <typename T>
__global__ void gather_rows_kernel(T* padded, const T* rows, const int32_t* padded_token, int W, size_t total) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int32_t token = padded_token[i / W];
    padded[i] = token < 0 ? store_f<T>(0.0f) : rows[static_cast<size_t>(token) * W + (i % W)];
  }
}

// Every token row appears in exactly one padded row, so the writes never collide.
__global__ void scatter_rows_kernel(float* rows, const float* padded, const int32_t* padded_token, int W,
                                    size_t total, bool accumulate) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int32_t token = padded_token[i / W];
    if (token < 0) continue;
    float* dst = rows + static_cast<size_t>(token) * W + (i % W);
    *dst = accumulate ? *dst + padded[i] : padded[i];
  }
}

__global__ void scatter_rows_bf16_kernel(bf16* rows, const bf16* padded, const int32_t* padded_token, int W,
                                         size_t total) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int32_t token = padded_token[i / W];
    if (token >= 0) rows[static_cast<size_t>(token) * W + (i % W)] = padded[i];
  }
}

}  // namespace

void gather_padded_rows(float* padded, const float* rows, const int32_t* padded_token, size_t padded_rows, int W,
                        cudaStream_t stream) {
  const size_t total = padded_rows * W;
  if (total == 0) return;
  gather_rows_kernel<float><<<backend::grid_for(total, 256), 256, 0, stream>>>(padded, rows, padded_token, W, total);
  KILTER_CUDA_LAUNCH_CHECK();
}

void gather_padded_rows(bf16* padded, const bf16* rows, const int32_t* padded_token, size_t padded_rows, int W,
                        cudaStream_t stream) {
  const size_t total = padded_rows * W;
  if (total == 0) return;
  gather_rows_kernel<bf16><<<backend::grid_for(total, 256), 256, 0, stream>>>(padded, rows, padded_token, W, total);
  KILTER_CUDA_LAUNCH_CHECK();
}

void scatter_padded_rows(bf16* rows, const bf16* padded, const int32_t* padded_token, size_t padded_rows, int W,
                         cudaStream_t stream) {
  const size_t total = padded_rows * W;
  if (total == 0) return;
  scatter_rows_bf16_kernel<<<backend::grid_for(total, 256), 256, 0, stream>>>(rows, padded, padded_token, W, total);
  KILTER_CUDA_LAUNCH_CHECK();
}

void scatter_padded_rows(float* rows, const float* padded, const int32_t* padded_token, size_t padded_rows, int W,
                         bool accumulate, cudaStream_t stream) {
  const size_t total = padded_rows * W;
  if (total == 0) return;
  scatter_rows_kernel<<<backend::grid_for(total, 256), 256, 0, stream>>>(rows, padded, padded_token, W, total,
                                                                         accumulate);
  KILTER_CUDA_LAUNCH_CHECK();
}

}  // namespace kilter::model::cuda
