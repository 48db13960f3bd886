// The element kernels of the cuBLASLt attention engines, over fp32 rows (attention.cu) or bf16
// rows (attention_bf16.cu; Stored = float or __nv_bfloat16): q, k and v split per query head from the
// q|k|v rows and merged back, the masked softmax over a row of fp32 scores and its backward.
// Arithmetic is fp32; a bf16 result is rounded once where it is stored (bf16_device.cuh), so the
// fp32 instantiations compute exactly what the fp32 engine always has, and the bf16 ones round
// where attention_bf16.h (the twin) does. Included by .cu files only.
#pragma once
#include <cmath>
#include <cstdint>

#include "io/base/cuda_common.h"
#include "lib/model/cuda_ops.h"
#include "lib/model/attention_index.cuh"
#include "lib/model/bf16_device.cuh"

namespace kilter::model::cuda::attention_detail {
namespace {  // each including .cu file gets its own kernels

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = 256;  // the element kernels' block

// A gradient into dqkv: stored, or with accumulate added to what is there (in fp32, rounded).
template <typename Stored>
__device__ __forceinline__ void put_gradient(Stored* dst, Stored value, bool accumulate) {
  *dst = accumulate ? store_f<Stored>(load_f(*dst) + load_f(value)) : value;
}
// A K/V head's gradient, summed in fp32 over its query heads: stored or added, rounded once.
template <typename Stored>
__device__ __forceinline__ void put_gradient_sum(Stored* dst, float sum, bool accumulate) {
  *dst = store_f<Stored>(accumulate ? load_f(*dst) + sum : sum);
}

// qkv (B,T,W) -> q, k, v (B,NH,T,hd), each K/V head copied to its query heads.
template <typename Stored>
__global__ void split_heads_kernel(Stored* q, Stored* k, Stored* v, const Stored* qkv, int B, int T, int NH, int NKV,
                                   int hd) {
  const size_t total = static_cast<size_t>(B) * NH * T * hd;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const QkvColumns at(HeadElement(i, T, NH, hd), T, NH, NKV, hd);
    q[i] = qkv[at.row + at.q];
    k[i] = qkv[at.row + at.k];
    v[i] = qkv[at.row + at.v];
  }
}

// y (B,NH,T,hd) -> out (B,T,NH*hd); with lengths, rows t >= lengths[b] are written as 0
// whatever y holds there.
template <typename Stored>
__global__ void merge_heads_kernel(Stored* out, const Stored* y, const int32_t* lengths, int B, int T, int NH, int hd) {
  const size_t total = static_cast<size_t>(B) * NH * T * hd;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const HeadElement e(i, T, NH, hd);
    const bool padded = lengths != nullptr && e.t >= lengths[e.b];
    out[e.token_major(T, NH, hd, 1)] = padded ? store_f<Stored>(0.0f) : y[i];
  }
}

// dout (B,T,NH*hd) -> dy (B,NH,T,hd).
template <typename Stored>
__global__ void split_grad_kernel(Stored* dy, const Stored* dout, int B, int T, int NH, int hd) {
  const size_t total = static_cast<size_t>(B) * NH * T * hd;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    dy[i] = dout[HeadElement(i, T, NH, hd).token_major(T, NH, hd, 1)];
  }
}

// dq, dk, dv (B,NH,T,hd) -> dqkv (B,T,W), added or stored; with lengths, rows t >= lengths[b]
// count as 0. The first query head of each K/V group writes that head's dk and dv: the fp32 sum
// of the group's query heads in head order (one head without grouping).
template <typename Stored, bool kAccumulate>
__global__ void merge_qkv_grad_kernel(Stored* dqkv, const Stored* dq, const Stored* dk, const Stored* dv,
                                      const int32_t* lengths, int B, int T, int NH, int NKV, int hd) {
  const size_t total = static_cast<size_t>(B) * NH * T * hd;
  const int group = NH / NKV;
  const size_t head_stride = static_cast<size_t>(T) * hd;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const HeadElement e(i, T, NH, hd);
    const QkvColumns at(e, T, NH, NKV, hd);
    const bool padded = lengths != nullptr && e.t >= lengths[e.b];
    put_gradient(&dqkv[at.row + at.q], padded ? store_f<Stored>(0.0f) : dq[i], kAccumulate);
    if (e.h % group != 0) continue;
    float gk = 0.0f, gv = 0.0f;
    for (int r = 0; r < group && !padded; ++r) {
      gk += load_f(dk[i + r * head_stride]);
      gv += load_f(dv[i + r * head_stride]);
    }
    put_gradient_sum(&dqkv[at.row + at.k], gk, kAccumulate);
    put_gradient_sum(&dqkv[at.row + at.v], gv, kAccumulate);
  }
}

// The (b,h,t) row of scores a warp of the row kernels works on (kWarpsPerBlock rows a block);
// `inside` false past the last of the B*NH*T rows.
struct ScoreRow {
  size_t index;
  bool inside;
  int lane = 0, t = 0, b = 0;
  __device__ ScoreRow(int B, int NH, int T)
      : index(static_cast<size_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.y),
        inside(index < static_cast<size_t>(B) * NH * T) {
    if (!inside) return;
    lane = threadIdx.x;
    t = static_cast<int>(index % T);
    b = static_cast<int>(index / (static_cast<size_t>(NH) * T));
  }
  __device__ bool padded(const int32_t* lengths) const { return lengths != nullptr && t >= lengths[b]; }
};

