// The cuBLASLt attention engine on bf16 rows (the bf16 datapath, train.bf16_storage; twin:
// lib/model/attention_bf16.h, whose rounding points it has). Per padded (B,T) attention group:
// q, k, v split per query head from the bf16 q|k|v rows (K/V heads copied to their query heads:
// grouped-query attention as attention.cu does it), then, a chunk of the group's rows at a time,
//   S = scale K^T Q (bf16 operands, fp32 scores), att = round(softmax(S)) (saved, bf16),
//   y = att V (bf16), and in the backward dS = V^T dY (fp32), dV = dY att^T, dP = round(att
//   (dS - rowsum(att dS)) scale), dQ = dP K, dK = dP^T Q (bf16),
// and the merges back into the token-major rows (a K/V head's dK, dV summed over its query heads
// in fp32, rounded once). The fp32 scores exist for one chunk of rows at a time: the workspace is
// bounded by score_budget whatever the group's size. A later part of a cut piece runs the same
// products against its prefix (fp32 rows from the K/V exchange) with the bottom-right causal mask.
// The splits, merges and softmax kernels are the fp32 engine's (attention_kernels.cuh) on bf16.
#include <algorithm>
#include <cmath>

#include "io/base/cuda_common.h"
#include "lib/model/cuda_ops.h"
#include "lib/model/attention_kernels.cuh"
#include "lib/model/gemm_call.h"

