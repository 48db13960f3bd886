// Causal attention forward/backward (shapes in attention.h), one (piece, head) at a time through
// gemm.h. Query rows go in blocks of kQueryBlock; a block only multiplies against the keys it can
// see (0 .. its last row), so the GEMMs do about half of the full L x L work, as the causal mask
// allows, while staying large enough to run near the engine's peak.
// Each head's q, k, v (and dout) are first copied into contiguous buffers of the GEMM's input type
// (fp32, or bf16 under train.precision=bf16) whose rows are padded with zeros to a multiple of
// kPadRows, and a block of rows r0..r1 is computed as Mp = r1 - r0 rounded up to kPadRows query
// rows against r0 + Mp keys, into fp32 scratch. Contiguous operands run faster than the strided
// views of qkv (GPT-2 124M shape, fp32: attention GEMMs 72 -> 94 GFLOP/s in the step), and the
// GEMM shapes depend on the context only (about context / kPadRows per product), not on the piece
// lengths, so bf16 matmul primitives, cached per shape and stride, are reused across pieces of any
// length; a short piece computes at most kPadRows - 1 extra rows.
// A piece with a prefix of s earlier tokens (a later part of a cut piece) packs its keys and
// values as [zero rows up to a multiple of kPadRows; prefix; own] and its block r0..r1 multiplies
// against those rows up to its last query's: the same code with the key range shifted (uncut
// pieces run exactly the shapes above), and the zero rows' scores masked. The padding keeps the
// GEMM widths multiples of kPadRows, so the shapes of later parts form a set bounded by the
// context (about context / kPadRows widths per product) whatever s is, and their bf16 primitives
// are created once rather than for every new s (without the padding, on a 512-token part with
// 12 heads of 64, a new s each call took 0.167 s per forward + backward against 0.121 s with
// cached shapes, on this 2-vCPU machine under load).
#include "lib/model/attention.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <type_traits>
#include <vector>

#include "lib/model/gemm.h"
#include "lib/model/vecmath.h"

#pragma GCC diagnostic ignored "-Wpsabi"  // 8-lane helpers are inlined; no ABI crosses them

