// CUDA twin of lib/model/attention.cpp: causal multi-head self-attention with per-row lengths.
// qkv (B,T,3C) -> out (B,T,C); att (B,NH,T,T) keeps the softmax for backward, exactly as the CPU
// backend does, so the twin test compares att too. The products run as strided-batched cuBLASLt
// GEMMs over the B*NH heads; a masked softmax kernel applies causality, the row lengths (rows
// t >= lengths[b] are all zero, hence give zero output) and the 1/sqrt(head_dim) scale.
// A later part of a cut piece (attention_prefix_*) runs the same products with L queries against
// s + L keys (its prefix's first) and the bottom-right causal mask, on cuBLASLt whatever the engine.
// The cuBLASLt engine; attention_cudnn.cu is the cuDNN one (train.attention, docs/gpu.md). Row-major (T,hd) per head is column-major (hd,T) to cuBLAS.
#include <cmath>

#include "lib/backend/cuda_common.h"
#include "lib/backend/cuda_ops.h"
#include "lib/model/attention_index.cuh"

namespace kilter::model::cuda {

namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 8;

__device__ inline float warp_sum(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// qkv (B,T,W) -> q, k, v (B,NH,T,hd), each K/V head copied to its query heads.
__global__ void split_heads_kernel(float* q, float* k, float* v, const float* qkv, int B, int T, int NH, int NKV,
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
__global__ void merge_heads_kernel(float* out, const float* y, const int32_t* lengths, int B, int T, int NH,
                                   int hd) {
  const size_t total = static_cast<size_t>(B) * NH * T * hd;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const HeadElement e(i, T, NH, hd);
    const bool padded = lengths != nullptr && e.t >= lengths[e.b];
    out[e.token_major(T, NH, hd, 1)] = padded ? 0.0f : y[i];
  }
}

// dout (B,T,NH*hd) -> dy (B,NH,T,hd).
__global__ void split_grad_kernel(float* dy, const float* dout, int B, int T, int NH, int hd) {
  const size_t total = static_cast<size_t>(B) * NH * T * hd;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    dy[i] = dout[HeadElement(i, T, NH, hd).token_major(T, NH, hd, 1)];
  }
}

// dq, dk, dv (B,NH,T,hd) -> dqkv (B,T,W), added or stored; with lengths, rows t >= lengths[b]
// count as 0. The first query head of each K/V group writes that head's dk and dv: the sum of the
// group's query heads in head order (one head without grouping).
__global__ void merge_qkv_grad_kernel(float* dqkv, const float* dq, const float* dk, const float* dv,
                                      const int32_t* lengths, int B, int T, int NH, int NKV, int hd, bool accumulate) {
  const size_t total = static_cast<size_t>(B) * NH * T * hd;
  const int group = NH / NKV;
  const size_t head_stride = static_cast<size_t>(T) * hd;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const HeadElement e(i, T, NH, hd);
    const QkvColumns at(e, T, NH, NKV, hd);
    const bool padded = lengths != nullptr && e.t >= lengths[e.b];
    const float gq = padded ? 0.0f : dq[i];
    dqkv[at.row + at.q] = accumulate ? dqkv[at.row + at.q] + gq : gq;
    if (e.h % group != 0) continue;
    float gk = 0.0f, gv = 0.0f;
    for (int r = 0; r < group && !padded; ++r) {
      gk += dk[i + r * head_stride];
      gv += dv[i + r * head_stride];
    }
    dqkv[at.row + at.k] = accumulate ? dqkv[at.row + at.k] + gk : gk;
    dqkv[at.row + at.v] = accumulate ? dqkv[at.row + at.v] + gv : gv;
  }
}

