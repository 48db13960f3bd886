// Rotary position embedding (the Llama family; Hugging Face's rotate-half convention): in every
// query and key head, column i and column i + head_dim/2 turn together by position x frequency i.
// A token's position is its place in its piece (batch.piece_offset + index), so a later part of a
// cut piece continues its piece's rotation and the K/V it receives are already rotated.
#pragma once
#include <cstdint>
#include <vector>

#include "lib/model/attention.h"
#include "lib/model/spec.h"

namespace kilter::model {

// cos and sin of position x frequency for positions [0, context), as Hugging Face computes them:
// the frequency and the product in float, the cosine and sine of that float (rope.cpp).
struct RopeTable {
  int half = 0;                // head_dim / 2: frequencies per head
  std::vector<float> cos, sin;  // (context, half)
  static RopeTable build(const ModelSpec& spec, int context);
};

// The positions of a micro-batch's N rows: each piece's rows count up from its offset.
void piece_positions(int32_t* positions, const int32_t* cu_seqlens, int pieces, const int32_t* pos_offset);

// In place on the query and key heads of qkv rows (N, shape.row_width()); value heads untouched.
void rope_forward(float* qkv, const int32_t* positions, int N, const AttentionShape& shape, const RopeTable& table);

// The backward: dqkv's query and key columns turned back (the rotation's transpose), in place.
void rope_backward(float* dqkv, const int32_t* positions, int N, const AttentionShape& shape, const RopeTable& table);

}  // namespace kilter::model
