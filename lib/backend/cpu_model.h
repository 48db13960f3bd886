// The CPU backend of the GPT-2 model: the oracle every other backend is checked against.
// Parameters, gradients, AdamW moments and activations live in host memory; GEMMs run on
// oneDNN (lib/model/gemm.h). Activations are allocated for the largest micro-batch seen and reused.
// precision "bf16": the Linear layers' GEMMs take bf16 inputs (a bf16 copy of the weights made
// after init/set_params/adamw_step, activations rounded per GEMM) and accumulate in fp32; master
// weights, AdamW moments, gradients and every other op stay fp32. It needs bf16 instructions
// (AVX512_BF16 or AMX); elsewhere the constructor throws, naming train.precision.
// The blocks run through the block schedule (lib/model/block_schedule.h) on the datapath's CPU op
// table (lib/model/block_ops_cpu.h).
// bf16_storage (train.bf16_storage = on; needs precision "bf16"): the oracle of the CUDA backend's
// bf16-storage datapath (its op table, its classifier): every activation is
// rounded to bf16 exactly where the device stores it, GEMMs multiply those bf16 values and the
// bf16 weight copy with fp32 accumulation (fp32 GEMMs on bf16 values: any CPU), the classifier
// keeps bf16 logits; master weights, gradients and moments stay fp32. Its kernels are the CUDA
// kernels' twins, so that the GPU path is compared at a tight tolerance.
// recompute (train.recompute): activations the forward does not keep and the backward recomputes,
// with the same kernels in the same order, so gradients are bit-identical to "none": "gelu" the
// MLP's GELU output (from its input), "attention" the saved softmax (from Q and K, and the prefix
// K/V of a cut piece's later part, which the exchange holds until that layer's backward), "block"
// everything but each block's input (the whole block's forward again, one block at a time).
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lib/backend/fresh_pages.h"
#include "lib/backend/model_base.h"
#include "lib/model/bf16_ops.h"
#include "lib/model/block_ops_cpu.h"
#include "lib/model/block_schedule.h"
#include "lib/model/layout.h"
#include "lib/model/gemm.h"
#include "lib/model/matmul.h"
#include "lib/model/model.h"
#include "lib/model/rope.h"

namespace kilter::backend {

// Rows of logits materialized at once: bounds the head's memory to kHeadChunkRows x vocab floats
// (103 MB at GPT-2's vocabulary) while keeping its GEMMs large. 512 rather than 256: the weight
// gradient's GEMM (vocab x C, summed over the chunk's rows) runs faster with the longer sum;
// GPT-2 124M, 1 x 1024 tokens, 1 thread: bf16 195 -> 204 tok/s, fp32 121 -> 124.
constexpr int64_t kHeadChunkRows = 512;
// Under sharded parameters (set_param_units), where the logits are a larger share of a rank's
// memory: a quarter of the rows (26 MB at GPT-2's vocabulary; the step's speed is set by the unit
// gathers there).
constexpr int64_t kShardedHeadChunkRows = 128;

// GEMM threads of this process (model::set_gemm_threads); the trainer passes train.threads.
void set_blas_threads(int threads);

class CpuModel final : public ModelBase {
 public:
  CpuModel(const model::ModelSpec& cfg, size_t pad_multiple, const std::string& precision = "fp32",
           const std::string& recompute = "none", bool bf16_storage = false);
  ~CpuModel() override { release_moments(); }

  std::string backend_name() const override { return "cpu"; }
  std::string describe() const override;

  void init_params(uint64_t seed) override;
  void set_params(const float* host) override;
  void get_params(float* host) const override;
  void params_changed() override {
    if (master_sharded_)
      widen_norms(0, layout_.padded_size);  // the working copy was gathered
    else if (!units_)
      refresh_bf16_params();  // sharded parameters: each unit is rounded as it is gathered
  }
  // bf16 storage under a sharded optimizer is the distributed optimizer (model.h
  // gathered_working_copy): the fp32 master of the owned ranges only.
  void shard_optimizer(const std::vector<model::ParamRange>& owned) override;
  uint16_t* gathered_working_copy() override { return master_sharded_ ? params_bf16_.data() : nullptr; }
  bool supports_param_units() const override { return true; }
  void set_param_units(model::ParamUnitHooks* hooks) override;
  bool takes_arriving_params() const override { return true; }
  void params_arriving(std::function<void(size_t end)> wait) override;
  void finish_arriving_params() override { await_params(layout_.padded_size); }

  double forward_backward(const model::Batch& batch, float loss_scale, const model::GradReadyFn& on_ready) override;
  double forward_loss(const model::Batch& batch) override;

  void zero_grads() override;
  float* grads() override { return grads_.data(); }
  float* params() override {
    await_params(layout_.padded_size);
    return params_.data();
  }
  double grad_norm_squared() override;
  bool grads_finite(size_t offset, size_t count) override;
  void adamw_step(const model::AdamWParams& p) override;
  void reserve(int max_tokens, int context) override;

 private:
  using BlockActivations = model::BlockActivations;