// One warp per (b,h,t) row of preatt (already scaled; rows of Tk keys): att = softmax over the
// keys s <= t + key_offset; zero elsewhere and on rows t >= lengths[b] (lengths may be null: no
// padded rows). key_offset = 0, Tk = T: the square causal mask; a later part of a cut piece has
// Tk = key_offset + T (its prefix's keys first): the bottom-right causal mask. preatt and att may
// alias.
__global__ void masked_softmax_kernel(float* att, const float* preatt, const int32_t* lengths, int B, int NH,
                                      int T, int Tk, int key_offset) {
  const size_t row = static_cast<size_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.y;
  const size_t rows = static_cast<size_t>(B) * NH * T;
  if (row >= rows) return;
  const int lane = threadIdx.x;
  const int t = static_cast<int>(row % T);
  const int b = static_cast<int>(row / (static_cast<size_t>(NH) * T));
  const float* in = preatt + row * Tk;
  float* out = att + row * Tk;
  if (lengths != nullptr && t >= lengths[b]) {
    for (int s = lane; s < Tk; s += kWarp) out[s] = 0.0f;
    return;
  }
  const int last = t + key_offset;
  float row_max = -INFINITY;
  for (int s = lane; s <= last; s += kWarp) row_max = fmaxf(row_max, in[s]);
  row_max = warp_max(row_max);
  float sum = 0.0f;
  for (int s = lane; s <= last; s += kWarp) sum += expf(in[s] - row_max);
  const float inv_sum = 1.0f / warp_sum(sum);
  for (int s = lane; s < Tk; s += kWarp) out[s] = s <= last ? expf(in[s] - row_max) * inv_sum : 0.0f;
}

// One warp per row: dpreatt = att * (datt - sum(att * datt)) * scale on the causal, in-length
// part (keys s <= t + key_offset); zero elsewhere. In place on datt.
__global__ void masked_softmax_backward_kernel(float* datt, const float* att, const int32_t* lengths, int B,
                                               int NH, int T, float scale, int Tk, int key_offset) {
  const size_t row = static_cast<size_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.y;
  const size_t rows = static_cast<size_t>(B) * NH * T;
  if (row >= rows) return;
  const int lane = threadIdx.x;
  const int t = static_cast<int>(row % T);
  const int b = static_cast<int>(row / (static_cast<size_t>(NH) * T));
  float* d = datt + row * Tk;
  const float* a = att + row * Tk;
  if (lengths != nullptr && t >= lengths[b]) {
    for (int s = lane; s < Tk; s += kWarp) d[s] = 0.0f;
    return;
  }
  const int last = t + key_offset;
  float dot = 0.0f;
  for (int s = lane; s <= last; s += kWarp) dot += a[s] * d[s];
  dot = warp_sum(dot);
  for (int s = lane; s < Tk; s += kWarp) d[s] = s <= last ? a[s] * (d[s] - dot) * scale : 0.0f;
}

__global__ void split_prefixed_heads_kernel(float* q, float* k, float* v, const float* qkv, const float* prefix_kv,
                                            int s, int L, int NH, int NKV, int hd) {
  const size_t total = static_cast<size_t>(NH) * (s + L) * hd;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const PrefixedElement e(i, s, L, NH, NKV, hd);
    if (e.in_prefix) {
      k[i] = prefix_kv[e.prefix_row + e.prefix_k_col];
      v[i] = prefix_kv[e.prefix_row + e.prefix_v_col];
    } else {
      k[i] = qkv[e.own_row + e.k_col];
      v[i] = qkv[e.own_row + e.v_col];
      q[e.q_index] = qkv[e.own_row + e.q_col];
    }
  }
}

// The gradients of a later part: dq (NH,L,hd) added into dqkv's q columns; dk, dv (NH,s+L,hd),
// summed over each K/V head's query heads in head order by the group's first head: rows j >= s
// added into dqkv's k and v columns of row j - s, rows j < s into the prefix's gradient (s,KVW:
// dk | dv), which goes back to the ranks owning those tokens.
__global__ void merge_prefixed_grads_kernel(float* dqkv, float* prefix_dkv, const float* dq, const float* dk,
                                            const float* dv, int s, int L, int NH, int NKV, int hd) {
  const size_t total = static_cast<size_t>(NH) * (s + L) * hd;
  const int group = NH / NKV;
  const size_t head_stride = static_cast<size_t>(s + L) * hd;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const PrefixedElement e(i, s, L, NH, NKV, hd);
    if (!e.in_prefix) dqkv[e.own_row + e.q_col] += dq[e.q_index];
    if (e.h % group != 0) continue;
    float gk = 0.0f, gv = 0.0f;
    for (int r = 0; r < group; ++r) {
      gk += dk[i + r * head_stride];
      gv += dv[i + r * head_stride];
    }
    if (e.in_prefix) {
      prefix_dkv[e.prefix_row + e.prefix_k_col] += gk;
      prefix_dkv[e.prefix_row + e.prefix_v_col] += gv;
    } else {
      dqkv[e.own_row + e.k_col] += gk;
      dqkv[e.own_row + e.v_col] += gv;
    }
  }
}

