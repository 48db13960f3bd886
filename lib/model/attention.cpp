// Causal attention forward/backward (shapes in attention.h), one (piece, head) at a time with
// OpenBLAS sgemm. Query rows go in blocks of kQueryBlock; a block only multiplies against the
// keys it can see (0 .. its last row), so the GEMMs do about half of the full L x L work, as the
// causal mask allows, while staying large enough for sgemm to run near peak.
#include "lib/model/attention.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <vector>

#include "lib/model/gemm.h"
#include "lib/model/vecmath.h"

#pragma GCC diagnostic ignored "-Wpsabi"  // 8-lane helpers are inlined; no ABI crosses them

namespace kilter::model {
namespace {

constexpr int kQueryBlock = 64;

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

size_t attention_saved_floats(const int32_t* cu_seqlens, int pieces, int NH) {
  size_t floats = 0;
  for (int p = 0; p < pieces; ++p) {
    const size_t len = static_cast<size_t>(cu_seqlens[p + 1] - cu_seqlens[p]);
    floats += len * len;
  }
  return floats * NH;
}

void attention_forward(float* out, float* att, const float* qkv, const int32_t* cu_seqlens, int pieces, int C,
                       int NH) {
  const int hs = C / NH;
  const int C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  float* att_piece = att;
  for (int p = 0; p < pieces; ++p) {
    const int L = cu_seqlens[p + 1] - cu_seqlens[p];
    const float* qkv_p = qkv + static_cast<size_t>(cu_seqlens[p]) * C3;
    float* out_p = out + static_cast<size_t>(cu_seqlens[p]) * C;
    for (int h = 0; h < NH; ++h) {
      const float* q = qkv_p + h * hs;
      const float* k = qkv_p + C + h * hs;
      const float* v = qkv_p + 2 * C + h * hs;
      float* att_ph = att_piece + static_cast<size_t>(h) * L * L;
      for (int r0 = 0; r0 < L; r0 += kQueryBlock) {
        const int r1 = std::min(r0 + kQueryBlock, L);
        const int rows = r1 - r0;
        float* scores = att_ph + static_cast<size_t>(r0) * L;
        // scores (rows, r1) = scale * q[r0:r1] @ k[0:r1]^T
        sgemm_rowmajor(false, true, rows, r1, hs, scale, q + static_cast<size_t>(r0) * C3, C3, k, C3, 0.0f, scores,
                       L);
        for (int i = r0; i < r1; ++i) causal_softmax_row(att_ph + static_cast<size_t>(i) * L, i, r1);
        // out[r0:r1, head h] = att[r0:r1, 0:r1] @ v[0:r1]
        sgemm_rowmajor(false, false, rows, hs, r1, 1.0f, scores, L, v, C3, 0.0f,
                       out_p + static_cast<size_t>(r0) * C + h * hs, C);
      }
    }
    att_piece += static_cast<size_t>(NH) * L * L;
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att,
                        const int32_t* cu_seqlens, int pieces, int C, int NH) {
  const int hs = C / NH;
  const int C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  // Gradient of one query block's scores; grown once, reused by every call on this thread.
  thread_local std::vector<float> d_scores;
  const float* att_piece = att;
  for (int p = 0; p < pieces; ++p) {
    const int L = cu_seqlens[p + 1] - cu_seqlens[p];
    if (d_scores.size() < static_cast<size_t>(kQueryBlock) * L) d_scores.resize(static_cast<size_t>(kQueryBlock) * L);
    const float* qkv_p = qkv + static_cast<size_t>(cu_seqlens[p]) * C3;
    float* dqkv_p = dqkv + static_cast<size_t>(cu_seqlens[p]) * C3;
    const float* dout_p = dout + static_cast<size_t>(cu_seqlens[p]) * C;
    for (int h = 0; h < NH; ++h) {
      const float* q = qkv_p + h * hs;
      const float* k = qkv_p + C + h * hs;
      const float* v = qkv_p + 2 * C + h * hs;
      float* dq = dqkv_p + h * hs;
      float* dk = dqkv_p + C + h * hs;
      float* dv = dqkv_p + 2 * C + h * hs;
      const float* att_ph = att_piece + static_cast<size_t>(h) * L * L;
      for (int r0 = 0; r0 < L; r0 += kQueryBlock) {
        const int r1 = std::min(r0 + kQueryBlock, L);
        const int rows = r1 - r0;
        const float* att_block = att_ph + static_cast<size_t>(r0) * L;
        const float* dout_block = dout_p + static_cast<size_t>(r0) * C + h * hs;
        float* ds = d_scores.data();
        // d_att (rows, r1) = dout[r0:r1] @ v[0:r1]^T
        sgemm_rowmajor(false, true, rows, r1, hs, 1.0f, dout_block, C, v, C3, 0.0f, ds, r1);
        // dv[0:r1] += att[r0:r1, 0:r1]^T @ dout[r0:r1]
        sgemm_rowmajor(true, false, r1, hs, rows, 1.0f, att_block, L, dout_block, C, 1.0f, dv, C3);
        for (int i = r0; i < r1; ++i)
          causal_softmax_backward_row(ds + static_cast<size_t>(i - r0) * r1, att_ph + static_cast<size_t>(i) * L, i,
                                      r1, scale);
        // dq[r0:r1] += d_scores @ k[0:r1];  dk[0:r1] += d_scores^T @ q[r0:r1]
        sgemm_rowmajor(false, false, rows, hs, r1, 1.0f, ds, r1, k, C3, 1.0f, dq + static_cast<size_t>(r0) * C3, C3);
        sgemm_rowmajor(true, false, r1, hs, rows, 1.0f, ds, r1, q + static_cast<size_t>(r0) * C3, C3, 1.0f, dk, C3);
      }
    }
    att_piece += static_cast<size_t>(NH) * L * L;
  }
}

}  // namespace kilter::model
