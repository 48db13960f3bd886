// The few non-virtual members of the Model interface (model.h) that every backend shares.
#include "lib/model/model.h"

#include "io/base/error.h"
#include "lib/model/bf16_ops.h"

namespace kilter::model {

void Model::shard_optimizer_unsupported() const {
  KILTER_FAIL("train.shard_optimizer = true: the " << backend_name()
                                                   << " backend has no sharded optimizer yet; set train.shard_optimizer = false");
}

void Model::round_grads_bf16(size_t offset, size_t count) { round_bf16_inplace(grads() + offset, count); }

std::vector<ParamRange> param_unit_ranges(const ParamLayout& layout) {
  const LayoutOffsets off = LayoutOffsets::of(layout);
  std::vector<ParamRange> units;
  units.push_back({0, off.embeddings_end()});
  for (size_t l = 0; l < off.block.size(); ++l) {
    const size_t end = l + 1 < off.block.size() ? off.block[l + 1] : off.lnf_w;
    units.push_back({off.block[l], end - off.block[l]});
  }
  units.push_back({off.lnf_w, layout.padded_size - off.lnf_w});
  size_t at = 0;
  for (const ParamRange& u : units) {
    KILTER_CHECK(u.offset == at, "parameter units are not contiguous at float " << at);
    at += u.count;
  }
  return units;
}

std::vector<ParamRange> norm_tensor_ranges(const ParamLayout& layout) {
  std::vector<ParamRange> ranges;
  for (const ParamTensor& t : layout.tensors) {
    const TensorRole r = t.role;
    if (r == TensorRole::norm1_weight || r == TensorRole::norm1_bias || r == TensorRole::norm2_weight ||
        r == TensorRole::norm2_bias || r == TensorRole::final_norm_weight || r == TensorRole::final_norm_bias)
      ranges.push_back({t.offset, t.size});
  }
  return ranges;
}

}  // namespace kilter::model
