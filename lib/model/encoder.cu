// CUDA twin of lib/model/encoder.cpp: token + position embedding, forward and backward.
// out (B,T,C); a negative token id is padding (position embedding only); backward skips
// positions t >= lengths[b], as the CPU does.
#include "lib/backend/cuda_common.h"
#include "lib/backend/cuda_ops.h"

namespace kilter::model::cuda {

namespace {

__global__ void encoder_forward_kernel(float* out, const int32_t* inp, const float* wte,
                                       const float* wpe, int T, int C, size_t total) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t bt = i / C;
    const int c = static_cast<int>(i % C);
    const int t = static_cast<int>(bt % T);
    const int32_t ix = inp[bt];
    float value = wpe[static_cast<size_t>(t) * C + c];
    if (ix >= 0) value += wte[static_cast<size_t>(ix) * C + c];
    out[i] = value;
  }
}

// One thread per (t, c): sums the B rows in a fixed order, so dwpe is deterministic.
__global__ void encoder_backward_wpe_kernel(float* dwpe, const float* dout, const int32_t* lengths,
                                            int B, int T, int C) {
  const size_t total = static_cast<size_t>(T) * C;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int t = static_cast<int>(i / C);
    float sum = 0.0f;
    for (int b = 0; b < B; ++b) {
      if (t < lengths[b]) sum += dout[static_cast<size_t>(b) * T * C + i];
    }
    dwpe[i] += sum;
  }
}

// Scatter-add into the token rows: several positions may share a token, hence atomics.
__global__ void encoder_backward_wte_kernel(float* dwte, const float* dout, const int32_t* inp,
                                            const int32_t* lengths, int T, int C, size_t total) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t bt = i / C;
    const int b = static_cast<int>(bt / T);
    const int t = static_cast<int>(bt % T);
    const int32_t ix = inp[bt];
    if (t < lengths[b] && ix >= 0) atomicAdd(&dwte[static_cast<size_t>(ix) * C + (i % C)], dout[i]);
  }
}

}  // namespace

void encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B, int T,
                     int C, cudaStream_t stream) {
  const size_t total = static_cast<size_t>(B) * T * C;
  if (total == 0) return;
  encoder_forward_kernel<<<backend::grid_for(total, 256), 256, 0, stream>>>(out, inp, wte, wpe, T, C, total);
  KILTER_CUDA_LAUNCH_CHECK();
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp,
                      const int32_t* lengths, int B, int T, int C, cudaStream_t stream) {
  const size_t total = static_cast<size_t>(B) * T * C;
  if (total == 0) return;
  const size_t wpe_total = static_cast<size_t>(T) * C;
  encoder_backward_wpe_kernel<<<backend::grid_for(wpe_total, 256), 256, 0, stream>>>(dwpe, dout, lengths, B, T, C);
  KILTER_CUDA_LAUNCH_CHECK();
  encoder_backward_wte_kernel<<<backend::grid_for(total, 256), 256, 0, stream>>>(dwte, dout, inp, lengths, T, C, total);
  KILTER_CUDA_LAUNCH_CHECK();
}

}  // namespace kilter::model::cuda
