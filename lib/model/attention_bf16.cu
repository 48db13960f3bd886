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
#include <algorithm>
#include <cmath>

#include "lib/backend/cuda_common.h"
#include "lib/backend/cuda_ops.h"
#include "lib/model/attention_index.cuh"
#include "lib/model/bf16_device.cuh"

namespace kilter::model::cuda {

namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 8;

// qkv (B,T,W) bf16 -> q, k, v (B,NH,T,hd) bf16, K/V heads copied to their query heads.
__global__ void split_heads_bf16_kernel(bf16* q, bf16* k, bf16* v, const bf16* qkv, int B, int T, int NH, int NKV,
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

// y (B,NH,T,hd) -> out (B,T,NH hd); rows t >= lengths[b] (lengths may be null) written as 0.
__global__ void merge_heads_bf16_kernel(bf16* out, const bf16* y, const int32_t* lengths, int B, int T, int NH,
                                        int hd) {
  const size_t total = static_cast<size_t>(B) * NH * T * hd;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const HeadElement e(i, T, NH, hd);
    const bool padded = lengths != nullptr && e.t >= lengths[e.b];
    out[e.token_major(T, NH, hd, 1)] = padded ? __float2bfloat16_rn(0.0f) : y[i];
  }
}

// dout (B,T,NH hd) -> dy (B,NH,T,hd).
__global__ void split_grad_bf16_kernel(bf16* dy, const bf16* dout, int B, int T, int NH, int hd) {
  const size_t total = static_cast<size_t>(B) * NH * T * hd;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    dy[i] = dout[HeadElement(i, T, NH, hd).token_major(T, NH, hd, 1)];
}

// dq, dk, dv (B,NH,T,hd) -> dqkv (B,T,W), stored; a K/V head's gradient is the fp32 sum of its
// query heads' (head order), rounded; rows t >= lengths[b] are 0.
__global__ void merge_qkv_grad_bf16_kernel(bf16* dqkv, const bf16* dq, const bf16* dk, const bf16* dv,
                                           const int32_t* lengths, int B, int T, int NH, int NKV, int hd) {
  const size_t total = static_cast<size_t>(B) * NH * T * hd;
  const int group = NH / NKV;
  const size_t head_stride = static_cast<size_t>(T) * hd;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const HeadElement e(i, T, NH, hd);
    const QkvColumns at(e, T, NH, NKV, hd);
    const bool padded = lengths != nullptr && e.t >= lengths[e.b];
    dqkv[at.row + at.q] = padded ? __float2bfloat16_rn(0.0f) : dq[i];
    if (e.h % group != 0) continue;
    float gk = 0.0f, gv = 0.0f;
    for (int r = 0; r < group && !padded; ++r) {
      gk += load_f(dk[i + r * head_stride]);
      gv += load_f(dv[i + r * head_stride]);
    }
    dqkv[at.row + at.k] = __float2bfloat16_rn(gk);
    dqkv[at.row + at.v] = __float2bfloat16_rn(gv);
  }
}

// One warp per (b,h,t) row of fp32 scores (Tk keys): att = round(softmax over keys s <= t +
// key_offset), 0 elsewhere and on rows t >= lengths[b] (lengths null: none padded).
__global__ void masked_softmax_bf16_kernel(bf16* att, const float* scores, const int32_t* lengths, int B, int NH,
                                           int T, int Tk, int key_offset) {
  const size_t row = static_cast<size_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.y;
  if (row >= static_cast<size_t>(B) * NH * T) return;
  const int lane = threadIdx.x;
  const int t = static_cast<int>(row % T);
  const int b = static_cast<int>(row / (static_cast<size_t>(NH) * T));
  const float* in = scores + row * Tk;
  bf16* out = att + row * Tk;
  if (lengths != nullptr && t >= lengths[b]) {
    for (int s = lane; s < Tk; s += kWarp) out[s] = __float2bfloat16_rn(0.0f);
    return;
  }
  const int last = t + key_offset;
  float row_max = -INFINITY;
  for (int s = lane; s <= last; s += kWarp) row_max = fmaxf(row_max, in[s]);
  row_max = warp_reduce_max(row_max);
  float sum = 0.0f;
  for (int s = lane; s <= last; s += kWarp) sum += expf(in[s] - row_max);
  const float inv_sum = 1.0f / warp_reduce_sum(sum);
  for (int s = lane; s < Tk; s += kWarp) out[s] = __float2bfloat16_rn(s <= last ? expf(in[s] - row_max) * inv_sum : 0.0f);
}

