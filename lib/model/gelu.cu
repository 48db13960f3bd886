// CUDA twin of lib/model/gelu.cpp: GELU, tanh approximation (GPT-2), elementwise; on bf16 rows
// too (the bf16 datapath where the GEMM's GELU epilogue is not used; twin gelu_forward_bf16).
//   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
#include "io/base/cuda_common.h"
#include "lib/model/cuda_ops.h"
#include "lib/model/bf16_device.cuh"

namespace kilter::model::cuda {

namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

// gelu(x) and its derivative gelu'(x), in fp32.
__device__ __forceinline__ float gelu_value(float x) {
  const float inner = kSqrt2OverPi * (x + kCubic * x * x * x);
  return 0.5f * x * (1.0f + tanhf(inner));
}
__device__ __forceinline__ float gelu_derivative(float x) {
  const float inner = kSqrt2OverPi * (x + kCubic * x * x * x);
  const float tanh_inner = tanhf(inner);
  const float sech2 = 1.0f - tanh_inner * tanh_inner;
  return 0.5f * (1.0f + tanh_inner) + 0.5f * x * sech2 * kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
}

// out = gelu(inp): fp32, or bf16 rounded once.
template <typename T>
__global__ void gelu_forward_kernel(T* out, const T* inp, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    out[i] = store_f<T>(gelu_value(load_f(inp[i])));
}

__global__ void gelu_backward_kernel(float* dinp, const float* inp, const float* dout, size_t n, bool accumulate) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float grad = gelu_derivative(inp[i]) * dout[i];
    dinp[i] = accumulate ? dinp[i] + grad : grad;
  }
}

// d = round(gelu'(inp) d), in place.
__global__ void gelu_backward_bf16_kernel(bf16* d, const bf16* inp, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    d[i] = store_f<bf16>(gelu_derivative(load_f(inp[i])) * load_f(d[i]));
}

}  // namespace

void gelu_forward(bf16* out, const bf16* inp, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  gelu_forward_kernel<bf16><<<backend::grid_for(n, 256), 256, 0, stream>>>(out, inp, n);
  KILTER_CUDA_LAUNCH_CHECK();
}

void gelu_backward_inplace(bf16* d, const bf16* inp, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  gelu_backward_bf16_kernel<<<backend::grid_for(n, 256), 256, 0, stream>>>(d, inp, n);
  KILTER_CUDA_LAUNCH_CHECK();
}

void gelu_forward(float* out, const float* inp, size_t N, cudaStream_t stream) {
  if (N == 0) return;
  gelu_forward_kernel<float><<<backend::grid_for(N, 256), 256, 0, stream>>>(out, inp, N);
  KILTER_CUDA_LAUNCH_CHECK();
}

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t N, cudaStream_t stream,
                   bool accumulate) {
  if (N == 0) return;
  gelu_backward_kernel<<<backend::grid_for(N, 256), 256, 0, stream>>>(dinp, inp, dout, N, accumulate);
  KILTER_CUDA_LAUNCH_CHECK();
}

}  // namespace kilter::model::cuda
