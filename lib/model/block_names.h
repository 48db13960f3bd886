// What an op table resolves the block schedule's names into (block_schedule.h): BlockMemoryOf,
// set by the table's owner (the CPU model, the generator, the CUDA backend's two datapaths), and
// BlockNames, the resolution the tables share, over activations of element type T (fp32, or the
// CUDA bf16 datapath's bf16; the norms' statistics, the weights and their gradients stay fp32).
#pragma once
#include <cstdint>
#include <functional>

#include "lib/model/block_schedule.h"
#include "lib/model/gemm.h"
#include "lib/model/layout.h"
#include "lib/model/model.h"
#include "lib/model/rope.h"

namespace kilter::model {

// precision = bf16 on the CPU (bf16 GEMMs): the bf16 roundings of a block's four Linear inputs,
// made by the forward's GEMMs and read by the backward's (all null: none kept).
struct Bf16Inputs {
  bf16 *ln1 = nullptr, *atty = nullptr, *ln2 = nullptr, *fch_act = nullptr;
};

// Where the names live; the owner sets it before a forward (buffers may have grown).
template <class T>
struct BlockMemoryOf {
  int rows = 0;  // the micro-batch's token rows
  std::function<BlockSlots<T>(int layer, int rows)> activations;
  const T* embeddings = nullptr;                                   // Stream::in of block 0
  T* lnf = nullptr;                                                // Act::next_ln of the last block
  float *lnf_mean = nullptr, *lnf_rstd = nullptr;
  float *params = nullptr, *grads = nullptr;
  const LayoutOffsets* offsets = nullptr;
  T* grad[6] = {};  // by Grad: dresidual (the copy the GEMMs read), dln, datty, dqkv, dfch, dact
};

// The CPU tables' memory: fp32 activations, and the micro-batch.
struct BlockMemory : BlockMemoryOf<float> {
  const Batch* batch = nullptr;         // attention's pieces and K/V exchange
  const int32_t* positions = nullptr;   // llama: each row's position
  const RopeTable* rope = nullptr;
  std::function<void(int layer)> attention;  // set: replaces the CPU table's attention (the generator's cache)
  std::function<Bf16Inputs(int layer, int rows)> bf16_inputs;  // empty: none
  std::function<void(int layer)> weights_needed;               // empty: all there
  // CPU bf16 storage: the weights' bf16 working copy (params' positions), a Linear's output before
  // the fused residual add and norm, and the bf16 copy of dresidual the GEMMs read.
  const bf16* params_bf16 = nullptr;
  float *projection = nullptr, *dresidual_bf16 = nullptr;
};

template <class T, class Memory = BlockMemoryOf<T>>
class BlockNames {
 public:
  BlockNames(const ModelSpec& spec, const Memory& memory) : spec_(spec), memory_(memory) {}

 protected:
  // A Linear layer's tensors: weight (out, in), bias (null: none), their gradients.
  struct LinearTensors {
    const float *w, *b;
    float *dw, *db;
    int in, out;
  };
  // A norm's weights and their gradients (bias null: RMSNorm).
  struct NormWeights {
    const float *w, *b;
    float *dw, *db;
  };
  // A norm's output, statistics and weights.
  struct NormTensors : NormWeights {
    T* out;
    float *mean, *rstd;
  };

  T* act(int layer, Act a) const {
    if (a == Act::spare) return grad(Grad::dln);
    if (a == Act::next_ln) return norm_tensors(layer, a).out;
    const BlockSlots<T> x = memory_.activations(layer, rows());
    switch (a) {
      case Act::ln1: return x.ln1;
      case Act::qkv: return x.qkv;
      case Act::atty: return x.atty;
      case Act::ln2: return x.ln2;
      case Act::fch: return x.fch;
      default: return x.fch_gelu;
    }
  }
  T* stream(int layer, Stream s) const {
    if (s == Stream::in)
      return layer == 0 ? const_cast<T*>(memory_.embeddings) : memory_.activations(layer - 1, rows()).residual3;
    const BlockSlots<T> x = memory_.activations(layer, rows());
    return s == Stream::mid ? x.residual2 : x.residual3;
  }
  T* grad(Grad g) const { return memory_.grad[static_cast<int>(g)]; }

  LinearTensors linear_tensors(int layer, Linear l) const {
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

  NormWeights norm_weights(int layer, Act out) const {  // out: ln1, ln2 or next_ln
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

  NormTensors norm_tensors(int layer, Act out) const {
    NormTensors t{norm_weights(layer, out), nullptr, nullptr, nullptr};
    if (out == Act::next_ln && layer + 1 == spec_.n_layer) {
      t.out = memory_.lnf, t.mean = memory_.lnf_mean, t.rstd = memory_.lnf_rstd;
      return t;
    }
    const bool first = out != Act::ln2;  // ln1, or the next block's ln1
    const BlockSlots<T> x = memory_.activations(out == Act::next_ln ? layer + 1 : layer, rows());
    t.out = first ? x.ln1 : x.ln2;
    t.mean = first ? x.ln1_mean : x.ln2_mean;
    t.rstd = first ? x.ln1_rstd : x.ln2_rstd;
    return t;
  }

  int rows() const { return memory_.rows; }

  const ModelSpec& spec_;
  const Memory& memory_;
};

}  // namespace kilter::model