// One warp per row: dP = round(att (dS - sum(att dS)) scale) on keys s <= t + key_offset, 0
// elsewhere; dS fp32, att and dP bf16.
__global__ void masked_softmax_backward_bf16_kernel(bf16* dp, const float* ds, const bf16* att,
                                                    const int32_t* lengths, int B, int NH, int T, float scale, int Tk,
                                                    int key_offset) {
  const size_t row = static_cast<size_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.y;
  if (row >= static_cast<size_t>(B) * NH * T) return;
  const int lane = threadIdx.x;
  const int t = static_cast<int>(row % T);
  const int b = static_cast<int>(row / (static_cast<size_t>(NH) * T));
  const float* d = ds + row * Tk;
  const bf16* a = att + row * Tk;
  bf16* out = dp + row * Tk;
  if (lengths != nullptr && t >= lengths[b]) {
    for (int s = lane; s < Tk; s += kWarp) out[s] = __float2bfloat16_rn(0.0f);
    return;
  }
  const int last = t + key_offset;
  float dot = 0.0f;
  for (int s = lane; s <= last; s += kWarp) dot += load_f(a[s]) * d[s];
  dot = warp_reduce_sum(dot);
  for (int s = lane; s < Tk; s += kWarp)
    out[s] = __float2bfloat16_rn(s <= last ? load_f(a[s]) * (d[s] - dot) * scale : 0.0f);
}

// A later part: q (NH,L,hd), k and v (NH,s+L,hd) from its rows (bf16) and its prefix (fp32).
__global__ void split_prefixed_heads_bf16_kernel(bf16* q, bf16* k, bf16* v, const bf16* qkv, const float* prefix_kv,
                                                 int s, int L, int NH, int NKV, int hd) {
  const size_t total = static_cast<size_t>(NH) * (s + L) * hd;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const PrefixedElement e(i, s, L, NH, NKV, hd);
    if (e.in_prefix) {
      k[i] = __float2bfloat16_rn(prefix_kv[e.prefix_row + e.prefix_k_col]);
      v[i] = __float2bfloat16_rn(prefix_kv[e.prefix_row + e.prefix_v_col]);
    } else {
      k[i] = qkv[e.own_row + e.k_col];
      v[i] = qkv[e.own_row + e.v_col];
      q[e.q_index] = qkv[e.own_row + e.q_col];
    }
  }
}

// A later part's gradients: its own rows of dqkv stored (dq; the K/V heads' sums rounded), the
// prefix rows' fp32 sums added into prefix_dkv.
__global__ void merge_prefixed_grads_bf16_kernel(bf16* dqkv, float* prefix_dkv, const bf16* dq, const bf16* dk,
                                                 const bf16* dv, int s, int L, int NH, int NKV, int hd) {
  const size_t total = static_cast<size_t>(NH) * (s + L) * hd;
  const int group = NH / NKV;
  const size_t head_stride = static_cast<size_t>(s + L) * hd;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const PrefixedElement e(i, s, L, NH, NKV, hd);
    if (!e.in_prefix) dqkv[e.own_row + e.q_col] = dq[e.q_index];
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
      dqkv[e.own_row + e.k_col] = __float2bfloat16_rn(gk);
      dqkv[e.own_row + e.v_col] = __float2bfloat16_rn(gv);
    }
  }
}