namespace kilter::model::cuda {

namespace {

using namespace attention_detail;
using namespace scratch_detail;  // align256, chunk_rows

// A strided-batched product over `heads` heads: D (m,n) = alpha op(A) op(B), bf16 operands, D of
// type cd. Every shape of the engine has a plain bf16 kernel; a missing one is an error.
void batched(Gemm& gemm, void* D, GemmType cd, const bf16* A, const bf16* B, int m, int n, int k, bool trans_a,
             bool trans_b, float alpha, int heads, int64_t stride_a, int64_t stride_b, int64_t stride_d) {
  GemmCall call = gemm_call(D, A, B, m, n, k, trans_a, trans_b);
  call.cd = cd;
  call.alpha = alpha;
  call.batch = heads;
  call.stride_a = stride_a, call.stride_b = stride_b, call.stride_d = stride_d;
  KILTER_CHECK(gemm.run_typed(call), "cuBLASLt has no bf16 algorithm for an attention product m=" << m << " n=" << n
                                                                                               << " k=" << k);
}

// What forward and backward of a group share: the workspace slices (q, k, v, y or dy, dq, dk, dv:
// B T C bf16 each; then one chunk's fp32 scores and its bf16 dP), the batched-GEMM strides, the
// chunk's rows, and q, k, v split per head from qkv.
struct GroupProblem {
  int hd, rows;
  int64_t head_stride, score_stride;
  float scale;
  bf16 *q, *k, *v, *y, *dq, *dk, *dv, *dp;
  float* scores;
  GroupProblem(void* workspace, const bf16* qkv, int B, int T, int C, int NH, int NKV, size_t score_budget,
               cudaStream_t stream)
      : hd(C / NH),
        rows(chunk_rows(B, T, NH, score_budget)),
        head_stride(static_cast<int64_t>(T) * hd),
        score_stride(static_cast<int64_t>(T) * T),
        scale(1.0f / std::sqrt(static_cast<float>(hd))) {
    char* p = static_cast<char*>(workspace);
    const size_t slice = align256(sizeof(bf16) * B * T * C);
    bf16** slices[7] = {&q, &k, &v, &y, &dq, &dk, &dv};
    for (bf16** s : slices) *s = reinterpret_cast<bf16*>(p), p += slice;
    const size_t scores_count = static_cast<size_t>(rows) * NH * T * T;
    scores = reinterpret_cast<float*>(p);
    dp = reinterpret_cast<bf16*>(p + align256(sizeof(float) * scores_count));
    split_heads(q, k, v, qkv, B, T, NH, NKV, hd, stream);
  }
};

}  // namespace

void attention_bf16_forward(Gemm& gemm, bf16* out, bf16* att, const bf16* qkv, const int32_t* lengths, int B, int T,
                            int C, int NH, int NKV, void* workspace, size_t score_budget) {
  if (B == 0 || T == 0) return;
  cudaStream_t stream = gemm.stream();
  const GroupProblem p(workspace, qkv, B, T, C, NH, NKV, score_budget, stream);
  const int hd = p.hd, rows = p.rows;
  const int64_t head_stride = p.head_stride, score_stride = p.score_stride;
  for (int b0 = 0; b0 < B; b0 += rows) {
    const int nb = std::min(rows, B - b0), heads = nb * NH;
    const size_t first = static_cast<size_t>(b0) * NH;  // the chunk's first head
    bf16* att_chunk = att + first * score_stride;
    // S'(s,t) = scale K'^T Q' per head, fp32.
    batched(gemm, p.scores, GemmType::f32, p.k + first * head_stride, p.q + first * head_stride, T, T, hd, true, false,
            p.scale, heads, head_stride, head_stride, score_stride);
    masked_softmax(att_chunk, p.scores, lengths == nullptr ? nullptr : lengths + b0, nb, NH, T, T, 0, stream);
    // y'(d,t) = V' (hd,T) att' (T,T)
    batched(gemm, p.y + first * head_stride, GemmType::bf16, p.v + first * head_stride, att_chunk, hd, T, T, false,
            false, 1.0f, heads, head_stride, score_stride, head_stride);
  }
  merge_heads(out, p.y, lengths, B, T, NH, hd, stream);
}

void attention_bf16_backward(Gemm& gemm, bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* att,
                             const int32_t* lengths, int B, int T, int C, int NH, int NKV, void* workspace,
                             size_t score_budget) {
  if (B == 0 || T == 0) return;
  cudaStream_t stream = gemm.stream();
  const GroupProblem p(workspace, qkv, B, T, C, NH, NKV, score_budget, stream);
  const int hd = p.hd, rows = p.rows;
  const int64_t head_stride = p.head_stride, score_stride = p.score_stride;
  split_grad(p.y, dout, B, T, NH, hd, stream);
  for (int b0 = 0; b0 < B; b0 += rows) {
    const int nb = std::min(rows, B - b0), heads = nb * NH;
    const size_t first = static_cast<size_t>(b0) * NH;
    const bf16* att_chunk = att + first * score_stride;
    const bf16 *q = p.q + first * head_stride, *k = p.k + first * head_stride, *v = p.v + first * head_stride;
    const bf16* dy = p.y + first * head_stride;
    // dS'(s,t) = V'^T dY' (fp32); dV'(d,s) = dY' att'^T
    batched(gemm, p.scores, GemmType::f32, v, dy, T, T, hd, true, false, 1.0f, heads, head_stride, head_stride,
            score_stride);
    batched(gemm, p.dv + first * head_stride, GemmType::bf16, dy, att_chunk, hd, T, T, false, true, 1.0f, heads,
            head_stride, score_stride, head_stride);
    masked_softmax_backward(p.dp, p.scores, att_chunk, lengths == nullptr ? nullptr : lengths + b0, nb, NH, T, p.scale,
                            T, 0, stream);
    // dQ'(d,t) = K' dP';  dK'(d,s) = Q' dP'^T
    batched(gemm, p.dq + first * head_stride, GemmType::bf16, k, p.dp, hd, T, T, false, false, 1.0f, heads,
            head_stride, score_stride, head_stride);
    batched(gemm, p.dk + first * head_stride, GemmType::bf16, q, p.dp, hd, T, T, false, true, 1.0f, heads,
            head_stride, score_stride, head_stride);
  }
  merge_qkv_grad</*kAccumulate=*/false>(dqkv, p.dq, p.dk, p.dv, lengths, B, T, NH, NKV, hd, stream);
}

// ---- a later part of a cut piece: L queries against s + L keys ---------------------------------

namespace {

// What forward and backward of a later part share: the workspace slices (q, y or dy, dq: NH L hd
// bf16 each; k, v, dk, dv: NH (s+L) hd bf16 each; the scores NH L (s+L) fp32, then dP bf16), the
// batched-GEMM strides, and its heads split from its rows and its prefix.
struct PrefixProblem {
  int hd, Tk;
  int64_t q_stride, k_stride, score_stride;
  float scale;
  bf16 *q, *y, *dq, *k, *v, *dk, *dv, *dp;
  float* scores;
  PrefixProblem(void* workspace, const bf16* qkv, const float* prefix_kv, int s, int L, int C, int NH, int NKV,
                cudaStream_t stream)
      : hd(C / NH),
        Tk(s + L),
        q_stride(static_cast<int64_t>(L) * hd),
        k_stride(static_cast<int64_t>(Tk) * hd),
        score_stride(static_cast<int64_t>(L) * Tk),
        scale(1.0f / std::sqrt(static_cast<float>(hd))) {
    char* p = static_cast<char*>(workspace);
    const size_t own = align256(sizeof(bf16) * L * C), keys = align256(sizeof(bf16) * static_cast<size_t>(Tk) * C);
    q = reinterpret_cast<bf16*>(p), p += own;
    y = reinterpret_cast<bf16*>(p), p += own;
    dq = reinterpret_cast<bf16*>(p), p += own;
    k = reinterpret_cast<bf16*>(p), p += keys;
    v = reinterpret_cast<bf16*>(p), p += keys;
    dk = reinterpret_cast<bf16*>(p), p += keys;
    dv = reinterpret_cast<bf16*>(p), p += keys;
    scores = reinterpret_cast<float*>(p), p += align256(sizeof(float) * NH * L * Tk);
    dp = reinterpret_cast<bf16*>(p);
    split_prefixed_heads(q, k, v, qkv, prefix_kv, s, L, NH, NKV, hd, stream);
  }
};

}  // namespace

void attention_prefix_bf16_forward(Gemm& gemm, bf16* out, bf16* att, const bf16* qkv, const float* prefix_kv, int s,
                                   int L, int C, int NH, int NKV, void* workspace) {
  if (L == 0) return;
  cudaStream_t stream = gemm.stream();
  const PrefixProblem p(workspace, qkv, prefix_kv, s, L, C, NH, NKV, stream);
  const int hd = p.hd, Tk = p.Tk;
  // S'(j,t) = scale K'^T Q': (Tk, L) column-major = (L, Tk) row-major, as att is kept.
  batched(gemm, p.scores, GemmType::f32, p.k, p.q, Tk, L, hd, true, false, p.scale, NH, p.k_stride, p.q_stride,
          p.score_stride);
  masked_softmax(att, p.scores, nullptr, 1, NH, L, Tk, s, stream);
  batched(gemm, p.y, GemmType::bf16, p.v, att, hd, L, Tk, false, false, 1.0f, NH, p.k_stride, p.score_stride,
          p.q_stride);
  merge_heads(out, p.y, nullptr, 1, L, NH, hd, stream);
}

void attention_prefix_bf16_backward(Gemm& gemm, bf16* dqkv, float* prefix_dkv, const bf16* dout, const bf16* qkv,
                                    const float* prefix_kv, const bf16* att, int s, int L, int C, int NH, int NKV,
                                    void* workspace) {
  if (L == 0) return;
  cudaStream_t stream = gemm.stream();
  const PrefixProblem p(workspace, qkv, prefix_kv, s, L, C, NH, NKV, stream);
  const int hd = p.hd, Tk = p.Tk;
  split_grad(p.y, dout, 1, L, NH, hd, stream);
  batched(gemm, p.scores, GemmType::f32, p.v, p.y, Tk, L, hd, true, false, 1.0f, NH, p.k_stride, p.q_stride,
          p.score_stride);
  batched(gemm, p.dv, GemmType::bf16, p.y, att, hd, Tk, L, false, true, 1.0f, NH, p.q_stride, p.score_stride,
          p.k_stride);
  masked_softmax_backward(p.dp, p.scores, att, nullptr, 1, NH, L, p.scale, Tk, s, stream);
  batched(gemm, p.dq, GemmType::bf16, p.k, p.dp, hd, L, Tk, false, false, 1.0f, NH, p.k_stride, p.score_stride,
          p.q_stride);
  batched(gemm, p.dk, GemmType::bf16, p.q, p.dp, hd, Tk, L, false, true, 1.0f, NH, p.q_stride, p.score_stride,
          p.k_stride);
  merge_prefixed_grads</*kAccumulate=*/false>(dqkv, prefix_dkv, p.dq, p.dk, p.dv, s, L, NH, NKV, hd, stream);
}

}  // namespace kilter::model::cuda
