// ParamLayout: the model description's parameter table placed in the flat buffer (layout.h).
#include "lib/model/layout.h"

#include <string>

#include "io/base/error.h"

namespace kilter::model {

ParamLayout ParamLayout::build(const ModelSpec& spec, size_t pad_multiple) {
  KILTER_CHECK(pad_multiple > 0, "ParamLayout: pad_multiple must be positive");
  ParamLayout layout;
  size_t offset = 0;
  for (TensorSpec& t : parameter_table(spec)) {
    ParamTensor tensor;
    static_cast<TensorSpec&>(tensor) = std::move(t);
    tensor.size = 1;
    for (int64_t d : tensor.shape) tensor.size *= static_cast<size_t>(d);
    tensor.offset = offset;
    offset += tensor.size;
    layout.tensors.push_back(std::move(tensor));
  }
  layout.num_params = offset;
  layout.padded_size = (offset + pad_multiple - 1) / pad_multiple * pad_multiple;
  return layout;
}

LayoutOffsets LayoutOffsets::of(const ParamLayout& layout) {
  LayoutOffsets o;
  o.in_block.fill(kNoTensor);
  bool head_seen = false;
  for (const ParamTensor& t : layout.tensors) {
    if (t.layer >= 0) {
      if (size_t(t.layer) == o.block.size()) o.block.push_back(t.offset);
      if (t.layer == 0 && o.in_block[size_t(t.role)] == kNoTensor) o.in_block[size_t(t.role)] = t.offset - o.block[0];
      continue;
    }
    switch (t.role) {
      case TensorRole::token_embedding: o.wte = t.offset; break;
      case TensorRole::position_embedding: o.wpe = t.offset; break;
      case TensorRole::final_norm_weight: o.lnf_w = t.offset; break;
      case TensorRole::final_norm_bias: o.lnf_b = t.offset; break;
      case TensorRole::lm_head: o.head = t.offset, head_seen = true; break;
      default: KILTER_FAIL("parameter " << t.name << " outside a block has a block's role");
    }
  }
  if (!head_seen) o.head = o.wte;
  o.block_floats = o.block.size() > 1 ? o.block[1] - o.block[0] : o.lnf_w - o.block[0];
  return o;
}

BlockTensors block_tensors_at(float* buffer, const LayoutOffsets& offsets, int layer) {
  float* block = buffer + offsets.block[size_t(layer)];
  auto at = [&](TensorRole role) {
    const size_t in_block = offsets.in_block[size_t(role)];
    return in_block == kNoTensor ? nullptr : block + in_block;
  };
  using R = TensorRole;
  return {at(R::norm1_weight), at(R::norm1_bias),  at(R::qkv_weight),     at(R::qkv_bias),
          at(R::attn_proj_weight), at(R::attn_proj_bias), at(R::norm2_weight), at(R::norm2_bias),
          at(R::fc_weight),    at(R::fc_bias),     at(R::fc_proj_weight), at(R::fc_proj_bias)};
}

const ParamTensor& ParamLayout::find(const std::string& name) const {
  for (const ParamTensor& tensor : tensors)
    if (tensor.name == name) return tensor;
  KILTER_FAIL("model parameter '" << name << "' does not exist in this layout");
}

}  // namespace kilter::model