unsigned row_blocks(int B, int NH, int T) {
  const size_t rows = static_cast<size_t>(B) * NH * T;
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

}  // namespace

void attention_split_heads(float* q, float* k, float* v, const float* qkv, int B, int T, int NH, int hd,
                           cudaStream_t stream, int NKV) {
  const size_t n = static_cast<size_t>(B) * T * NH * hd;
  split_heads_kernel<<<backend::grid_for(n, 256), 256, 0, stream>>>(q, k, v, qkv, B, T, NH, NKV > 0 ? NKV : NH, hd);
  KILTER_CUDA_LAUNCH_CHECK();
}

void attention_merge_heads(float* out, const float* y, int B, int T, int NH, int hd, cudaStream_t stream,
                           const int32_t* lengths) {
  const size_t n = static_cast<size_t>(B) * T * NH * hd;
  merge_heads_kernel<<<backend::grid_for(n, 256), 256, 0, stream>>>(out, y, lengths, B, T, NH, hd);
  KILTER_CUDA_LAUNCH_CHECK();
}

void attention_split_grad(float* dy, const float* dout, int B, int T, int NH, int hd, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(B) * T * NH * hd;
  split_grad_kernel<<<backend::grid_for(n, 256), 256, 0, stream>>>(dy, dout, B, T, NH, hd);
  KILTER_CUDA_LAUNCH_CHECK();
}

void attention_merge_qkv_grad(float* dqkv, const float* dq, const float* dk, const float* dv, int B, int T, int NH,
                              int hd, bool accumulate, cudaStream_t stream, const int32_t* lengths, int NKV) {
  const size_t n = static_cast<size_t>(B) * T * NH * hd;
  merge_qkv_grad_kernel<<<backend::grid_for(n, 256), 256, 0, stream>>>(dqkv, dq, dk, dv, lengths, B, T, NH,
                                                                       NKV > 0 ? NKV : NH, hd, accumulate);
  KILTER_CUDA_LAUNCH_CHECK();
}

size_t attention_workspace_floats(int B, int T, int C, int NH) {
  // q, k, v, y/dy, dq, dk, dv (B*T*C each) + one (B,NH,T,T) score matrix.
  return 7 * static_cast<size_t>(B) * T * C + static_cast<size_t>(B) * NH * T * T;
}

namespace {

// What forward and backward share: the workspace slices (q, k, v, y or dy, dq, dk, dv, then the
// scores), the batched-GEMM strides over the B*NH heads, and q, k, v split per head from qkv.
struct HeadProblem {
  int hd, heads;
  int64_t head_stride, score_stride;
  float *q, *k, *v, *y, *dq, *dk, *dv, *scores;
  HeadProblem(const char* op, const float* qkv, int B, int T, int C, int NH, int NKV, float* workspace,
              cudaStream_t stream) {
    KILTER_CHECK(C % NH == 0, op << ": n_embd " << C << " is not a multiple of n_head " << NH);
    hd = C / NH;
    heads = B * NH;
    head_stride = static_cast<int64_t>(T) * hd;
    score_stride = static_cast<int64_t>(T) * T;
    const size_t btc = static_cast<size_t>(B) * T * C;
    float* slices[8];
    for (int i = 0; i < 8; ++i) slices[i] = workspace + i * btc;
    q = slices[0], k = slices[1], v = slices[2], y = slices[3];
    dq = slices[4], dk = slices[5], dv = slices[6], scores = slices[7];
    attention_split_heads(q, k, v, qkv, B, T, NH, hd, stream, NKV);
  }
};

}  // namespace

void attention_forward(Gemm& gemm, float* out, float* att, const float* qkv, const int32_t* lengths,
                       int B, int T, int C, int NH, float* workspace, int NKV) {
  if (B == 0 || T == 0) return;
  cudaStream_t stream = gemm.stream();
  const HeadProblem p("attention_forward", qkv, B, T, C, NH, NKV, workspace, stream);
  const int hd = p.hd, heads = p.heads;
  const int64_t head_stride = p.head_stride, score_stride = p.score_stride;
  float *q = p.q, *k = p.k, *v = p.v, *y = p.y;
  // preatt'(s,t) = K'^T Q' * scale, written straight into att (softmax runs in place).
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  gemm.run(att, k, q, nullptr, T, T, hd, true, false, scale, 0.0f, nullptr, heads, head_stride, head_stride,
           score_stride);
  masked_softmax_kernel<<<row_blocks(B, NH, T), dim3(kWarp, kWarpsPerBlock), 0, stream>>>(att, att, lengths, B,
                                                                                       NH, T, T, 0);
  KILTER_CUDA_LAUNCH_CHECK();
  // y'(d,t) = V' (hd,T) att' (T,T)
  gemm.run(y, v, att, nullptr, hd, T, T, false, false, 1.0f, 0.0f, nullptr, heads, head_stride, score_stride,
           head_stride);
  attention_merge_heads(out, y, B, T, NH, hd, stream);
}

