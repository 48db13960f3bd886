// CUDA twin of lib/model/attention.cpp: causal multi-head self-attention with per-row lengths.
// qkv (B,T,3C) -> out (B,T,C); att (B,NH,T,T) keeps the softmax for backward, exactly as the CPU
// backend does, so the twin test compares att too. The products run as strided-batched cuBLASLt
// GEMMs over the B*NH heads; a masked softmax kernel applies causality, the row lengths (rows
// t >= lengths[b] are all zero, hence give zero output) and the 1/sqrt(head_dim) scale.
// A later part of a cut piece (attention_prefix_*) runs the same products with L queries against
// s + L keys (its prefix's first) and the bottom-right causal mask, on cuBLASLt whatever the engine.
// The cuBLASLt engine; attention_cudnn.cu is the cuDNN one (train.attention, docs/gpu.md). Row-major (T,hd) per head is column-major (hd,T) to cuBLAS.
#include <cmath>

#include "io/base/cuda_common.h"
#include "lib/model/cuda_ops.h"
#include "lib/model/attention_kernels.cuh"

namespace kilter::model::cuda {

using namespace attention_detail;

void attention_split_heads(float* q, float* k, float* v, const float* qkv, int B, int T, int NH, int hd,
                           cudaStream_t stream, int NKV) {
  split_heads(q, k, v, qkv, B, T, NH, NKV > 0 ? NKV : NH, hd, stream);
}

void attention_merge_heads(float* out, const float* y, int B, int T, int NH, int hd, cudaStream_t stream,
                           const int32_t* lengths) {
  merge_heads(out, y, lengths, B, T, NH, hd, stream);
}

void attention_split_grad(float* dy, const float* dout, int B, int T, int NH, int hd, cudaStream_t stream) {
  split_grad(dy, dout, B, T, NH, hd, stream);
}

void attention_merge_qkv_grad(float* dqkv, const float* dq, const float* dk, const float* dv, int B, int T, int NH,
                              int hd, bool accumulate, cudaStream_t stream, const int32_t* lengths, int NKV) {
  NKV = NKV > 0 ? NKV : NH;
  if (accumulate)
    merge_qkv_grad</*kAccumulate=*/true>(dqkv, dq, dk, dv, lengths, B, T, NH, NKV, hd, stream);
  else
    merge_qkv_grad</*kAccumulate=*/false>(dqkv, dq, dk, dv, lengths, B, T, NH, NKV, hd, stream);
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
  masked_softmax(att, att, lengths, B, NH, T, T, 0, stream);
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
  masked_softmax_backward(datt, datt, att, lengths, B, NH, T, scale, T, 0, stream);
  // dQ'(d,t) = K' (hd,T) dP' (T,T)   (dq[t] = sum_s dP[t][s] k[s])
  gemm.run(dq, k, datt, nullptr, hd, T, T, false, false, 1.0f, 0.0f, nullptr, heads, head_stride, score_stride,
           head_stride);
  // dK'(d,s) = Q' (hd,T) dP'^T   (dk[s] = sum_t dP[t][s] q[t])
  gemm.run(dk, q, datt, nullptr, hd, T, T, false, true, 1.0f, 0.0f, nullptr, heads, head_stride, score_stride,
           head_stride);
  attention_merge_qkv_grad(dqkv, dq, dk, dv, B, T, NH, hd, accumulate, stream, nullptr, NKV);
}

// ---- a later part of a cut piece: L queries against s + L keys -------------------

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
    split_prefixed_heads(q, k, v, qkv, prefix_kv, s, L, NH, NKV, hd, stream);
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
  masked_softmax(att, att, nullptr, 1, NH, L, Tk, s, stream);
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
  masked_softmax_backward(datt, datt, att, nullptr, 1, NH, L, scale, Tk, s, stream);
  // dQ'(d,t) = K' (hd,Tk) dP' (Tk,L)
  gemm.run(p.dq, p.k, datt, nullptr, hd, L, Tk, false, false, 1.0f, 0.0f, nullptr, NH, p.k_stride, p.score_stride,
           p.q_stride);
  // dK'(d,j) = Q' (hd,L) dP'^T (L,Tk)
  gemm.run(p.dk, p.q, datt, nullptr, hd, Tk, L, false, true, 1.0f, 0.0f, nullptr, NH, p.q_stride, p.score_stride,
           p.k_stride);
  merge_prefixed_grads</*kAccumulate=*/true>(dqkv, prefix_dkv, p.dq, p.dk, p.dv, s, L, NH, NKV, hd, stream);
}

}  // namespace kilter::model::cuda
