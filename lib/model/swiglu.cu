// CUDA twin of lib/model/swiglu.cpp: SwiGLU, out = silu(gate) * up over rows gate | up, and its
// backward (overwrites), elementwise on fp32 or bf16 rows (bf16: rounded once where stored;
// twins swiglu_*_bf16 in bf16_ops.h). With s = sigmoid(g): silu'(g) = s (1 + g (1 - s)).
#include "io/base/cuda_common.h"
#include "lib/model/cuda_ops.h"
#include "lib/model/bf16_device.cuh"

namespace kilter::model::cuda {

namespace {

template <typename T>
__global__ void swiglu_forward_kernel(T* out, const T* inp, int F, size_t total) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t row = i / F, j = i % F;
    const float g = load_f(inp[row * 2 * F + j]), u = load_f(inp[row * 2 * F + F + j]);
    out[i] = store_f<T>(g * (1.0f / (1.0f + expf(-g))) * u);
  }
}

template <typename T>
__global__ void swiglu_backward_kernel(T* dinp, const T* dout, const T* inp, int F, size_t total) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t row = i / F, j = i % F;
    const float g = load_f(inp[row * 2 * F + j]), u = load_f(inp[row * 2 * F + F + j]), dy = load_f(dout[i]);
    const float s = 1.0f / (1.0f + expf(-g));
    dinp[row * 2 * F + F + j] = store_f<T>(dy * (g * s));
    dinp[row * 2 * F + j] = store_f<T>(dy * u * s * (1.0f + g * (1.0f - s)));
  }
}

template <typename T>
void forward(T* out, const T* inp, int N, int F, cudaStream_t stream) {
  const size_t total = static_cast<size_t>(N) * F;
  if (total == 0) return;
  swiglu_forward_kernel<T><<<backend::grid_for(total, 256), 256, 0, stream>>>(out, inp, F, total);
  KILTER_CUDA_LAUNCH_CHECK();
}

template <typename T>
void backward(T* dinp, const T* dout, const T* inp, int N, int F, cudaStream_t stream) {
  const size_t total = static_cast<size_t>(N) * F;
  if (total == 0) return;
  swiglu_backward_kernel<T><<<backend::grid_for(total, 256), 256, 0, stream>>>(dinp, dout, inp, F, total);
  KILTER_CUDA_LAUNCH_CHECK();
}

}  // namespace

void swiglu_forward(float* out, const float* inp, int N, int F, cudaStream_t stream) { forward(out, inp, N, F, stream); }
void swiglu_backward(float* dinp, const float* dout, const float* inp, int N, int F, cudaStream_t stream) {
  backward(dinp, dout, inp, N, F, stream);
}
void swiglu_forward(bf16* out, const bf16* inp, int N, int F, cudaStream_t stream) { forward(out, inp, N, F, stream); }
void swiglu_backward(bf16* dinp, const bf16* dout, const bf16* inp, int N, int F, cudaStream_t stream) {
  backward(dinp, dout, inp, N, F, stream);
}

}  // namespace kilter::model::cuda
