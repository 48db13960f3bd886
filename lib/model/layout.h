// Where every parameter lives in the flat buffers (parameters, gradients, AdamW moments) that
// every backend holds: ParamLayout places the model description's parameter table
// (spec.h: parameter_table) one tensor after the other, padded at the end; LayoutOffsets and
// BlockTensors are the views the forward and backward are written against.
#pragma once
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "lib/model/spec.h"

namespace kilter::model {

// One tensor of the table placed in the buffer.
struct ParamTensor : TensorSpec {
  size_t offset = 0;  // into the flat buffer, in floats
  size_t size = 0;    // elements
};

struct ParamLayout {
  std::vector<ParamTensor> tensors;
  size_t num_params = 0;   // sum of sizes
  size_t padded_size = 0;  // buffer length: num_params rounded up to `pad_multiple`
  static ParamLayout build(const ModelSpec& spec, size_t pad_multiple = 1);
  const ParamTensor& find(const std::string& name) const;  // throws kilter::Error if absent
};

constexpr size_t kNoTensor = std::numeric_limits<size_t>::max();

// Where the model's tensor groups start in a flat buffer laid out by ParamLayout (kNoTensor where
// the architecture has no such tensor): what every backend's forward and backward (and its
// on_ready ranges) are written against.
struct LayoutOffsets {
  size_t wte = 0, wpe = kNoTensor, lnf_w = 0, lnf_b = kNoTensor;
  size_t head = 0;            // the LM head's weight: wte when the embeddings are tied
  std::vector<size_t> block;  // block l's first tensor
  size_t block_floats = 0;    // floats of one block
  // Per block role (TensorRole), its first tensor's offset from the block's start.
  std::array<size_t, kTensorRoles> in_block{};
  static LayoutOffsets of(const ParamLayout& layout);
  // The floats before block 0 (the embeddings) and after the last block (the final norm, an
  // untied head, the padding): the ranges backward finishes last and first.
  size_t embeddings_end() const { return block.empty() ? lnf_w : block.front(); }
};

// buffer + offset, or null where the tensor does not exist (kNoTensor).
inline float* tensor_at(float* buffer, size_t offset) { return offset == kNoTensor ? nullptr : buffer + offset; }

// Pointers to one block's tensors inside a flat buffer (parameters or gradients); null where the
// architecture has no such tensor (then neither has the gradient).
struct BlockTensors {
  float *ln1_w, *ln1_b, *qkv_w, *qkv_b, *attproj_w, *attproj_b;
  float *ln2_w, *ln2_b, *fc_w, *fc_b, *fcproj_w, *fcproj_b;
};
BlockTensors block_tensors_at(float* buffer, const LayoutOffsets& offsets, int layer);

// Saved activations of one block (host or device pointers), laid out by the activation layout:
// values of element type T (fp32, or the CUDA bf16 datapath's bf16), the norms' statistics fp32.
template <class T>
struct BlockSlots {
  T* ln1;
  float *ln1_mean, *ln1_rstd;
  T *qkv, *atty, *att, *residual2, *ln2;
  float *ln2_mean, *ln2_rstd;
  T *fch, *fch_gelu, *residual3;
};
using BlockActivations = BlockSlots<float>;

// The pointer of one slot of the activation layout.
inline float*& activation_slot(BlockActivations& a, ActSlot slot) {
  float** slots[kActSlots] = {&a.ln1, &a.ln1_mean, &a.ln1_rstd, &a.qkv,      &a.atty,     &a.residual2,
                              &a.ln2, &a.ln2_mean, &a.ln2_rstd, &a.fch,      &a.fch_gelu, &a.residual3};
  return *slots[static_cast<size_t>(slot)];
}

// Lays out one block's activations for N tokens in the plan's slot order: take(slot, home, floats)
// gives each slot that exists its memory (a backend takes kept slots from the layer's own region
// and shared ones from the block all layers share). `att` is the caller's.
template <class Take>
BlockActivations carve_block(const ActivationLayout& plan, size_t N, Take&& take) {
  BlockActivations a{};
  for (size_t s = 0; s < kActSlots; ++s)
    if (plan.home[s] != ActHome::absent)
      activation_slot(a, static_cast<ActSlot>(s)) = take(static_cast<ActSlot>(s), plan.home[s], N * plan.per_token[s]);
  return a;
}

// [offset, offset + count) of the flat parameter buffer, in floats.
struct ParamRange {
  size_t offset = 0;
  size_t count = 0;
};

// Values held for `from_ranges` (range after range in `from`) copied where `to_ranges` (range
// after range in `to`) covers the same buffer positions; the rest of `to` is left as it is. A
// sharded optimizer keeps, when its ranges change (a resume that loaded the full moments first),
// the moments it already held.
inline void copy_range_overlap(const std::vector<ParamRange>& from_ranges, const float* from,
                               const std::vector<ParamRange>& to_ranges, float* to) {
  size_t dst = 0;
  for (const ParamRange& r : to_ranges) {
    size_t src = 0;
    for (const ParamRange& h : from_ranges) {
      const size_t lo = std::max(r.offset, h.offset), hi = std::min(r.offset + r.count, h.offset + h.count);
      if (lo < hi) std::copy(from + src + (lo - h.offset), from + src + (hi - h.offset), to + dst + (lo - r.offset));
      src += h.count;
    }
    dst += r.count;
  }
}

// Calls fn(lo, hi, moment_index, decay) for every tensor's part [lo, hi) inside the owned ranges
// (range after range, tensor after tensor), moment_index being lo's position among the owned
// floats: how AdamW walks a (possibly sharded) buffer on every backend.
template <class Fn>
void for_each_owned_part(const ParamLayout& layout, const std::vector<ParamRange>& owned, Fn&& fn) {
  size_t base = 0;
  for (const ParamRange& r : owned) {
    for (const ParamTensor& tensor : layout.tensors) {
      const size_t lo = std::max(r.offset, tensor.offset), hi = std::min(r.offset + r.count, tensor.offset + tensor.size);
      if (lo < hi) fn(lo, hi, base + (lo - r.offset), tensor.decay);
    }
    base += r.count;
  }
}

}  // namespace kilter::model