void attention_backward(Gemm& gemm, float* dqkv, const float* dout, const float* qkv, const float* att,
                        const int32_t* lengths, int B, int T, int C, int NH, float* workspace,
                        bool accumulate, int NKV) {
  if (B == 0 || T == 0) return;
  cudaStream_t stream = gemm.stream();
  const HeadProblem p("attention_backward", qkv, B, T, C, NH, NKV, workspace, stream);
  const int hd = p.hd, heads = p.heads;
  const int64_t head_stride = p.head_stride, score_stride = p.score_stride;
  float *q = p.q, *k = p.k, *v = p.v, *dy = p.y, *dq = p.dq, *dk = p.dk, *dv = p.dv, *datt = p.scores;
  attention_split_grad(dy, dout, B, T, NH, hd, stream);
  // datt'(s,t) = V'^T dY'  (datt[t][s] = dy[t] . v[s])
  gemm.run(datt, v, dy, nullptr, T, T, hd, true, false, 1.0f, 0.0f, nullptr, heads, head_stride, head_stride,
           score_stride);
  // dV'(d,s) = dY' (hd,T) att'^T  (dv[s] = sum_t att[t][s] dy[t])
  gemm.run(dv, dy, att, nullptr, hd, T, T, false, true, 1.0f, 0.0f, nullptr, heads, head_stride, score_stride,
           head_stride);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  masked_softmax_backward_kernel<<<row_blocks(B, NH, T), dim3(kWarp, kWarpsPerBlock), 0, stream>>>(
      datt, att, lengths, B, NH, T, scale, T, 0);
  KILTER_CUDA_LAUNCH_CHECK();
  // dQ'(d,t) = K' (hd,T) dP' (T,T)   (dq[t] = sum_s dP[t][s] k[s])
  gemm.run(dq, k, datt, nullptr, hd, T, T, false, false, 1.0f, 0.0f, nullptr, heads, head_stride, score_stride,
           head_stride);
  // dK'(d,s) = Q' (hd,T) dP'^T   (dk[s] = sum_t dP[t][s] q[t])
  gemm.run(dk, q, datt, nullptr, hd, T, T, false, true, 1.0f, 0.0f, nullptr, heads, head_stride, score_stride,
           head_stride);
  attention_merge_qkv_grad(dqkv, dq, dk, dv, B, T, NH, hd, accumulate, stream, nullptr, NKV);
}

// ---- a later part of a cut piece (issue 23): L queries against s + L keys -------------------

size_t attention_prefix_workspace_floats(int s, int L, int C, int NH) {
  // q, y/dy, dq (L*C each); k, v, dk, dv ((s+L)*C each); one (NH, L, s+L) score matrix.
  const size_t Tk = static_cast<size_t>(s) + L;
  return 3 * static_cast<size_t>(L) * C + 4 * Tk * C + static_cast<size_t>(NH) * L * Tk;
}

namespace {

// The workspace slices of a prefixed part and its heads split from qkv and the prefix.
struct PrefixProblem {
  int hd, Tk;
  int64_t q_stride, k_stride, score_stride;
  float *q, *k, *v, *y, *dq, *dk, *dv, *scores;
  PrefixProblem(const char* op, const float* qkv, const float* prefix_kv, int s, int L, int C, int NH, int NKV,
                float* workspace, cudaStream_t stream) {
    KILTER_CHECK(C % NH == 0, op << ": n_embd " << C << " is not a multiple of n_head " << NH);
    hd = C / NH;
    Tk = s + L;
    q_stride = static_cast<int64_t>(L) * hd;
    k_stride = static_cast<int64_t>(Tk) * hd;
    score_stride = static_cast<int64_t>(L) * Tk;
    const size_t lc = static_cast<size_t>(L) * C, kc = static_cast<size_t>(Tk) * C;
    q = workspace, y = q + lc, dq = y + lc;
    k = dq + lc, v = k + kc, dk = v + kc, dv = dk + kc;
    scores = dv + kc;
    const size_t n = static_cast<size_t>(NH) * Tk * hd;
    split_prefixed_heads_kernel<<<backend::grid_for(n, 256), 256, 0, stream>>>(q, k, v, qkv, prefix_kv, s, L, NH,
                                                                               NKV, hd);
    KILTER_CUDA_LAUNCH_CHECK();
  }
};

}  // namespace