namespace kilter::model {
namespace {

constexpr int kQueryBlock = 64;
constexpr int kPadRows = 16;  // head rows and a block's last rows are padded to this multiple (see above)

// Softmax of scores[0..=i] in place; scores (i, end) are set to 0 so that the following GEMM
// over the whole block width sees exact zeros for the masked (future) keys.
KILTER_SIMD_CLONES
void causal_softmax_row(float* scores, int i, int end) {
  const int n = i + 1;
  const float max_score = lane_max(scores, n);
  int j = 0;
  for (; j + kVec <= n; j += kVec) store8(scores + j, fast_exp8(load8(scores + j) - splat8(max_score)));
  for (; j < n; ++j) scores[j] = fast_expf(scores[j] - max_score);
  const float inv_sum = 1.0f / lane_sum(scores, n);
  for (int j = 0; j < n; ++j) scores[j] *= inv_sum;
  for (j = n; j < end; ++j) scores[j] = 0.0f;
}

// d_scores = att * (d_att - sum(att * d_att)) * scale over [0..=i]; (i, end) set to 0.
KILTER_SIMD_CLONES
void causal_softmax_backward_row(float* d_scores, const float* att_row, int i, int end, float scale) {
  const int n = i + 1;
  const float dot = lane_dot(att_row, d_scores, n);
  for (int j = 0; j < n; ++j) d_scores[j] = att_row[j] * (d_scores[j] - dot) * scale;
  for (int j = n; j < end; ++j) d_scores[j] = 0.0f;
}

}  // namespace

size_t attention_saved_floats(const int32_t* cu_seqlens, int pieces, int NH, const int32_t* pos_offset) {
  size_t floats = 0;
  for (int p = 0; p < pieces; ++p) {
    const size_t len = static_cast<size_t>(cu_seqlens[p + 1] - cu_seqlens[p]);
    const size_t prefix = pos_offset == nullptr ? 0 : static_cast<size_t>(pos_offset[p]);
    floats += len * (prefix + len);
  }
  return floats * NH;
}

namespace {

int padded_rows(int L) { return (L + kPadRows - 1) / kPadRows * kPadRows; }

// The packed path's element type T: float (fp32) or bf16 (train.precision=bf16).
template <typename T>
void gemm_t(bool ta, bool tb, int M, int N, int K, float alpha, const T* A, int lda, const T* B, int ldb, float beta,
            float* C, int ldc) {
  if constexpr (std::is_same_v<T, float>)
    sgemm_rowmajor(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else
    gemm_bf16_rowmajor(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// dst (rows, cols) at row stride ld_dst = src (row stride ld_src), converted to T.
template <typename T>
void copy_rows(T* dst, size_t ld_dst, const float* src, size_t ld_src, int rows, int cols) {
  if constexpr (std::is_same_v<T, float>) {
    for (int r = 0; r < rows; ++r) std::memcpy(dst + r * ld_dst, src + r * ld_src, sizeof(float) * cols);
  } else {
    to_bf16_rows(dst, ld_dst, src, ld_src, rows, cols);
  }
}

// fp32 rows (rows, cols) as the GEMM's input T: themselves in fp32, else converted into `converted`.
template <typename T>
T* gemm_input(std::vector<T>& converted, std::vector<float>& fp32, int rows, int cols) {
  if constexpr (std::is_same_v<T, float>) return fp32.data();
  copy_rows(converted.data(), cols, fp32.data(), cols, rows, cols);
  return converted.data();
}

// dst (Lpad, hs) = rows [0, L) of the hs columns at src (row stride ld); rows [L, Lpad) zero.
template <typename T>
void pack_head(T* dst, const float* src, int ld, int L, int Lpad, int hs) {
  copy_rows(dst, static_cast<size_t>(hs), src, static_cast<size_t>(ld), L, hs);
  std::fill(dst + static_cast<size_t>(L) * hs, dst + static_cast<size_t>(Lpad) * hs, T{0});
}

// dst rows [0, L) at row stride ld, hs columns, += src (L, hs) contiguous.
void add_head(float* dst, int ld, const float* src, int L, int hs) {
  for (int i = 0; i < L; ++i) {
    float* d = dst + static_cast<size_t>(i) * ld;
    const float* x = src + static_cast<size_t>(i) * hs;
    for (int j = 0; j < hs; ++j) d[j] += x[j];
  }
}

// dst (pad + s + Lpad, hs): rows [0, pad) zero, rows [pad, pad + s) = the hs columns at `column`
// of the prefix (s rows of kv_width: k | v), then the piece's own L rows (pack_head, row stride
// row_width), the rest zero.
template <typename T>
void pack_keys(T* dst, int pad, const float* prefix, int column, int s, const float* own, int L, int Lpad,
               const AttentionShape& shape) {
  const int hs = shape.head_dim;
  std::fill(dst, dst + static_cast<size_t>(pad) * hs, T{0});
  if (s > 0)
    copy_rows(dst + static_cast<size_t>(pad) * hs, static_cast<size_t>(hs), prefix + column,
              static_cast<size_t>(shape.kv_width()), s, hs);
  pack_head(dst + static_cast<size_t>(pad + s) * hs, own, shape.row_width(), L, Lpad, hs);
}

// Rows of zero keys before a prefix of s keys, so that the prefix ends on a kPadRows boundary
// and the GEMM widths stay multiples of kPadRows, the shapes uncut pieces use.
int prefix_padding(int s) { return (kPadRows - s % kPadRows) % kPadRows; }

// Piece by piece, head by head: its keys (and values) are [pad zero rows; prefix s rows; own L
// rows], and query i sees the piece's keys 0 .. s+i, buffer rows pad .. pad+s+i. A query block
// r0..r1 multiplies against buffer rows 0 .. pad+s+r0+Mp; the pad columns of its scores are
// masked. With s = 0 (pad = 0) this is the plain packed attention, shape for shape.
template <typename T>
void attention_forward_packed(float* out, float* att, const float* qkv, const int32_t* cu_seqlens, int pieces,
                              const AttentionShape& shape, const AttentionPrefix& prefix, AttentionPieces which) {
  const int NH = shape.n_head, hs = shape.head_dim;
  const int C = shape.q_width(), C3 = shape.row_width();
  const int B = kQueryBlock;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  thread_local std::vector<T> qb, kb, vb, pb;
  thread_local std::vector<float> scores, ob;
  for_each_piece(cu_seqlens, pieces, NH, prefix, which, att, [&](int p, int L, int s, float* att_piece) {
    const int Lk = s + L;  // keys of the piece's saved softmax rows
    const int Lp = padded_rows(L);
    const int pad = prefix_padding(s), first_own = pad + s;  // buffer rows of the piece's key 0 and key s
    const int Kp = first_own + Lp;
    const size_t q_elems = static_cast<size_t>(Lp) * hs, k_elems = static_cast<size_t>(Kp) * hs;
    if (qb.size() < q_elems) qb.resize(q_elems);
    if (kb.size() < k_elems) kb.resize(k_elems), vb.resize(k_elems);
    if (scores.size() < static_cast<size_t>(B) * Kp) {
      scores.resize(static_cast<size_t>(B) * Kp);
      if constexpr (!std::is_same_v<T, float>) pb.resize(scores.size());  // fp32 multiplies scores in place
    }
    ob.resize(static_cast<size_t>(B) * hs);
    const float* qkv_p = qkv + static_cast<size_t>(cu_seqlens[p]) * C3;
    const float* prefix_kv = s > 0 ? prefix.kv[p] : nullptr;
    float* out_p = out + static_cast<size_t>(cu_seqlens[p]) * C;
    for (int h = 0; h < NH; ++h) {
      pack_head(qb.data(), qkv_p + shape.q_col(h), C3, L, Lp, hs);
      pack_keys(kb.data(), pad, prefix_kv, shape.prefix_k_col(h), s, qkv_p + shape.k_col(h), L, Lp, shape);
      pack_keys(vb.data(), pad, prefix_kv, shape.prefix_v_col(h), s, qkv_p + shape.v_col(h), L, Lp, shape);
      float* att_ph = att_piece + static_cast<size_t>(h) * L * Lk;
      for (int r0 = 0; r0 < L; r0 += B) {
        const int r1 = std::min(r0 + B, L);
        const int rows = r1 - r0;
        const int Mp = padded_rows(rows);
        const int width = first_own + r0 + Mp;  // key rows the block multiplies against
        // scores (Mp, width) = scale * q[r0:r0+Mp] @ k[0:width]^T
        gemm_t(false, true, Mp, width, hs, scale, qb.data() + static_cast<size_t>(r0) * hs, hs, kb.data(), hs, 0.0f,
               scores.data(), width);
        for (int i = r0; i < r1; ++i) {
          float* row = scores.data() + static_cast<size_t>(i - r0) * width;
          std::fill(row, row + pad, 0.0f);
          causal_softmax_row(row + pad, s + i, width - pad);
          std::memcpy(att_ph + static_cast<size_t>(i) * Lk, row + pad, sizeof(float) * (s + r1));
        }
        // The softmax as T, padded rows zero (fp32: in place).
        T* probs = gemm_input(pb, scores, rows, width);
        std::fill(probs + static_cast<size_t>(rows) * width, probs + static_cast<size_t>(Mp) * width, T{0});
        // o (Mp, hs) = softmax @ v[0:width]
        gemm_t(false, false, Mp, hs, width, 1.0f, probs, width, vb.data(), hs, 0.0f, ob.data(), hs);
        for (int i = 0; i < rows; ++i)
          std::memcpy(out_p + static_cast<size_t>(r0 + i) * C + h * hs, ob.data() + static_cast<size_t>(i) * hs,
                      sizeof(float) * hs);
      }
    }
  });
}

template <typename T>
void attention_backward_packed(float* dqkv, const float* dout, const float* qkv, const float* att,
                               const int32_t* cu_seqlens, int pieces, const AttentionShape& shape,
                               const AttentionPrefix& prefix, AttentionPieces which) {
  const int NH = shape.n_head, hs = shape.head_dim;
  const int C = shape.q_width(), C3 = shape.row_width();
  const int B = kQueryBlock;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  thread_local std::vector<T> qb, kb, vb, dob, ab, dsb;
  thread_local std::vector<float> ds, dq, dk, dv;
  for_each_piece(cu_seqlens, pieces, NH, prefix, which, att, [&](int p, int L, int s, const float* att_piece) {
    const int Lk = s + L;
    const int Lp = padded_rows(L);
    const int pad = prefix_padding(s), first_own = pad + s;
    const int Kp = first_own + Lp;
    const size_t q_elems = static_cast<size_t>(Lp) * hs, k_elems = static_cast<size_t>(Kp) * hs;
    if (qb.size() < q_elems) {
      for (auto* v : {&qb, &dob}) v->resize(q_elems);
      dq.resize(q_elems);
    }
    if (kb.size() < k_elems) {
      for (auto* v : {&kb, &vb}) v->resize(k_elems);
      for (auto* v : {&dk, &dv}) v->resize(k_elems);
    }
    if (ds.size() < static_cast<size_t>(B) * Kp) {
      ds.resize(static_cast<size_t>(B) * Kp);
      ab.resize(ds.size());
      if constexpr (!std::is_same_v<T, float>) dsb.resize(ds.size());  // fp32 multiplies ds in place
    }
    const float* qkv_p = qkv + static_cast<size_t>(cu_seqlens[p]) * C3;
    const float* prefix_kv = s > 0 ? prefix.kv[p] : nullptr;
    float* prefix_dkv = s > 0 ? prefix.dkv[p] : nullptr;
    float* dqkv_p = dqkv + static_cast<size_t>(cu_seqlens[p]) * C3;
    const float* dout_p = dout + static_cast<size_t>(cu_seqlens[p]) * C;
    for (int h = 0; h < NH; ++h) {
      pack_head(qb.data(), qkv_p + shape.q_col(h), C3, L, Lp, hs);
      pack_keys(kb.data(), pad, prefix_kv, shape.prefix_k_col(h), s, qkv_p + shape.k_col(h), L, Lp, shape);
      pack_keys(vb.data(), pad, prefix_kv, shape.prefix_v_col(h), s, qkv_p + shape.v_col(h), L, Lp, shape);
      pack_head(dob.data(), dout_p + h * hs, C, L, Lp, hs);
      std::fill(dq.begin(), dq.begin() + q_elems, 0.0f);
      std::fill(dk.begin(), dk.begin() + k_elems, 0.0f);
      std::fill(dv.begin(), dv.begin() + k_elems, 0.0f);
      const float* att_ph = att_piece + static_cast<size_t>(h) * L * Lk;
      for (int r0 = 0; r0 < L; r0 += B) {
        const int r1 = std::min(r0 + B, L);
        const int rows = r1 - r0;
        const int Mp = padded_rows(rows);
        const int width = first_own + r0 + Mp;
        const T* do_block = dob.data() + static_cast<size_t>(r0) * hs;
        // d_att (Mp, width) = dout[r0:r0+Mp] @ v[0:width]^T (padded rows of dout are zero, so are theirs)
        gemm_t(false, true, Mp, width, hs, 1.0f, do_block, hs, vb.data(), hs, 0.0f, ds.data(), width);
        // The saved softmax of this block as T at columns [pad, pad + s + r1) (its causal part,
        // zeros included), zero elsewhere.
        copy_rows(ab.data() + pad, width, att_ph + static_cast<size_t>(r0) * Lk, Lk, rows, s + r1);
        for (int i = 0; i < Mp; ++i) {
          T* row = ab.data() + static_cast<size_t>(i) * width;
          if (i < rows) std::fill(row, row + pad, T{0});
          std::fill(row + (i < rows ? first_own + r1 : 0), row + width, T{0});
        }
        // dv[0:width] += att^T @ dout[r0:r0+Mp]
        gemm_t(true, false, width, hs, Mp, 1.0f, ab.data(), width, do_block, hs, 1.0f, dv.data(), hs);
        for (int i = r0; i < r1; ++i) {
          float* row = ds.data() + static_cast<size_t>(i - r0) * width;
          std::fill(row, row + pad, 0.0f);
          causal_softmax_backward_row(row + pad, att_ph + static_cast<size_t>(i) * Lk, s + i, width - pad, scale);
        }
        const T* dscores = gemm_input(dsb, ds, Mp, width);
        // dq[r0:r0+Mp] += d_scores @ k[0:width];  dk[0:width] += d_scores^T @ q[r0:r0+Mp]
        gemm_t(false, false, Mp, hs, width, 1.0f, dscores, width, kb.data(), hs, 1.0f,
               dq.data() + static_cast<size_t>(r0) * hs, hs);
        gemm_t(true, false, width, hs, Mp, 1.0f, dscores, width, qb.data() + static_cast<size_t>(r0) * hs, hs, 1.0f,
               dk.data(), hs);
      }
      add_head(dqkv_p + shape.q_col(h), C3, dq.data(), L, hs);
      // Key rows [pad, pad + s) are the prefix's: their gradient goes back to the ranks that own
      // those tokens.
      if (s > 0) {
        const int kv = shape.kv_width();
        add_head(prefix_dkv + shape.prefix_k_col(h), kv, dk.data() + static_cast<size_t>(pad) * hs, s, hs);
        add_head(prefix_dkv + shape.prefix_v_col(h), kv, dv.data() + static_cast<size_t>(pad) * hs, s, hs);
      }
      add_head(dqkv_p + shape.k_col(h), C3, dk.data() + static_cast<size_t>(first_own) * hs, L, hs);
      add_head(dqkv_p + shape.v_col(h), C3, dv.data() + static_cast<size_t>(first_own) * hs, L, hs);
    }
  });
}

}  // namespace

void attention_forward(float* out, float* att, const float* qkv, const int32_t* cu_seqlens, int pieces,
                       const AttentionShape& shape, bool bf16_inputs, const AttentionPrefix& prefix,
                       AttentionPieces which) {
  if (bf16_inputs)
    attention_forward_packed<bf16>(out, att, qkv, cu_seqlens, pieces, shape, prefix, which);
  else
    attention_forward_packed<float>(out, att, qkv, cu_seqlens, pieces, shape, prefix, which);
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att,
                        const int32_t* cu_seqlens, int pieces, const AttentionShape& shape, bool bf16_inputs,
                        const AttentionPrefix& prefix, AttentionPieces which) {
  if (bf16_inputs)
    attention_backward_packed<bf16>(dqkv, dout, qkv, att, cu_seqlens, pieces, shape, prefix, which);
  else
    attention_backward_packed<float>(dqkv, dout, qkv, att, cu_seqlens, pieces, shape, prefix, which);
}

}  // namespace kilter::model
