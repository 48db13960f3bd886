// RoPE (rope.h): y1 = x1 cos - x2 sin, y2 = x2 cos + x1 sin on each head's halves; the backward
// turns the gradient the other way, dx1 = dy1 cos + dy2 sin, dx2 = dy2 cos - dy1 sin.
#include "lib/model/rope.h"

#include <cmath>
#include <cstddef>

#include "io/base/error.h"

namespace kilter::model {

RopeTable RopeTable::build(const ModelSpec& spec, int context) {
  const std::vector<double> inv = rope_inverse_frequencies(spec);
  RopeTable t;
  t.half = static_cast<int>(inv.size());
  t.cos.resize(size_t(context) * t.half);
  t.sin.resize(t.cos.size());
  for (int p = 0; p < context; ++p)
    for (int i = 0; i < t.half; ++i) {
      const float angle = static_cast<float>(p) * static_cast<float>(inv[size_t(i)]);
      t.cos[size_t(p) * t.half + i] = static_cast<float>(std::cos(double(angle)));
      t.sin[size_t(p) * t.half + i] = static_cast<float>(std::sin(double(angle)));
    }
  return t;
}

void piece_positions(int32_t* positions, const int32_t* cu_seqlens, int pieces, const int32_t* pos_offset) {
  for (int p = 0; p < pieces; ++p) {
    const int32_t offset = pos_offset == nullptr ? 0 : pos_offset[p];
    for (int32_t t = cu_seqlens[p]; t < cu_seqlens[p + 1]; ++t) positions[t] = offset + (t - cu_seqlens[p]);
  }
}

namespace {

// Turns the heads [first, first + count) of each row by +angle (forward) or -angle (backward).
void rotate(float* rows, const int32_t* positions, int N, const AttentionShape& shape, const RopeTable& table,
            bool backward) {
  const int half = table.half, hd = shape.head_dim, width = shape.row_width();
  KILTER_CHECK(half * 2 == hd, "RoPE: the table has " << half << " frequencies for heads of " << hd);
  const int heads = shape.n_head + shape.n_kv_head;  // the query heads, then the key heads
  const size_t positions_held = table.cos.size() / size_t(half);
  for (int t = 0; t < N; ++t) {
    KILTER_CHECK(positions[t] >= 0 && size_t(positions[t]) < positions_held,
                 "RoPE: position " << positions[t] << " beyond the table's " << positions_held);
    const float* c = table.cos.data() + size_t(positions[t]) * half;
    const float* s = table.sin.data() + size_t(positions[t]) * half;
    float* row = rows + size_t(t) * width;
    for (int h = 0; h < heads; ++h) {
      float* x1 = row + size_t(h) * hd;
      float* x2 = x1 + half;
      for (int i = 0; i < half; ++i) {
        const float a = x1[i], b = x2[i];
        if (backward) {
          x1[i] = a * c[i] + b * s[i];
          x2[i] = b * c[i] - a * s[i];
        } else {
          x1[i] = a * c[i] - b * s[i];
          x2[i] = b * c[i] + a * s[i];
        }
      }
    }
  }
}

}  // namespace

void rope_forward(float* qkv, const int32_t* positions, int N, const AttentionShape& shape, const RopeTable& table) {
  rotate(qkv, positions, N, shape, table, false);
}

void rope_backward(float* dqkv, const int32_t* positions, int N, const AttentionShape& shape, const RopeTable& table) {
  rotate(dqkv, positions, N, shape, table, true);
}

}  // namespace kilter::model
