// Elementwise conversions between fp32 and bf16 rows for the bf16 datapath: the weights' first
// rounding, test inputs, bf16 gradient accumulation (rounding in place), and the K/V exchange's
// staging (the exchange moves fp32 rows: the bf16 qkv goes out converted, and the fp32 dK/dV it
// brings back are added into the bf16 dqkv rows and rounded once, as the CPU oracle does in
// block_ops_cpu.cpp).
#include "io/base/cuda_common.h"
#include "lib/model/cuda_ops.h"
#include "lib/model/bf16_device.cuh"

namespace kilter::model::cuda {

namespace {

__global__ void to_bf16_kernel(bf16* out, const float* in, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(in[i]);
}

__global__ void to_float_kernel(float* out, const bf16* in, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    out[i] = __bfloat162float(in[i]);
}

__global__ void round_bf16_inplace_kernel(float* x, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    x[i] = __bfloat162float(__float2bfloat16_rn(x[i]));
}

__global__ void add_into_bf16_kernel(bf16* x, const float* y, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    x[i] = __float2bfloat16_rn(__bfloat162float(x[i]) + y[i]);
}

}  // namespace

void to_bf16(bf16* out, const float* in, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  to_bf16_kernel<<<backend::grid_for(n, 256), 256, 0, stream>>>(out, in, n);
  KILTER_CUDA_LAUNCH_CHECK();
}

void to_float(float* out, const bf16* in, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  to_float_kernel<<<backend::grid_for(n, 256), 256, 0, stream>>>(out, in, n);
  KILTER_CUDA_LAUNCH_CHECK();
}

void round_bf16_inplace(float* x, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  round_bf16_inplace_kernel<<<backend::grid_for(n, 256), 256, 0, stream>>>(x, n);
  KILTER_CUDA_LAUNCH_CHECK();
}

void add_into_bf16(bf16* x, const float* y, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_into_bf16_kernel<<<backend::grid_for(n, 256), 256, 0, stream>>>(x, y, n);
  KILTER_CUDA_LAUNCH_CHECK();
}

}  // namespace kilter::model::cuda
