// CUDA twin of lib/model/encoder.cpp: token + position embedding of a packed micro-batch,
// forward and backward. Positions restart at 0 in every piece (cu_seqlens, on the device), or
// continue from pos_offset[p] in a later part of a cut piece.
#include "io/base/cuda_common.h"
#include "lib/model/cuda_ops.h"
#include "lib/model/bf16_device.cuh"
#include "lib/model/piece_position.cuh"

namespace kilter::model::cuda {

namespace {

// out: float, or bf16 (the sum rounded once). wpe null: no position table (llama). W: the tables'
// element (the fp32 master, or the bf16 working copy), summed in fp32.
template <typename T, typename W = float>
__global__ void encoder_forward_kernel(T* out, const int32_t* inp, const W* wte, const W* wpe,
                                       const int32_t* cu_seqlens, const int32_t* pos_offset, int pieces, int C,
                                       size_t total) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int row = static_cast<int>(i / C);
    const int c = static_cast<int>(i % C);
    const float token = load_f(wte[static_cast<size_t>(inp[row]) * C + c]);
    if (wpe == nullptr) {
      out[i] = store_f<T>(token);
      continue;
    }
    const int t = position_in_piece(cu_seqlens, pos_offset, pieces, row);
    out[i] = store_f<T>(token + load_f(wpe[static_cast<size_t>(t) * C + c]));
  }
}

// One thread per (t, c): sums the pieces that reach position t in piece order, so dwpe is
// deterministic.
__global__ void encoder_backward_wpe_kernel(float* dwpe, const float* dout, const int32_t* cu_seqlens,
                                            const int32_t* pos_offset, int pieces, int max_len, int C) {
  const size_t total = static_cast<size_t>(max_len) * C;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int t = static_cast<int>(i / C);
    const int c = static_cast<int>(i % C);
    float sum = 0.0f;
    for (int p = 0; p < pieces; ++p) {
      const int first = pos_offset == nullptr ? 0 : pos_offset[p];
      const int row = cu_seqlens[p] + t - first;
      if (t >= first && row < cu_seqlens[p + 1]) sum += dout[static_cast<size_t>(row) * C + c];
    }
    dwpe[i] += sum;
  }
}

// Scatter-add into the token rows: several positions may share a token, hence atomics.
__global__ void encoder_backward_wte_kernel(float* dwte, const float* dout, const int32_t* inp, int C, size_t total) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    atomicAdd(&dwte[static_cast<size_t>(inp[i / C]) * C + (i % C)], dout[i]);
  }
}

}  // namespace

void encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, const int32_t* cu_seqlens,
                     int pieces, int N, int C, cudaStream_t stream, const int32_t* pos_offset) {
  const size_t total = static_cast<size_t>(N) * C;
  if (total == 0) return;
  encoder_forward_kernel<float><<<backend::grid_for(total, 256), 256, 0, stream>>>(out, inp, wte, wpe, cu_seqlens,
                                                                                   pos_offset, pieces, C, total);
  KILTER_CUDA_LAUNCH_CHECK();
}

void encoder_forward_bf16(bf16* out, const int32_t* inp, const float* wte, const float* wpe, const int32_t* cu_seqlens,
                          int pieces, int N, int C, cudaStream_t stream, const int32_t* pos_offset) {
  const size_t total = static_cast<size_t>(N) * C;
  if (total == 0) return;
  encoder_forward_kernel<bf16><<<backend::grid_for(total, 256), 256, 0, stream>>>(out, inp, wte, wpe, cu_seqlens,
                                                                                  pos_offset, pieces, C, total);
  KILTER_CUDA_LAUNCH_CHECK();
}

void encoder_forward_bf16(bf16* out, const int32_t* inp, const bf16* wte, const bf16* wpe, const int32_t* cu_seqlens,
                          int pieces, int N, int C, cudaStream_t stream, const int32_t* pos_offset) {
  const size_t total = static_cast<size_t>(N) * C;
  if (total == 0) return;
  encoder_forward_kernel<bf16, bf16><<<backend::grid_for(total, 256), 256, 0, stream>>>(
      out, inp, wte, wpe, cu_seqlens, pos_offset, pieces, C, total);
  KILTER_CUDA_LAUNCH_CHECK();
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, const int32_t* cu_seqlens,
                      int pieces, int N, int max_len, int C, cudaStream_t stream, const int32_t* pos_offset) {
  const size_t total = static_cast<size_t>(N) * C;
  if (total == 0) return;
  const size_t wpe_total = static_cast<size_t>(max_len) * C;
  if (dwpe != nullptr) {
    encoder_backward_wpe_kernel<<<backend::grid_for(wpe_total, 256), 256, 0, stream>>>(dwpe, dout, cu_seqlens,
                                                                                       pos_offset, pieces, max_len, C);
    KILTER_CUDA_LAUNCH_CHECK();
  }
  encoder_backward_wte_kernel<<<backend::grid_for(total, 256), 256, 0, stream>>>(dwte, dout, inp, C, total);
  KILTER_CUDA_LAUNCH_CHECK();
}

}  // namespace kilter::model::cuda