// One warp per (b,h,t) row of fp32 scores (already scaled; rows of Tk keys): att = softmax over
// the keys s <= t + key_offset; zero elsewhere and on rows t >= lengths[b] (lengths may be null:
// no padded rows). key_offset = 0, Tk = T: the square causal mask; a later part of a cut piece
// has Tk = key_offset + T (its prefix's keys first): the bottom-right causal mask. In fp32,
// scores and att may alias.
template <typename Stored>
__global__ void masked_softmax_kernel(Stored* att, const float* scores, const int32_t* lengths, int B, int NH, int T,
                                      int Tk, int key_offset) {
  const ScoreRow row(B, NH, T);
  if (!row.inside) return;
  const int lane = row.lane;
  const float* in = scores + row.index * Tk;
  Stored* out = att + row.index * Tk;
  if (row.padded(lengths)) {
    for (int s = lane; s < Tk; s += kWarp) out[s] = store_f<Stored>(0.0f);
    return;
  }
  const int last = row.t + key_offset;
  float row_max = -INFINITY;
  for (int s = lane; s <= last; s += kWarp) row_max = fmaxf(row_max, in[s]);
  row_max = warp_reduce_max(row_max);
  float sum = 0.0f;
  for (int s = lane; s <= last; s += kWarp) sum += expf(in[s] - row_max);
  const float inv_sum = 1.0f / warp_reduce_sum(sum);
  for (int s = lane; s < Tk; s += kWarp) out[s] = store_f<Stored>(s <= last ? expf(in[s] - row_max) * inv_sum : 0.0f);
}

// One warp per row: dp = att * (ds - sum(att * ds)) * scale on the causal, in-length part (keys
// s <= t + key_offset); zero elsewhere. ds fp32; att and dp as stored (in fp32, dp may be ds).
template <typename Stored>
__global__ void masked_softmax_backward_kernel(Stored* dp, const float* ds, const Stored* att, const int32_t* lengths,
                                               int B, int NH, int T, float scale, int Tk, int key_offset) {
  const ScoreRow row(B, NH, T);
  if (!row.inside) return;
  const int lane = row.lane;
  const float* d = ds + row.index * Tk;
  const Stored* a = att + row.index * Tk;
  Stored* out = dp + row.index * Tk;
  if (row.padded(lengths)) {
    for (int s = lane; s < Tk; s += kWarp) out[s] = store_f<Stored>(0.0f);
    return;
  }
  const int last = row.t + key_offset;
  float dot = 0.0f;
  for (int s = lane; s <= last; s += kWarp) dot += load_f(a[s]) * d[s];
  dot = warp_reduce_sum(dot);
  for (int s = lane; s < Tk; s += kWarp)
    out[s] = store_f<Stored>(s <= last ? load_f(a[s]) * (d[s] - dot) * scale : 0.0f);
}

// A later part of a cut piece: q (NH,L,hd) from its own rows of qkv; k and v (NH,s+L,hd) from its
// prefix (fp32 rows from the K/V exchange, rounded where Stored is bf16) and its own rows.
template <typename Stored>
__global__ void split_prefixed_heads_kernel(Stored* q, Stored* k, Stored* v, const Stored* qkv, const float* prefix_kv,
                                            int s, int L, int NH, int NKV, int hd) {
  const size_t total = static_cast<size_t>(NH) * (s + L) * hd;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const PrefixedElement e(i, s, L, NH, NKV, hd);
    if (e.in_prefix) {
      k[i] = store_f<Stored>(prefix_kv[e.prefix_row + e.prefix_k_col]);
      v[i] = store_f<Stored>(prefix_kv[e.prefix_row + e.prefix_v_col]);
    } else {
      k[i] = qkv[e.own_row + e.k_col];
      v[i] = qkv[e.own_row + e.v_col];
      q[e.q_index] = qkv[e.own_row + e.q_col];
    }
  }
}

// The gradients of a later part: dq (NH,L,hd) into dqkv's q columns; dk, dv (NH,s+L,hd), summed
// in fp32 over each K/V head's query heads in head order by the group's first head: rows j >= s
// into dqkv's k and v columns of row j - s, rows j < s added into the prefix's gradient (s,KVW:
// dk | dv, fp32), which goes back to the ranks owning those tokens. dqkv: added (the fp32
// engine) or stored (the bf16 one).
template <typename Stored, bool kAccumulate>
__global__ void merge_prefixed_grads_kernel(Stored* dqkv, float* prefix_dkv, const Stored* dq, const Stored* dk,
                                            const Stored* dv, int s, int L, int NH, int NKV, int hd) {
  const size_t total = static_cast<size_t>(NH) * (s + L) * hd;
  const int group = NH / NKV;
  const size_t head_stride = static_cast<size_t>(s + L) * hd;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const PrefixedElement e(i, s, L, NH, NKV, hd);
    if (!e.in_prefix) put_gradient(&dqkv[e.own_row + e.q_col], dq[e.q_index], kAccumulate);
    if (e.h % group != 0) continue;
    float gk = 0.0f, gv = 0.0f;
    for (int r = 0; r < group; ++r) {
      gk += load_f(dk[i + r * head_stride]);
      gv += load_f(dv[i + r * head_stride]);
    }
    if (e.in_prefix) {
      prefix_dkv[e.prefix_row + e.prefix_k_col] += gk;
      prefix_dkv[e.prefix_row + e.prefix_v_col] += gv;
    } else {
      put_gradient_sum(&dqkv[e.own_row + e.k_col], gk, kAccumulate);
      put_gradient_sum(&dqkv[e.own_row + e.v_col], gv, kAccumulate);
    }
  }
}