void attention_prefix_forward(Gemm& gemm, float* out, float* att, const float* qkv, const float* prefix_kv, int s,
                              int L, int C, int NH, float* workspace, int NKV) {
  if (L == 0) return;
  cudaStream_t stream = gemm.stream();
  NKV = NKV > 0 ? NKV : NH;
  const PrefixProblem p("attention_prefix_forward", qkv, prefix_kv, s, L, C, NH, NKV, workspace, stream);
  const int hd = p.hd, Tk = p.Tk;
  // preatt'(j,t) = K'^T Q' * scale: (Tk, L) column-major = att (L, Tk) row-major.
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  gemm.run(att, p.k, p.q, nullptr, Tk, L, hd, true, false, scale, 0.0f, nullptr, NH, p.k_stride, p.q_stride,
           p.score_stride);
  masked_softmax_kernel<<<row_blocks(1, NH, L), dim3(kWarp, kWarpsPerBlock), 0, stream>>>(att, att, nullptr, 1, NH,
                                                                                       L, Tk, s);
  KILTER_CUDA_LAUNCH_CHECK();
  // y'(d,t) = V' (hd,Tk) att' (Tk,L)
  gemm.run(p.y, p.v, att, nullptr, hd, L, Tk, false, false, 1.0f, 0.0f, nullptr, NH, p.k_stride, p.score_stride,
           p.q_stride);
  attention_merge_heads(out, p.y, 1, L, NH, hd, stream);
}

void attention_prefix_backward(Gemm& gemm, float* dqkv, float* prefix_dkv, const float* dout, const float* qkv,
                               const float* prefix_kv, const float* att, int s, int L, int C, int NH,
                               float* workspace, int NKV) {
  if (L == 0) return;
  cudaStream_t stream = gemm.stream();
  NKV = NKV > 0 ? NKV : NH;
  const PrefixProblem p("attention_prefix_backward", qkv, prefix_kv, s, L, C, NH, NKV, workspace, stream);
  const int hd = p.hd, Tk = p.Tk;
  float *dy = p.y, *datt = p.scores;
  attention_split_grad(dy, dout, 1, L, NH, hd, stream);
  // datt'(j,t) = V'^T dY'
  gemm.run(datt, p.v, dy, nullptr, Tk, L, hd, true, false, 1.0f, 0.0f, nullptr, NH, p.k_stride, p.q_stride,
           p.score_stride);
  // dV'(d,j) = dY' (hd,L) att'^T (L,Tk)
  gemm.run(p.dv, dy, att, nullptr, hd, Tk, L, false, true, 1.0f, 0.0f, nullptr, NH, p.q_stride, p.score_stride,
           p.k_stride);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  masked_softmax_backward_kernel<<<row_blocks(1, NH, L), dim3(kWarp, kWarpsPerBlock), 0, stream>>>(
      datt, att, nullptr, 1, NH, L, scale, Tk, s);
  KILTER_CUDA_LAUNCH_CHECK();
  // dQ'(d,t) = K' (hd,Tk) dP' (Tk,L)
  gemm.run(p.dq, p.k, datt, nullptr, hd, L, Tk, false, false, 1.0f, 0.0f, nullptr, NH, p.k_stride, p.score_stride,
           p.q_stride);
  // dK'(d,j) = Q' (hd,L) dP'^T (L,Tk)
  gemm.run(p.dk, p.q, datt, nullptr, hd, Tk, L, false, true, 1.0f, 0.0f, nullptr, NH, p.q_stride, p.score_stride,
           p.k_stride);
  const size_t n = static_cast<size_t>(NH) * Tk * hd;
  merge_prefixed_grads_kernel<<<backend::grid_for(n, 256), 256, 0, stream>>>(dqkv, prefix_dkv, p.dq, p.dk, p.dv, s, L,
                                                                             NH, NKV, hd);
  KILTER_CUDA_LAUNCH_CHECK();
}

}  // namespace kilter::model::cuda
