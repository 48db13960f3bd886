// BlockNames (block_names.h): the block schedule's names resolved into BlockMemory.
#include "lib/model/block_names.h"

namespace kilter::model {

float* BlockNames::act(int layer, Act a) const {
  if (a == Act::spare) return grad(Grad::dln);
  if (a == Act::next_ln) return norm_tensors(layer, a).out;
  const BlockActivations x = memory_.activations(layer, rows());
  switch (a) {
    case Act::ln1: return x.ln1;
    case Act::qkv: return x.qkv;
    case Act::atty: return x.atty;
    case Act::ln2: return x.ln2;
    case Act::fch: return x.fch;
    default: return x.fch_gelu;
  }
}

float* BlockNames::stream(int layer, Stream s) const {
  if (s == Stream::in)
    return layer == 0 ? const_cast<float*>(memory_.embeddings) : memory_.activations(layer - 1, rows()).residual3;
  const BlockActivations x = memory_.activations(layer, rows());
  return s == Stream::mid ? x.residual2 : x.residual3;
}

BlockNames::LinearTensors BlockNames::linear_tensors(int layer, Linear l) const {
  const BlockTensors p = block_tensors_at(memory_.params, *memory_.offsets, layer);
  const BlockTensors g =
      memory_.grads == nullptr ? BlockTensors{} : block_tensors_at(memory_.grads, *memory_.offsets, layer);
  const int C = spec_.n_embd;
  switch (l) {
    case Linear::qkv: return {p.qkv_w, p.qkv_b, g.qkv_w, g.qkv_b, C, spec_.qkv_width()};
    case Linear::attproj: return {p.attproj_w, p.attproj_b, g.attproj_w, g.attproj_b, C, C};
    case Linear::fc: return {p.fc_w, p.fc_b, g.fc_w, g.fc_b, C, spec_.ffn_in_width()};
    default: return {p.fcproj_w, p.fcproj_b, g.fcproj_w, g.fcproj_b, spec_.ffn_width(), C};
  }
}

BlockNames::NormWeights BlockNames::norm_weights(int layer, Act out) const {
  float* params = memory_.params;
  float* grads = memory_.grads;
  if (out == Act::next_ln) {
    if (layer + 1 < spec_.n_layer) return norm_weights(layer + 1, Act::ln1);
    const LayoutOffsets& o = *memory_.offsets;
    return {params + o.lnf_w, tensor_at(params, o.lnf_b), grads == nullptr ? nullptr : grads + o.lnf_w,
            grads == nullptr ? nullptr : tensor_at(grads, o.lnf_b)};
  }
  const BlockTensors p = block_tensors_at(params, *memory_.offsets, layer);
  const BlockTensors g = grads == nullptr ? BlockTensors{} : block_tensors_at(grads, *memory_.offsets, layer);
  if (out == Act::ln1) return {p.ln1_w, p.ln1_b, g.ln1_w, g.ln1_b};
  return {p.ln2_w, p.ln2_b, g.ln2_w, g.ln2_b};
}

BlockNames::NormTensors BlockNames::norm_tensors(int layer, Act out) const {
  NormTensors t{norm_weights(layer, out), nullptr, nullptr, nullptr};
  if (out == Act::next_ln && layer + 1 == spec_.n_layer) {
    t.out = memory_.lnf, t.mean = memory_.lnf_mean, t.rstd = memory_.lnf_rstd;
    return t;
  }
  const bool first = out != Act::ln2;  // ln1, or the next block's ln1
  const BlockActivations x = memory_.activations(out == Act::next_ln ? layer + 1 : layer, rows());
  t.out = first ? x.ln1 : x.ln2;
  t.mean = first ? x.ln1_mean : x.ln2_mean;
  t.rstd = first ? x.ln1_rstd : x.ln2_rstd;
  return t;
}

}  // namespace kilter::model
