// ParamLayout: where every nanoGPT-named tensor lives in the flat parameter buffer
// (model.h): wte, wpe, then h.0 .. h.{L-1} each contiguous, then ln_f.
#include <string>

#include "io/error.h"
#include "lib/model/model.h"

namespace kilter::model {

ParamLayout ParamLayout::build(const GPTConfig& cfg, size_t pad_multiple) {
  KILTER_CHECK(cfg.n_layer > 0 && cfg.n_head > 0 && cfg.n_embd > 0 && cfg.block_size > 0 && cfg.vocab_size > 0,
               "model config: n_layer, n_head, n_embd, block_size and vocab_size must be positive (got "
                   << cfg.n_layer << ", " << cfg.n_head << ", " << cfg.n_embd << ", " << cfg.block_size << ", "
                   << cfg.vocab_size << ")");
  KILTER_CHECK(cfg.n_embd % cfg.n_head == 0,
               "model.n_embd (" << cfg.n_embd << ") must be a multiple of model.n_head (" << cfg.n_head << ")");
  KILTER_CHECK(pad_multiple > 0, "ParamLayout: pad_multiple must be positive");
  const int64_t C = cfg.n_embd;
  ParamLayout layout;
  size_t offset = 0;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    ParamTensor tensor;
    tensor.name = name;
    tensor.size = 1;
    for (int64_t d : shape) tensor.size *= static_cast<size_t>(d);
    tensor.decay = shape.size() >= 2;  // AdamW decays 2-D weights (embeddings included), not biases/LN
    tensor.shape = std::move(shape);
    tensor.offset = offset;
    offset += tensor.size;
    layout.tensors.push_back(std::move(tensor));
  };
  add("transformer.wte.weight", {cfg.vocab_size, C});
  add("transformer.wpe.weight", {cfg.block_size, C});
  for (int l = 0; l < cfg.n_layer; ++l) {
    const std::string p = "transformer.h." + std::to_string(l) + ".";
    add(p + "ln_1.weight", {C});
    add(p + "ln_1.bias", {C});
    add(p + "attn.c_attn.weight", {3 * C, C});
    add(p + "attn.c_attn.bias", {3 * C});
    add(p + "attn.c_proj.weight", {C, C});
    add(p + "attn.c_proj.bias", {C});
    add(p + "ln_2.weight", {C});
    add(p + "ln_2.bias", {C});
    add(p + "mlp.c_fc.weight", {4 * C, C});
    add(p + "mlp.c_fc.bias", {4 * C});
    add(p + "mlp.c_proj.weight", {C, 4 * C});
    add(p + "mlp.c_proj.bias", {C});
  }
  add("transformer.ln_f.weight", {C});
  add("transformer.ln_f.bias", {C});
  layout.num_params = offset;
  layout.padded_size = (offset + pad_multiple - 1) / pad_multiple * pad_multiple;
  return layout;
}

LayoutOffsets LayoutOffsets::of(const ParamLayout& layout, int n_layer) {
  LayoutOffsets o;
  o.wte = layout.find("transformer.wte.weight").offset;
  o.wpe = layout.find("transformer.wpe.weight").offset;
  o.lnf_w = layout.find("transformer.ln_f.weight").offset;
  o.lnf_b = layout.find("transformer.ln_f.bias").offset;
  for (int l = 0; l < n_layer; ++l)
    o.block.push_back(layout.find("transformer.h." + std::to_string(l) + ".ln_1.weight").offset);
  o.block_floats = (n_layer > 1 ? o.block[1] : o.lnf_w) - o.block[0];
  return o;
}

const ParamTensor& ParamLayout::find(const std::string& name) const {
  for (const ParamTensor& tensor : tensors)
    if (tensor.name == name) return tensor;
  KILTER_FAIL("model parameter '" << name << "' does not exist in this layout");
}

}  // namespace kilter::model