unsigned row_blocks(int B, int NH, int T) {
  const size_t rows = static_cast<size_t>(B) * NH * T;
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

size_t align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

// A strided-batched product over `heads` heads: D (m,n) = alpha op(A) op(B), bf16 operands, D of
// type cd. Every shape of the engine has a plain bf16 kernel; a missing one is an error.
void batched(Gemm& gemm, void* D, GemmType cd, const bf16* A, const bf16* B, int m, int n, int k, bool trans_a,
             bool trans_b, float alpha, int heads, int64_t stride_a, int64_t stride_b, int64_t stride_d) {
  GemmCall call;
  call.D = D;
  call.A = A;
  call.B = B;
  call.cd = cd;
  call.m = m, call.n = n, call.k = k;
  call.trans_a = trans_a, call.trans_b = trans_b;
  call.alpha = alpha;
  call.batch = heads;
  call.stride_a = stride_a, call.stride_b = stride_b, call.stride_d = stride_d;
  KILTER_CHECK(gemm.run_typed(call), "cuBLASLt has no bf16 algorithm for an attention product m=" << m << " n=" << n
                                                                                               << " k=" << k);
}

// Rows of a group whose fp32 scores fit the budget (at least one).
int chunk_rows(int B, int T, int NH, size_t score_budget) {
  const size_t per_row = static_cast<size_t>(NH) * T * T;
  return static_cast<int>(std::max<size_t>(1, std::min<size_t>(B, score_budget / std::max<size_t>(per_row, 1))));
}

// The workspace of a group: q, k, v, y (or dy), dq, dk, dv (B T C bf16 each), then one chunk's
// fp32 scores and its bf16 dP.
struct GroupWorkspace {
  bf16 *q, *k, *v, *y, *dq, *dk, *dv, *dp;
  float* scores;
  GroupWorkspace(void* workspace, int B, int T, int C, int NH, int rows) {
    char* p = static_cast<char*>(workspace);
    const size_t slice = align256(sizeof(bf16) * B * T * C);
    bf16** slices[7] = {&q, &k, &v, &y, &dq, &dk, &dv};
    for (bf16** s : slices) *s = reinterpret_cast<bf16*>(p), p += slice;
    const size_t scores_count = static_cast<size_t>(rows) * NH * T * T;
    scores = reinterpret_cast<float*>(p);
    dp = reinterpret_cast<bf16*>(p + align256(sizeof(float) * scores_count));
  }
};

}  // namespace

size_t attention_bf16_workspace_bytes(int B, int T, int C, int NH, size_t score_budget) {
  const size_t rows = chunk_rows(B, T, NH, score_budget);
  const size_t scores = rows * NH * T * T;
  return 7 * align256(sizeof(bf16) * B * T * C) + align256(sizeof(float) * scores) + align256(sizeof(bf16) * scores);
}

void attention_bf16_forward(Gemm& gemm, bf16* out, bf16* att, const bf16* qkv, const int32_t* lengths, int B, int T,
                            int C, int NH, int NKV, void* workspace, size_t score_budget) {
  if (B == 0 || T == 0) return;
  cudaStream_t stream = gemm.stream();
  const int hd = C / NH, rows = chunk_rows(B, T, NH, score_budget);
  const GroupWorkspace w(workspace, B, T, C, NH, rows);
  const size_t n = static_cast<size_t>(B) * NH * T * hd;
  split_heads_bf16_kernel<<<backend::grid_for(n, 256), 256, 0, stream>>>(w.q, w.k, w.v, qkv, B, T, NH, NKV, hd);
  KILTER_CUDA_LAUNCH_CHECK();
  const int64_t head_stride = static_cast<int64_t>(T) * hd, score_stride = static_cast<int64_t>(T) * T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int b0 = 0; b0 < B; b0 += rows) {
    const int nb = std::min(rows, B - b0), heads = nb * NH;
    const size_t first = static_cast<size_t>(b0) * NH;  // the chunk's first head
    bf16* att_chunk = att + first * score_stride;
    // S'(s,t) = scale K'^T Q' per head, fp32.
    batched(gemm, w.scores, GemmType::f32, w.k + first * head_stride, w.q + first * head_stride, T, T, hd, true, false,
            scale, heads, head_stride, head_stride, score_stride);
    masked_softmax_bf16_kernel<<<row_blocks(nb, NH, T), dim3(kWarp, kWarpsPerBlock), 0, stream>>>(
        att_chunk, w.scores, lengths == nullptr ? nullptr : lengths + b0, nb, NH, T, T, 0);
    KILTER_CUDA_LAUNCH_CHECK();
    // y'(d,t) = V' (hd,T) att' (T,T)
    batched(gemm, w.y + first * head_stride, GemmType::bf16, w.v + first * head_stride, att_chunk, hd, T, T, false,
            false, 1.0f, heads, head_stride, score_stride, head_stride);
  }
  merge_heads_bf16_kernel<<<backend::grid_for(n, 256), 256, 0, stream>>>(out, w.y, lengths, B, T, NH, hd);
  KILTER_CUDA_LAUNCH_CHECK();
}

