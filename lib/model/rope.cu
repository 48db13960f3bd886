// CUDA twin of lib/model/rope.cpp: RoPE in place on the query and key heads of packed q|k|v rows
// (HF's rotate-half: columns i and i + hd/2 of a head turn together), each row at its position in
// its piece, from a device copy of model::RopeTable. fp32 rows, or bf16 rows rounded once after
// the turn (the bf16 datapath; twin: rope_forward then rounding, block_ops_cpu.cpp).
#include "io/base/cuda_common.h"
#include "lib/model/cuda_ops.h"
#include "lib/model/bf16_device.cuh"
#include "lib/model/piece_position.cuh"

namespace kilter::model::cuda {

namespace {

// One thread per (row, head, pair i): the NH query heads then the NKV key heads of a row W wide.
template <typename T>
__global__ void rope_kernel(T* rows, const int32_t* cu_seqlens, const int32_t* pos_offset, int pieces, int N,
                            int heads, int hd, int W, const float* cos, const float* sin, bool backward) {
  const int half = hd / 2;
  const size_t total = static_cast<size_t>(N) * heads * half;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int j = static_cast<int>(i % half);
    const size_t rest = i / half;
    const int h = static_cast<int>(rest % heads);
    const int row = static_cast<int>(rest / heads);
    const int position = position_in_piece(cu_seqlens, pos_offset, pieces, row);
    const float c = cos[static_cast<size_t>(position) * half + j], s = sin[static_cast<size_t>(position) * half + j];
    T* x1 = rows + static_cast<size_t>(row) * W + static_cast<size_t>(h) * hd + j;
    T* x2 = x1 + half;
    const float a = load_f(*x1), b = load_f(*x2);
    if (backward) {
      *x1 = store_f<T>(a * c + b * s);
      *x2 = store_f<T>(b * c - a * s);
    } else {
      *x1 = store_f<T>(a * c - b * s);
      *x2 = store_f<T>(b * c + a * s);
    }
  }
}

template <typename T>
void rope(T* rows, const int32_t* cu_seqlens, const int32_t* pos_offset, int pieces, int N, int NH, int NKV, int hd,
          const float* cos, const float* sin, bool backward, cudaStream_t stream) {
  const size_t total = static_cast<size_t>(N) * (NH + NKV) * (hd / 2);
  if (total == 0) return;
  rope_kernel<T><<<backend::grid_for(total, 256), 256, 0, stream>>>(rows, cu_seqlens, pos_offset, pieces, N, NH + NKV,
                                                                    hd, (NH + 2 * NKV) * hd, cos, sin, backward);
  KILTER_CUDA_LAUNCH_CHECK();
}

}  // namespace

void rope_forward(float* qkv, const int32_t* cu_seqlens, const int32_t* pos_offset, int pieces, int N, int NH,
                  int NKV, int hd, const float* cos, const float* sin, cudaStream_t stream) {
  rope(qkv, cu_seqlens, pos_offset, pieces, N, NH, NKV, hd, cos, sin, false, stream);
}
void rope_backward(float* dqkv, const int32_t* cu_seqlens, const int32_t* pos_offset, int pieces, int N, int NH,
                   int NKV, int hd, const float* cos, const float* sin, cudaStream_t stream) {
  rope(dqkv, cu_seqlens, pos_offset, pieces, N, NH, NKV, hd, cos, sin, true, stream);
}
void rope_forward(bf16* qkv, const int32_t* cu_seqlens, const int32_t* pos_offset, int pieces, int N, int NH, int NKV,
                  int hd, const float* cos, const float* sin, cudaStream_t stream) {
  rope(qkv, cu_seqlens, pos_offset, pieces, N, NH, NKV, hd, cos, sin, false, stream);
}
void rope_backward(bf16* dqkv, const int32_t* cu_seqlens, const int32_t* pos_offset, int pieces, int N, int NH,
                   int NKV, int hd, const float* cos, const float* sin, cudaStream_t stream) {
  rope(dqkv, cu_seqlens, pos_offset, pieces, N, NH, NKV, hd, cos, sin, true, stream);
}

}  // namespace kilter::model::cuda
