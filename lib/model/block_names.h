// What an op table over fp32 activation buffers resolves the block schedule's names into
// (block_schedule.h): BlockMemory, set by the table's owner (the CPU model, the generator, the
// CUDA backend's fp32 datapath), and BlockNames, the resolution the tables share.
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

// Where the names live, and the micro-batch; the owner sets it before a forward (buffers may have
// grown).
struct BlockMemory {
  int rows = 0;                         // the micro-batch's token rows
  const Batch* batch = nullptr;         // attention's pieces and K/V exchange (CPU tables)
  const int32_t* positions = nullptr;   // llama: each row's position (CPU tables)
  const RopeTable* rope = nullptr;
  std::function<void(int layer)> attention;  // set: replaces the CPU table's attention (the generator's cache)
  std::function<BlockActivations(int layer, int rows)> activations;
  std::function<Bf16Inputs(int layer, int rows)> bf16_inputs;  // empty: none
  std::function<void(int layer)> weights_needed;               // empty: all there
  const float* embeddings = nullptr;                           // Stream::in of block 0
  float *lnf = nullptr, *lnf_mean = nullptr, *lnf_rstd = nullptr;  // Act::next_ln of the last block
  float *params = nullptr, *grads = nullptr;
  const LayoutOffsets* offsets = nullptr;
  float* grad[6] = {};  // by Grad: dresidual, dln, datty, dqkv, dfch, dact
  // CPU bf16 storage: the weights' bf16 working copy (params' positions), a Linear's output before
  // the fused residual add and norm, and the bf16 copy of dresidual the GEMMs read.
  const bf16* params_bf16 = nullptr;
  float *projection = nullptr, *dresidual_bf16 = nullptr;
};

class BlockNames {
 public:
  BlockNames(const ModelSpec& spec, const BlockMemory& memory) : spec_(spec), memory_(memory) {}

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
    float *out, *mean, *rstd;
  };
  float* act(int layer, Act a) const;
  float* stream(int layer, Stream s) const;
  float* grad(Grad g) const { return memory_.grad[static_cast<int>(g)]; }
  LinearTensors linear_tensors(int layer, Linear l) const;
  NormWeights norm_weights(int layer, Act out) const;  // out: ln1, ln2 or next_ln
  NormTensors norm_tensors(int layer, Act out) const;

  int rows() const { return memory_.rows; }

  const ModelSpec& spec_;
  const BlockMemory& memory_;
};

}  // namespace kilter::model
