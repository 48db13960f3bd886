// Where a token row of a packed micro-batch sits on the device: its piece (cu_seqlens, pieces + 1
// offsets) and its position in that piece, which restarts at 0 in every piece or continues from
// pos_offset[p] in a later part of a cut piece (pos_offset null: all 0). The position embedding
// (encoder.cu) and RoPE (rope.cu) both index their tables by it. Included by .cu files only.
#pragma once
#include <cstdint>

namespace kilter::model::cuda {

// The piece holding token row i: the last p with cu_seqlens[p] <= i (binary search).
__device__ inline int piece_of(const int32_t* cu_seqlens, int pieces, int i) {
  int lo = 0, hi = pieces - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (cu_seqlens[mid] <= i) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// Token row `row`'s position in its piece.
__device__ inline int position_in_piece(const int32_t* cu_seqlens, const int32_t* pos_offset, int pieces, int row) {
  const int p = piece_of(cu_seqlens, pieces, row);
  return row - cu_seqlens[p] + (pos_offset == nullptr ? 0 : pos_offset[p]);
}

}  // namespace kilter::model::cuda