// ---- launches ------------------------------------------------------------------------------

unsigned row_blocks(int B, int NH, int T) {
  const size_t rows = static_cast<size_t>(B) * NH * T;
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

unsigned element_blocks(size_t n) { return backend::grid_for(n, kThreads); }

template <typename Stored>
void split_heads(Stored* q, Stored* k, Stored* v, const Stored* qkv, int B, int T, int NH, int NKV, int hd,
                 cudaStream_t stream) {
  const size_t n = static_cast<size_t>(B) * T * NH * hd;
  split_heads_kernel<Stored><<<element_blocks(n), kThreads, 0, stream>>>(q, k, v, qkv, B, T, NH, NKV, hd);
  KILTER_CUDA_LAUNCH_CHECK();
}

template <typename Stored>
void merge_heads(Stored* out, const Stored* y, const int32_t* lengths, int B, int T, int NH, int hd,
                 cudaStream_t stream) {
  const size_t n = static_cast<size_t>(B) * T * NH * hd;
  merge_heads_kernel<Stored><<<element_blocks(n), kThreads, 0, stream>>>(out, y, lengths, B, T, NH, hd);
  KILTER_CUDA_LAUNCH_CHECK();
}

template <typename Stored>
void split_grad(Stored* dy, const Stored* dout, int B, int T, int NH, int hd, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(B) * T * NH * hd;
  split_grad_kernel<Stored><<<element_blocks(n), kThreads, 0, stream>>>(dy, dout, B, T, NH, hd);
  KILTER_CUDA_LAUNCH_CHECK();
}

template <bool kAccumulate, typename Stored>
void merge_qkv_grad(Stored* dqkv, const Stored* dq, const Stored* dk, const Stored* dv, const int32_t* lengths, int B,
                    int T, int NH, int NKV, int hd, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(B) * T * NH * hd;
  merge_qkv_grad_kernel<Stored, kAccumulate>
      <<<element_blocks(n), kThreads, 0, stream>>>(dqkv, dq, dk, dv, lengths, B, T, NH, NKV, hd);
  KILTER_CUDA_LAUNCH_CHECK();
}

template <typename Stored>
void masked_softmax(Stored* att, const float* scores, const int32_t* lengths, int B, int NH, int T, int Tk,
                    int key_offset, cudaStream_t stream) {
  masked_softmax_kernel<Stored><<<row_blocks(B, NH, T), dim3(kWarp, kWarpsPerBlock), 0, stream>>>(
      att, scores, lengths, B, NH, T, Tk, key_offset);
  KILTER_CUDA_LAUNCH_CHECK();
}

template <typename Stored>
void masked_softmax_backward(Stored* dp, const float* ds, const Stored* att, const int32_t* lengths, int B, int NH,
                             int T, float scale, int Tk, int key_offset, cudaStream_t stream) {
  masked_softmax_backward_kernel<Stored><<<row_blocks(B, NH, T), dim3(kWarp, kWarpsPerBlock), 0, stream>>>(
      dp, ds, att, lengths, B, NH, T, scale, Tk, key_offset);
  KILTER_CUDA_LAUNCH_CHECK();
}

template <typename Stored>
void split_prefixed_heads(Stored* q, Stored* k, Stored* v, const Stored* qkv, const float* prefix_kv, int s, int L,
                          int NH, int NKV, int hd, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(NH) * (s + L) * hd;
  split_prefixed_heads_kernel<Stored>
      <<<element_blocks(n), kThreads, 0, stream>>>(q, k, v, qkv, prefix_kv, s, L, NH, NKV, hd);
  KILTER_CUDA_LAUNCH_CHECK();
}

template <bool kAccumulate, typename Stored>
void merge_prefixed_grads(Stored* dqkv, float* prefix_dkv, const Stored* dq, const Stored* dk, const Stored* dv, int s,
                          int L, int NH, int NKV, int hd, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(NH) * (s + L) * hd;
  merge_prefixed_grads_kernel<Stored, kAccumulate>
      <<<element_blocks(n), kThreads, 0, stream>>>(dqkv, prefix_dkv, dq, dk, dv, s, L, NH, NKV, hd);
  KILTER_CUDA_LAUNCH_CHECK();
}

}  // namespace
}  // namespace kilter::model::cuda::attention_detail
