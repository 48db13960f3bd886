// The CPU's op tables of the block schedule (block_schedule.h): CpuBlockOps runs the fp32 kernels
// of lib/model (the oracle; with precision bf16 their GEMMs take bf16 inputs under the owner's
// Bf16MatmulScope), CpuBf16BlockOps the bf16-storage twins of the CUDA kernels (bf16_ops.h,
// attention_bf16.h), rounding where the device stores bf16. Their owners (the CPU backend, the
// KV-cache generator) hand them their memory (BlockMemory, block_names.h); the generator's
// attention over its cache is its own entry (a subclass).
#pragma once
#include <cstdint>
#include <vector>

#include "lib/model/attention.h"
#include "lib/model/block_names.h"
#include "lib/model/block_schedule.h"
#include "lib/model/model.h"
#include "lib/model/rope.h"

namespace kilter::model {

class CpuBlockOps : public BlockOps, protected BlockNames {
 public:
  CpuBlockOps(const ModelSpec& spec, const BlockMemory& memory, bool bf16_gemm, Recompute recompute);
  // The rows the next calls run on, llama's positions (and RoPE table), and the micro-batch
  // (attention's pieces and K/V exchange; null where attention is a subclass's own).
  void begin(int rows, const int32_t* positions, const RopeTable* rope, const Batch* batch);

  void weights_needed(int layer) override;
  void norm(const NormArgs& a) override;
  void linear(const LinearArgs& a) override;
  void linear_gelu(const LinearGeluArgs& a) override;  // two calls
  void projection_residual_norm(const ResidualNormArgs& a) override;  // two calls
  void gelu(const ActivationArgs& a) override;
  void swiglu(const ActivationArgs& a) override;
  void rope(const RopeArgs& a) override;
  void attention(const AttentionArgs& a) override;
  bool exchanging() const override { return batch_ != nullptr && batch_->exchange != nullptr; }
  void kv_send(const ExchangeArgs& a) override;
  void kv_wait(const ExchangeArgs& a) override;
  void kv_progress() override;

  void linear_backward(const LinearBackwardArgs& a) override;
  void linear_gelu_backward(const LinearGeluBackwardArgs& a) override;  // two calls
  void swiglu_backward(const ActivationBackwardArgs& a) override;
  void norm_backward(const NormBackwardArgs& a) override;
  void rope_backward(const RopeBackwardArgs& a) override;
  void attention_backward(const AttentionBackwardArgs& a) override;
  void kv_send_grads(const ExchangeArgs& a) override;
  void kv_wait_add_grads(const ExchangeArgs& a) override;

 protected:
  bf16* bf16_input(int layer, Act in) const;  // precision bf16: the forward's rounding of `in`
  // The batch's prefixes over prefix_kv_ / prefix_dkv_ (offset null when no piece has one).
  AttentionPrefix prefix() const;
  // The attention kernels (bf16 storage: their twins).
  virtual void attention_kernel(int layer, float* out, const AttentionPrefix& prefix, AttentionPieces which);
  virtual void attention_kernel_backward(int layer, const AttentionPrefix& prefix, AttentionPieces which);

  bool bf16_gemm_;
  Recompute recompute_;
  AttentionShape shape_;
  const int32_t* positions_ = nullptr;
  const RopeTable* rope_ = nullptr;
  const Batch* batch_ = nullptr;
  bool zero_dqkv_ = true;  // the fp32 attention backward adds into dqkv
  // Per piece of the batch: its prefix's K/V and dK/dV in the exchange (null: none).
  std::vector<const float*> prefix_kv_;
  std::vector<float*> prefix_dkv_;
};

// The bf16-storage table (the CUDA bf16 datapath's oracle): every activation a bf16 value in the
// fp32 buffers, GEMMs on the weights' bf16 copy, the device's fusions (the residual add with the
// next norm, GELU in the GEMM's epilogue but under recompute = gelu, DGELU).
class CpuBf16BlockOps final : public CpuBlockOps {
 public:
  CpuBf16BlockOps(const ModelSpec& spec, const BlockMemory& memory, Recompute recompute)
      : CpuBlockOps(spec, memory, false, recompute) {
    zero_dqkv_ = false;  // the twins overwrite the rows of the pieces they compute
  }
  void norm(const NormArgs& a) override;
  void linear(const LinearArgs& a) override;
  void linear_gelu(const LinearGeluArgs& a) override;
  void projection_residual_norm(const ResidualNormArgs& a) override;
  void gelu(const ActivationArgs& a) override;
  void swiglu(const ActivationArgs& a) override;
  void rope(const RopeArgs& a) override;
  void linear_backward(const LinearBackwardArgs& a) override;
  void linear_gelu_backward(const LinearGeluBackwardArgs& a) override;
  void swiglu_backward(const ActivationBackwardArgs& a) override;
  void norm_backward(const NormBackwardArgs& a) override;
  void rope_backward(const RopeBackwardArgs& a) override;
  void kv_wait_add_grads(const ExchangeArgs& a) override;

 private:
  void attention_kernel(int layer, float* out, const AttentionPrefix& prefix, AttentionPieces which) override;
  void attention_kernel_backward(int layer, const AttentionPrefix& prefix, AttentionPieces which) override;
  const bf16* working(const float* param) const {
    return param == nullptr ? nullptr : memory_.params_bf16 + (param - memory_.params);
  }
  // The GEMMs read dresidual's bf16 copy.
  const float* gemm_input(Grad g) const { return g == Grad::dresidual ? memory_.dresidual_bf16 : grad(g); }
};

}  // namespace kilter::model
