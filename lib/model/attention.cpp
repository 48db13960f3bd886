// Causal attention forward/backward (shapes in attention.h), one (row, head) at a time with
// OpenBLAS sgemm. Query rows go in blocks of kQueryBlock; a block only multiplies against the
// keys it can see (0 .. its last row), so the GEMMs do about half of the full T x T work, as the
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

void attention_forward(float* out, float* att, const float* qkv, const int32_t* lengths, int B, int T, int C,
                       int NH) {
  const int hs = C / NH;
  const int C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int b = 0; b < B; ++b) {
    const int length = std::clamp(lengths[b], 0, T);
    const float* qkv_b = qkv + static_cast<size_t>(b) * T * C3;
    float* out_b = out + static_cast<size_t>(b) * T * C;
    // Padded rows produce zeros (all heads at once).
    if (length < T) std::memset(out_b + static_cast<size_t>(length) * C, 0, sizeof(float) * (T - length) * C);
    for (int h = 0; h < NH; ++h) {
      const float* q = qkv_b + h * hs;
      const float* k = qkv_b + C + h * hs;
      const float* v = qkv_b + 2 * C + h * hs;
      float* att_bh = att + (static_cast<size_t>(b) * NH + h) * T * T;
      for (int r0 = 0; r0 < length; r0 += kQueryBlock) {
        const int r1 = std::min(r0 + kQueryBlock, length);
        const int rows = r1 - r0;
        float* scores = att_bh + static_cast<size_t>(r0) * T;
        // scores (rows, r1) = scale * q[r0:r1] @ k[0:r1]^T
        sgemm_rowmajor(false, true, rows, r1, hs, scale, q + static_cast<size_t>(r0) * C3,
                    C3, k, C3, 0.0f, scores, T);
        for (int i = r0; i < r1; ++i) causal_softmax_row(att_bh + static_cast<size_t>(i) * T, i, r1);
        // out[r0:r1, head h] = att[r0:r1, 0:r1] @ v[0:r1]
        sgemm_rowmajor(false, false, rows, hs, r1, 1.0f, scores, T, v, C3, 0.0f,
                    out_b + static_cast<size_t>(r0) * C + h * hs, C);
      }
    }
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att,
                        const int32_t* lengths, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const int C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  // Gradient of one query block's scores; grown once, reused by every call on this thread.
  thread_local std::vector<float> d_scores;
  if (d_scores.size() < static_cast<size_t>(kQueryBlock) * T) d_scores.resize(static_cast<size_t>(kQueryBlock) * T);
  for (int b = 0; b < B; ++b) {
    const int length = std::clamp(lengths[b], 0, T);
    const float* qkv_b = qkv + static_cast<size_t>(b) * T * C3;
    float* dqkv_b = dqkv + static_cast<size_t>(b) * T * C3;
    const float* dout_b = dout + static_cast<size_t>(b) * T * C;
    for (int h = 0; h < NH; ++h) {
      const float* q = qkv_b + h * hs;
      const float* k = qkv_b + C + h * hs;
      const float* v = qkv_b + 2 * C + h * hs;
      float* dq = dqkv_b + h * hs;
      float* dk = dqkv_b + C + h * hs;
      float* dv = dqkv_b + 2 * C + h * hs;
      const float* att_bh = att + (static_cast<size_t>(b) * NH + h) * T * T;
      for (int r0 = 0; r0 < length; r0 += kQueryBlock) {
        const int r1 = std::min(r0 + kQueryBlock, length);
        const int rows = r1 - r0;
        const float* att_block = att_bh + static_cast<size_t>(r0) * T;
        const float* dout_block = dout_b + static_cast<size_t>(r0) * C + h * hs;
        float* ds = d_scores.data();
        // d_att (rows, r1) = dout[r0:r1] @ v[0:r1]^T
        sgemm_rowmajor(false, true, rows, r1, hs, 1.0f, dout_block, C, v, C3, 0.0f, ds, r1);
        // dv[0:r1] += att[r0:r1, 0:r1]^T @ dout[r0:r1]
        sgemm_rowmajor(true, false, r1, hs, rows, 1.0f, att_block, T, dout_block, C, 1.0f,
                    dv, C3);
        for (int i = r0; i < r1; ++i)
          causal_softmax_backward_row(ds + static_cast<size_t>(i - r0) * r1, att_bh + static_cast<size_t>(i) * T, i,
                                      r1, scale);
        // dq[r0:r1] += d_scores @ k[0:r1];  dk[0:r1] += d_scores^T @ q[r0:r1]
        sgemm_rowmajor(false, false, rows, hs, r1, 1.0f, ds, r1, k, C3, 1.0f,
                    dq + static_cast<size_t>(r0) * C3, C3);
        sgemm_rowmajor(true, false, r1, hs, rows, 1.0f, ds, r1,
                    q + static_cast<size_t>(r0) * C3, C3, 1.0f, dk, C3);
      }
    }
  }
}

}  // namespace kilter::model