void attention_bf16_backward(Gemm& gemm, bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* att,
                             const int32_t* lengths, int B, int T, int C, int NH, int NKV, void* workspace,
                             size_t score_budget) {
  if (B == 0 || T == 0) return;
  cudaStream_t stream = gemm.stream();
  const int hd = C / NH, rows = chunk_rows(B, T, NH, score_budget);
  const GroupWorkspace w(workspace, B, T, C, NH, rows);
  const size_t n = static_cast<size_t>(B) * NH * T * hd;
  split_heads_bf16_kernel<<<backend::grid_for(n, 256), 256, 0, stream>>>(w.q, w.k, w.v, qkv, B, T, NH, NKV, hd);
  KILTER_CUDA_LAUNCH_CHECK();
  split_grad_bf16_kernel<<<backend::grid_for(n, 256), 256, 0, stream>>>(w.y, dout, B, T, NH, hd);
  KILTER_CUDA_LAUNCH_CHECK();
  const int64_t head_stride = static_cast<int64_t>(T) * hd, score_stride = static_cast<int64_t>(T) * T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int b0 = 0; b0 < B; b0 += rows) {
    const int nb = std::min(rows, B - b0), heads = nb * NH;
    const size_t first = static_cast<size_t>(b0) * NH;
    const bf16* att_chunk = att + first * score_stride;
    const bf16 *q = w.q + first * head_stride, *k = w.k + first * head_stride, *v = w.v + first * head_stride;
    const bf16* dy = w.y + first * head_stride;
    // dS'(s,t) = V'^T dY' (fp32); dV'(d,s) = dY' att'^T
    batched(gemm, w.scores, GemmType::f32, v, dy, T, T, hd, true, false, 1.0f, heads, head_stride, head_stride,
            score_stride);
    batched(gemm, w.dv + first * head_stride, GemmType::bf16, dy, att_chunk, hd, T, T, false, true, 1.0f, heads,
            head_stride, score_stride, head_stride);
    masked_softmax_backward_bf16_kernel<<<row_blocks(nb, NH, T), dim3(kWarp, kWarpsPerBlock), 0, stream>>>(
        w.dp, w.scores, att_chunk, lengths == nullptr ? nullptr : lengths + b0, nb, NH, T, scale, T, 0);
    KILTER_CUDA_LAUNCH_CHECK();
    // dQ'(d,t) = K' dP';  dK'(d,s) = Q' dP'^T
    batched(gemm, w.dq + first * head_stride, GemmType::bf16, k, w.dp, hd, T, T, false, false, 1.0f, heads,
            head_stride, score_stride, head_stride);
    batched(gemm, w.dk + first * head_stride, GemmType::bf16, q, w.dp, hd, T, T, false, true, 1.0f, heads,
            head_stride, score_stride, head_stride);
  }
  merge_qkv_grad_bf16_kernel<<<backend::grid_for(n, 256), 256, 0, stream>>>(dqkv, w.dq, w.dk, w.dv, lengths, B, T, NH,
                                                                            NKV, hd);
  KILTER_CUDA_LAUNCH_CHECK();
}

// ---- a later part of a cut piece: L queries against s + L keys ---------------------------------

namespace {

// q, y (dy), dq (NH L hd bf16); k, v, dk, dv (NH (s+L) hd bf16); scores (NH L (s+L) fp32), dP bf16.
struct PrefixWorkspace {
  bf16 *q, *y, *dq, *k, *v, *dk, *dv, *dp;
  float* scores;
  PrefixWorkspace(void* workspace, int s, int L, int C, int NH) {
    char* p = static_cast<char*>(workspace);
    const size_t Tk = static_cast<size_t>(s) + L;
    const size_t own = align256(sizeof(bf16) * L * C), keys = align256(sizeof(bf16) * Tk * C);
    q = reinterpret_cast<bf16*>(p), p += own;
    y = reinterpret_cast<bf16*>(p), p += own;
    dq = reinterpret_cast<bf16*>(p), p += own;
    k = reinterpret_cast<bf16*>(p), p += keys;
    v = reinterpret_cast<bf16*>(p), p += keys;
    dk = reinterpret_cast<bf16*>(p), p += keys;
    dv = reinterpret_cast<bf16*>(p), p += keys;
    scores = reinterpret_cast<float*>(p), p += align256(sizeof(float) * NH * L * Tk);
    dp = reinterpret_cast<bf16*>(p);
  }
};

void split_prefixed(const PrefixWorkspace& w, const bf16* qkv, const float* prefix_kv, int s, int L, int NH, int NKV,
                    int hd, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(NH) * (s + L) * hd;
  split_prefixed_heads_bf16_kernel<<<backend::grid_for(n, 256), 256, 0, stream>>>(w.q, w.k, w.v, qkv, prefix_kv, s, L,
                                                                                  NH, NKV, hd);
  KILTER_CUDA_LAUNCH_CHECK();
}

}  // namespace

