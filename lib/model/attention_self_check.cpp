// attention_self_check.h: the self-checks' inputs, rows that see a mask error.
#include "lib/model/attention_self_check.h"

#include <algorithm>
#include <cmath>

#include "lib/model/gemm.h"

namespace kilter::model {

namespace {

float hash_value(size_t i, uint32_t seed) {
  uint64_t h = (static_cast<uint64_t>(i) + 0x9e3779b97f4a7c15ull * (seed + 1u));
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  h ^= h >> 31;
  return static_cast<float>(h >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

float bf16_value(float x) {
  bf16 b;
  to_bf16(&b, &x, 1);
  return bf16_to_float(b);
}

}  // namespace

std::vector<float> self_check_rows(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = bf16_value(hash_value(i, seed));
  return v;
}

std::vector<float> self_check_qkv(size_t N, const AttentionShape& shape, const std::vector<RowSpan>& spans, uint32_t seed) {
  const size_t W = shape.row_width();
  const int D = shape.head_dim;
  std::vector<float> qkv = self_check_rows(N * W, seed);
  // |k|^2 of a uniform [-1, 1) row is D / 3, so c (k . k) / sqrt(D) = kMaskProbeScore.
  const float c = static_cast<float>(3.0 * kMaskProbeScore / std::sqrt(static_cast<double>(D)));
  for (const RowSpan& span : spans)
    for (int t = 0; t < span.length; ++t) {
      float* row = qkv.data() + static_cast<size_t>(span.start + t) * W;
      const float* next = t + 1 < span.length ? row + W : nullptr;
      for (int h = 0; h < shape.n_head; ++h)
        for (int d = 0; d < D; ++d) {
          const int k = shape.k_col(h) + d;
          const float keys = row[k] + (next != nullptr ? next[k] : 0.0f);
          row[shape.q_col(h) + d] = bf16_value(0.5f * row[shape.q_col(h) + d] + c * keys);
        }
    }
  return qkv;
}

double max_relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0.0, scale = 1e-20;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    diff = std::isnan(d) ? INFINITY : std::max(diff, d);
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return a.size() == b.size() ? diff / scale : INFINITY;
}

}  // namespace kilter::model