  BlockActivations block_activations(int layer, int N);
  // precision=bf16: the bf16 roundings of a block's four Linear inputs, made by the forward and
  // read by the backward (all null in fp32 and with bf16 storage).
  model::Bf16Inputs block_inputs_bf16(int layer, int N);
  // Grows the activations to `tokens` rows and `att` saved-softmax floats per layer.
  void ensure_capacity(size_t tokens, size_t att);
  // The batch checked, room for it, the op table's memory and batch, the embeddings into encoded_
  // (their weights awaited; bf16 storage: rounded) and llama's positions; then the blocks through
  // the schedule, to the final norm's output in lnf_.
  void forward(const model::Batch& batch);
  // The LM head's logits, loss and gradient into dln_ (the final norm's output gradient); returns
  // the summed loss. bf16 storage: the CUDA bf16 datapath's classifier (classifier_bf16).
  double head_backward(const model::Batch& batch, float loss_scale);
  // Both datapaths' backward after the head: the final norm, the blocks last to first (each
  // block's gradients reported ready), then the embeddings.
  void backward_from_final_norm(const model::Batch& batch, const model::GradReadyFn& on_ready);
  // The weight copy the bf16 GEMMs read: param's position in params_bf16_ (null for null).
  const model::bf16* working(const float* param) const {
    return param == nullptr ? nullptr : params_bf16_.data() + (param - params_.data());
  }
  // precision=bf16: the scope that routes this thread's matmuls to bf16 (empty in fp32 and with
  // bf16 storage).
  std::optional<model::Bf16MatmulScope> gemm_precision_scope() const;
  void refresh_bf16_params();  // params_bf16_ = bf16(params_)
  // params_arriving: waits for params_[0, end) and rounds the part that just arrived to bf16.
  // const: get_params reads only what has arrived (the wait and the rounding touch neither the
  // model's values nor anything a caller sees).
  void await_params(size_t end) const;
  // The distributed optimizer: the norms' fp32 weights in widened_[lo, hi) from the working copy.
  void widen_norms(size_t lo, size_t hi) const;
  // The distributed optimizer: the master's pages outside the owned ranges back to the system.
  void drop_unowned_master();
  // Sharded parameters: the unit must be whole now (bf16: rounded where it was just gathered).
  void unit_needed(int unit);
  // A tied head reads the embeddings, which the forward let go after the encoder: gathered again
  // before the head, and let go after its backward (head_done: its gradient part reduce-scattered).
  void head_needs_embeddings();
  void head_finished();
  model::ParamUnitHooks* units_ = nullptr;  // null: every parameter is always here
  int64_t head_chunk_rows_ = kHeadChunkRows;  // kShardedHeadChunkRows under units_
  std::vector<model::ParamRange> unit_ranges_;
  mutable std::function<void(size_t)> arriving_;  // set while the gather is in flight
  mutable size_t arrived_end_ = 0;
  // Gathers the rows with a target; returns their count.
  int64_t gather_target_rows(const model::Batch& batch);

  // ModelBase's copy policy: the moments in host memory.
  float* allocate_moments(size_t floats) override { return new float[floats](); }
  void free_moments(float* moments) override { delete[] moments; }
  void upload(float* to, const float* host, size_t count) override { std::copy(host, host + count, to); }
  void download(float* host, const float* from, size_t count) const override { std::copy(from, from + count, host); }
  void zero(float* to, size_t count) override { std::fill(to, to + count, 0.0f); }

  // Zeroed pages from the system, touched only where written: sharded parameters
  // (train.shard = parameters) never make a rank hold the whole buffers.
  std::vector<float, FreshPagesAllocator<float>> params_, grads_;
  // precision=bf16: the bf16 copy of params_ the GEMMs read (empty in fp32).
  bool bf16_ = false;
  bool bf16_storage_ = false;  // the oracle of the GPU's bf16 storage (above)
  std::vector<model::bf16> params_bf16_;
  // The distributed optimizer (bf16 storage with a sharded optimizer, Megatron's): params_ holds
  // the fp32 master of the owned ranges only (the rest returned to the system), params_bf16_ is
  // the gathered working copy every weight is read through, and widened_ holds, at the
  // parameters' offsets, the norms' weights widened from it for the kernels that take fp32 (its
  // other pages never touched). The embeddings are read from the working copy.
  bool master_sharded_ = false;
  mutable std::vector<float, FreshPagesAllocator<float>> widened_;
  std::vector<model::ParamRange> norm_ranges_;
  // precision=bf16: per layer and token, plan_.bf16_inputs_per_token bf16s (BlockInputsBf16; empty in fp32).
  std::vector<model::bf16> inputs_bf16_;

  // Activations, laid out by the model description's activation layout (spec.h): sized for
  // capacity_tokens_ (N) and capacity_att_ (NH * sum(len^2)) per layer. block_acts_ holds what
  // each layer keeps for the backward, block_scratch_ what recompute drops (one block's worth that
  // every layer shares); att_ holds att_layers() layers' softmax.
  size_t att_layers() const { return plan_.attention_per_layer ? size_t(cfg_.n_layer) : 1; }
  size_t capacity_tokens_ = 0, capacity_att_ = 0;
  std::vector<float> encoded_, block_acts_, block_scratch_, att_, lnf_, lnf_mean_, lnf_rstd_;
  // Backward scratch: residual-stream gradient and per-op input gradients (dact_: llama's SwiGLU
  // output gradient).
  std::vector<float> dresidual_, dln_, dqkv_, datty_, dfch_, dact_;
  // bf16 storage: a Linear layer's output before the fused residual add + norm, and the bf16
  // copy of dresidual_ the GEMMs read.
  std::vector<float> projection_, dresidual_bf16_;
  // llama: RoPE's table for the context, and the current micro-batch's positions (piece offset +
  // index).
  model::RopeTable rope_;
  std::vector<int32_t> positions_;
  // The datapath's op table and the memory it resolves names into.
  model::BlockMemory memory_;
  std::unique_ptr<model::BlockOps> ops_;
  // LM head: rows that have a target, gathered; one chunk of logits at a time.
  std::vector<int32_t> target_rows_, target_ids_;
  std::vector<float> head_inputs_, head_dinputs_, logits_;
};

}  // namespace kilter::backend
