// Grouping of a packed micro-batch's pieces into padded attention sub-batches (attention_groups.h).
#include "lib/model/attention_groups.h"

#include <algorithm>
#include <numeric>

#include "io/base/error.h"

namespace kilter::model {

int attention_padded_length(int len, int context) {
  KILTER_CHECK(len > 0 && len <= context, "attention piece of length " << len << " outside [1, " << context << "]");
  if (len <= 16) return len;
  int octave = 1;
  while (octave * 2 <= len) octave *= 2;
  const int step = octave / 4;  // four buckets per octave: at most 25% padding
  return std::min(context, (len + step - 1) / step * step);
}

void AttentionGroups::build(const int32_t* cu_seqlens, int pieces, int context, const int32_t* pos_offset) {
  groups.clear();
  lengths.clear();
  padded_token.clear();
  shape_key.clear();
  // Pieces by padded length, longest first; ties keep batch order (deterministic layout).
  std::vector<int> order(pieces);
  std::vector<int> padded(pieces);
  for (int p = 0; p < pieces; ++p) padded[p] = attention_padded_length(cu_seqlens[p + 1] - cu_seqlens[p], context);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return padded[a] > padded[b]; });
  for (int p : order) {
    if (pos_offset != nullptr && pos_offset[p] > 0) continue;
    const int T = padded[p];
    if (groups.empty() || groups.back().T != T) {
      AttentionGroup g;
      g.T = T;
      g.first_row = padded_token.size();
      g.first_length = static_cast<int>(lengths.size());
      groups.push_back(g);
    }
    ++groups.back().B;
    const int len = cu_seqlens[p + 1] - cu_seqlens[p];
    lengths.push_back(len);
    for (int t = 0; t < T; ++t) padded_token.push_back(t < len ? cu_seqlens[p] + t : -1);
  }
  for (const AttentionGroup& g : groups) {
    shape_key.push_back(g.B);
    shape_key.push_back(g.T);
  }
}

double AttentionGroups::padded_work() const {
  double work = 0;
  for (const AttentionGroup& g : groups) work += static_cast<double>(g.B) * g.T * g.T;
  return work;
}

}  // namespace kilter::model
