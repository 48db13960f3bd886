// The bf16-storage attention twin (attention_bf16.h): piece by piece, key/value head by key/value
// head, its query heads one after another, through plain fp32 GEMMs on bf16 values (exact
// products), rounded where the CUDA engine stores bf16. Written for clarity, not speed: it is
// the oracle of a device kernel, run on test-sized problems.
#include "lib/model/attention_bf16.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "lib/model/bf16_ops.h"
#include "lib/model/gemm.h"

namespace kilter::model {
namespace {

// dst (rows, hd) = the hd columns at `column` of rows `ld` floats apart.
void gather(float* dst, const float* src, int ld, int column, int rows, int hd) {
  for (int r = 0; r < rows; ++r)
    std::copy(src + static_cast<size_t>(r) * ld + column, src + static_cast<size_t>(r) * ld + column + hd,
              dst + static_cast<size_t>(r) * hd);
}

// One piece's view: L own rows of qkv, s prefix rows.
struct PieceView {
  const float* qkv;          // the piece's first row (row_width floats apart)
  const float* prefix_kv;    // s rows of kv_width (null when s = 0)
  int L, s;
};

// The keys (or values) of K/V head g: prefix rows first, then the piece's own.
void gather_keys(float* dst, const PieceView& p, const AttentionShape& shape, int g, bool values) {
  const int hd = shape.head_dim, first = g * (shape.n_head / shape.n_kv_head);
  if (p.s > 0)
    gather(dst, p.prefix_kv, shape.kv_width(), values ? shape.prefix_v_col(first) : shape.prefix_k_col(first), p.s,
           hd);
  gather(dst + static_cast<size_t>(p.s) * hd, p.qkv, shape.row_width(), values ? shape.v_col(first) : shape.k_col(first),
         p.L, hd);
}

// Row i of the causal softmax over keys 0..last of S (Lk wide), rounded, zero beyond: the CUDA
// masked softmax kernel's arithmetic (max, expf around it, times the inverse sum).
void softmax_row_bf16(float* att, const float* scores, int last, int Lk) {
  float row_max = -INFINITY;
  for (int j = 0; j <= last; ++j) row_max = std::max(row_max, scores[j]);
  float sum = 0.0f;
  for (int j = 0; j <= last; ++j) sum += std::exp(scores[j] - row_max);
  const float inv_sum = 1.0f / sum;
  for (int j = 0; j < Lk; ++j) att[j] = j <= last ? round_bf16(std::exp(scores[j] - row_max) * inv_sum) : 0.0f;
}

}  // namespace

void attention_bf16_forward(float* out, float* att, const float* qkv, const int32_t* cu_seqlens, int pieces,
                            const AttentionShape& shape, const AttentionPrefix& prefix, AttentionPieces which) {
  const int NH = shape.n_head, hd = shape.head_dim, rep = shape.n_head / shape.n_kv_head;
  const int W = shape.row_width(), Cq = shape.q_width();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> q, k, v, scores, y;
  for_each_piece(cu_seqlens, pieces, NH, prefix, which, att, [&](int p, int L, int s, float* att_piece) {
    const PieceView view{qkv + static_cast<size_t>(cu_seqlens[p]) * W, s > 0 ? prefix.kv[p] : nullptr, L, s};
    const int Lk = s + L;
    q.resize(static_cast<size_t>(L) * hd), y.resize(q.size());
    k.resize(static_cast<size_t>(Lk) * hd), v.resize(k.size());
    scores.resize(static_cast<size_t>(L) * Lk);
    float* out_p = out + static_cast<size_t>(cu_seqlens[p]) * Cq;
    for (int g = 0; g < shape.n_kv_head; ++g) {
      gather_keys(k.data(), view, shape, g, false);
      gather_keys(v.data(), view, shape, g, true);
      for (int h = g * rep; h < (g + 1) * rep; ++h) {
        gather(q.data(), view.qkv, W, shape.q_col(h), L, hd);
        sgemm_rowmajor(false, true, L, Lk, hd, scale, q.data(), hd, k.data(), hd, 0.0f, scores.data(), Lk);
        float* att_h = att_piece + static_cast<size_t>(h) * L * Lk;
        for (int i = 0; i < L; ++i)
          softmax_row_bf16(att_h + static_cast<size_t>(i) * Lk, scores.data() + static_cast<size_t>(i) * Lk, s + i, Lk);
        sgemm_rowmajor(false, false, L, hd, Lk, 1.0f, att_h, Lk, v.data(), hd, 0.0f, y.data(), hd);
        for (int i = 0; i < L; ++i)
          for (int d = 0; d < hd; ++d)
            out_p[static_cast<size_t>(i) * Cq + h * hd + d] = round_bf16(y[static_cast<size_t>(i) * hd + d]);
      }
    }
  });
}

void attention_bf16_backward(float* dqkv, const float* dout, const float* qkv, const float* att,
                             const int32_t* cu_seqlens, int pieces, const AttentionShape& shape,
                             const AttentionPrefix& prefix, AttentionPieces which) {
  const int NH = shape.n_head, hd = shape.head_dim, rep = shape.n_head / shape.n_kv_head;
  const int W = shape.row_width(), Cq = shape.q_width(), KV = shape.kv_width();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> q, k, v, dy, ds, dq, dk, dv, dk_sum, dv_sum;
  for_each_piece(cu_seqlens, pieces, NH, prefix, which, att, [&](int p, int L, int s, const float* att_piece) {
    const PieceView view{qkv + static_cast<size_t>(cu_seqlens[p]) * W, s > 0 ? prefix.kv[p] : nullptr, L, s};
    const int Lk = s + L;
    for (auto* b : {&q, &dy, &dq}) b->resize(static_cast<size_t>(L) * hd);
    for (auto* b : {&k, &v, &dk, &dv, &dk_sum, &dv_sum}) b->resize(static_cast<size_t>(Lk) * hd);
    ds.resize(static_cast<size_t>(L) * Lk);
    float* dqkv_p = dqkv + static_cast<size_t>(cu_seqlens[p]) * W;
    const float* dout_p = dout + static_cast<size_t>(cu_seqlens[p]) * Cq;
    for (int g = 0; g < shape.n_kv_head; ++g) {
      gather_keys(k.data(), view, shape, g, false);
      gather_keys(v.data(), view, shape, g, true);
      std::fill(dk_sum.begin(), dk_sum.end(), 0.0f);
      std::fill(dv_sum.begin(), dv_sum.end(), 0.0f);
      for (int h = g * rep; h < (g + 1) * rep; ++h) {
        gather(q.data(), view.qkv, W, shape.q_col(h), L, hd);
        gather(dy.data(), dout_p, Cq, h * hd, L, hd);
        const float* att_h = att_piece + static_cast<size_t>(h) * L * Lk;
        sgemm_rowmajor(false, true, L, Lk, hd, 1.0f, dy.data(), hd, v.data(), hd, 0.0f, ds.data(), Lk);
        sgemm_rowmajor(true, false, Lk, hd, L, 1.0f, att_h, Lk, dy.data(), hd, 0.0f, dv.data(), hd);
        round_bf16_inplace(dv.data(), dv.size());
        for (int i = 0; i < L; ++i) {
          const float* a = att_h + static_cast<size_t>(i) * Lk;
          float* d = ds.data() + static_cast<size_t>(i) * Lk;
          const int last = s + i;
          float dot = 0.0f;
          for (int j = 0; j <= last; ++j) dot += a[j] * d[j];
          for (int j = 0; j < Lk; ++j) d[j] = j <= last ? round_bf16(a[j] * (d[j] - dot) * scale) : 0.0f;
        }
        sgemm_rowmajor(false, false, L, hd, Lk, 1.0f, ds.data(), Lk, k.data(), hd, 0.0f, dq.data(), hd);
        sgemm_rowmajor(true, false, Lk, hd, L, 1.0f, ds.data(), Lk, q.data(), hd, 0.0f, dk.data(), hd);
        round_bf16_inplace(dk.data(), dk.size());
        for (int i = 0; i < L; ++i)
          for (int d = 0; d < hd; ++d)
            dqkv_p[static_cast<size_t>(i) * W + shape.q_col(h) + d] = round_bf16(dq[static_cast<size_t>(i) * hd + d]);
        for (size_t i = 0; i < dk_sum.size(); ++i) dk_sum[i] += dk[i], dv_sum[i] += dv[i];
      }
      const int first = g * rep;
      for (int j = 0; j < Lk; ++j)
        for (int d = 0; d < hd; ++d) {
          const float gk = dk_sum[static_cast<size_t>(j) * hd + d], gv = dv_sum[static_cast<size_t>(j) * hd + d];
          if (j < s) {
            prefix.dkv[p][static_cast<size_t>(j) * KV + shape.prefix_k_col(first) + d] += gk;
            prefix.dkv[p][static_cast<size_t>(j) * KV + shape.prefix_v_col(first) + d] += gv;
          } else {
            float* row = dqkv_p + static_cast<size_t>(j - s) * W;
            row[shape.k_col(first) + d] = round_bf16(gk);
            row[shape.v_col(first) + d] = round_bf16(gv);
          }
        }
    }
  });
}

}  // namespace kilter::model
