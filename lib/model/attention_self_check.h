// The inputs and the measure of the attention engines' self-checks (cuDNN SDPA per shape bucket,
// cuDNN's padded engine per shape, against the cuBLASLt engine; lib/backend/cuda_attention_*.cu),
// on the host so that the CPU can show what they see (tests/unit/model_attention_self_check_test).
//
// Pseudo-random rows alone barely see a mask error: with q and k uniform in [-1, 1) at head_dim
// 64 the softmax is nearly flat, so one key too many or too few in a row of L keys moves its
// output by about 1/L, far under the tolerance, and a bottom-right alignment off by one (later
// parts of cut pieces, whose rows all see s + 1 keys or more) would pass. Here every query head
// of a row is instead half noise plus c * (k_own + k_next) of its key head, k_own the row's own
// key and k_next the next row's of the same piece (zero on a piece's last row), with c such that
// both score about kMaskProbeScore above the noise. A right mask makes the row's own key dominate
// and hides the next one; a mask one key short drops the dominant key, one key long adds an equal
// one: either moves that row's output by about |v|, a relative difference near 1. The noise keeps
// every other product (transposes, head and row indexing) in play.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "lib/model/attention.h"

namespace kilter::model {

// The engines' agreement limit, max |a - b| / max |b| over out and the gradients: bf16 inputs,
// probabilities and outputs against fp32 (or fast-bf16) cuBLASLt products.
inline constexpr double kAttentionSelfCheckTolerance = 5e-2;
// How far (in score units) a row's own key stands above the noise.
inline constexpr double kMaskProbeScore = 8.0;

// The rows of one piece (or one part of a cut piece) in the packed (N, row_width) matrix.
struct RowSpan {
  int start = 0;
  int length = 0;
};

// Deterministic values in [-1, 1) (an integer hash of the index and the seed), rounded to bf16
// values so that an engine reading bf16 rows and one reading fp32 rows see the same numbers.
std::vector<float> self_check_rows(size_t n, uint32_t seed);

// qkv rows (N, shape.row_width()) as above, bf16 values: self_check_rows, then each span's
// query heads rewritten to see their own key first. Rows outside every span keep the noise.
std::vector<float> self_check_qkv(size_t N, const AttentionShape& shape, const std::vector<RowSpan>& spans, uint32_t seed);

// max |a - b| / max |b| over the elements (a NaN in a counts as infinitely far).
double max_relative_difference(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace kilter::model