size_t attention_prefix_bf16_workspace_bytes(int s, int L, int C, int NH) {
  const size_t Tk = static_cast<size_t>(s) + L;
  return 3 * align256(sizeof(bf16) * L * C) + 4 * align256(sizeof(bf16) * Tk * C) +
         align256(sizeof(float) * NH * L * Tk) + align256(sizeof(bf16) * NH * L * Tk);
}

void attention_prefix_bf16_forward(Gemm& gemm, bf16* out, bf16* att, const bf16* qkv, const float* prefix_kv, int s,
                                   int L, int C, int NH, int NKV, void* workspace) {
  if (L == 0) return;
  cudaStream_t stream = gemm.stream();
  const int hd = C / NH, Tk = s + L;
  const PrefixWorkspace w(workspace, s, L, C, NH);
  split_prefixed(w, qkv, prefix_kv, s, L, NH, NKV, hd, stream);
  const int64_t q_stride = static_cast<int64_t>(L) * hd, k_stride = static_cast<int64_t>(Tk) * hd;
  const int64_t score_stride = static_cast<int64_t>(L) * Tk;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // S'(j,t) = scale K'^T Q': (Tk, L) column-major = (L, Tk) row-major, as att is kept.
  batched(gemm, w.scores, GemmType::f32, w.k, w.q, Tk, L, hd, true, false, scale, NH, k_stride, q_stride, score_stride);
  masked_softmax_bf16_kernel<<<row_blocks(1, NH, L), dim3(kWarp, kWarpsPerBlock), 0, stream>>>(att, w.scores, nullptr,
                                                                                               1, NH, L, Tk, s);
  KILTER_CUDA_LAUNCH_CHECK();
  batched(gemm, w.y, GemmType::bf16, w.v, att, hd, L, Tk, false, false, 1.0f, NH, k_stride, score_stride, q_stride);
  const size_t n = static_cast<size_t>(NH) * L * hd;
  merge_heads_bf16_kernel<<<backend::grid_for(n, 256), 256, 0, stream>>>(out, w.y, nullptr, 1, L, NH, hd);
  KILTER_CUDA_LAUNCH_CHECK();
}

void attention_prefix_bf16_backward(Gemm& gemm, bf16* dqkv, float* prefix_dkv, const bf16* dout, const bf16* qkv,
                                    const float* prefix_kv, const bf16* att, int s, int L, int C, int NH, int NKV,
                                    void* workspace) {
  if (L == 0) return;
  cudaStream_t stream = gemm.stream();
  const int hd = C / NH, Tk = s + L;
  const PrefixWorkspace w(workspace, s, L, C, NH);
  split_prefixed(w, qkv, prefix_kv, s, L, NH, NKV, hd, stream);
  const size_t own = static_cast<size_t>(NH) * L * hd;
  split_grad_bf16_kernel<<<backend::grid_for(own, 256), 256, 0, stream>>>(w.y, dout, 1, L, NH, hd);
  KILTER_CUDA_LAUNCH_CHECK();
  const int64_t q_stride = static_cast<int64_t>(L) * hd, k_stride = static_cast<int64_t>(Tk) * hd;
  const int64_t score_stride = static_cast<int64_t>(L) * Tk;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  batched(gemm, w.scores, GemmType::f32, w.v, w.y, Tk, L, hd, true, false, 1.0f, NH, k_stride, q_stride, score_stride);
  batched(gemm, w.dv, GemmType::bf16, w.y, att, hd, Tk, L, false, true, 1.0f, NH, q_stride, score_stride, k_stride);
  masked_softmax_backward_bf16_kernel<<<row_blocks(1, NH, L), dim3(kWarp, kWarpsPerBlock), 0, stream>>>(
      w.dp, w.scores, att, nullptr, 1, NH, L, scale, Tk, s);
  KILTER_CUDA_LAUNCH_CHECK();
  batched(gemm, w.dq, GemmType::bf16, w.k, w.dp, hd, L, Tk, false, false, 1.0f, NH, k_stride, score_stride, q_stride);
  batched(gemm, w.dk, GemmType::bf16, w.q, w.dp, hd, Tk, L, false, true, 1.0f, NH, q_stride, score_stride, k_stride);
  const size_t n = static_cast<size_t>(NH) * Tk * hd;
  merge_prefixed_grads_bf16_kernel<<<backend::grid_for(n, 256), 256, 0, stream>>>(dqkv, prefix_dkv, w.dq, w.dk, w.dv,
                                                                                  s, L, NH, NKV, hd);
  KILTER_CUDA_LAUNCH_CHECK();
}

}  // namespace kilter::model::cuda
