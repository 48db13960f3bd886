// How a backend whose attention engines take padded (B,T) batches runs a packed micro-batch:
// its pieces are gathered into groups of similar length, each group one padded sub-batch. A
// piece of length L lands in a group of padded length T <= 1.25 L (quarter-octave buckets;
// lengths up to 16 exactly), so the padded attention work sum(B*T^2) stays below 1.57 sum(L^2):
// proportional to the packed work, never to pieces x (longest piece)^2. Host-side and pure
// (the CUDA backend uploads the result); tests check it on the CPU.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace kilter::model {

// The padded length of a piece of `len` tokens (<= context).
int attention_padded_length(int len, int context);

struct AttentionGroup {
  int B = 0;                // pieces (rows) in the group
  int T = 0;                // padded length of its rows
  size_t first_row = 0;     // its first padded row (B*T rows follow)
  int first_length = 0;     // its first entry in AttentionGroups::lengths
};

struct AttentionGroups {
  std::vector<AttentionGroup> groups;  // longest first
  std::vector<int32_t> lengths;        // each group's row lengths, group after group
  std::vector<int32_t> padded_token;   // padded row -> token row of the micro-batch, -1 = padding
  std::vector<int32_t> shape_key;      // (B, T) of every group, for caches keyed by layout

  // Groups the pieces of a packed batch (cu_seqlens, pieces+1 offsets). Reuses its buffers.
  // pos_offset (may be null): pieces with an offset > 0, later parts of cut pieces, are left out
  // (no padded rows; the backend runs them with their prefix on their own).
  void build(const int32_t* cu_seqlens, int pieces, int context, const int32_t* pos_offset = nullptr);
  size_t padded_rows() const { return padded_token.size(); }
  double padded_work() const;  // sum over groups of B * T^2
};

}  // namespace kilter::model
