// CpuBlockOps: the CPU fp32 op table of the block schedule (block_ops_cpu.h), over the kernels of
// lib/model, and the names' resolution both CPU tables share.
#include "lib/model/block_ops_cpu.h"

#include <cstring>

#include "lib/model/gelu.h"
#include "lib/model/layernorm.h"
#include "lib/model/matmul.h"
#include "lib/model/rmsnorm.h"
#include "lib/model/swiglu.h"

namespace kilter::model {

CpuBlockOps::CpuBlockOps(const ModelSpec& spec, const BlockMemory& memory, bool bf16_gemm, Recompute recompute)
    : BlockNames(spec, memory), bf16_gemm_(bf16_gemm), recompute_(recompute),
      shape_{spec.n_head, spec.kv_heads(), spec.head_dim()} {}

void CpuBlockOps::begin(int rows, const int32_t* positions, const RopeTable* rope, const Batch* batch) {
  rows_ = rows;
  positions_ = positions;
  rope_ = rope;
  batch_ = batch;
  const size_t pieces = batch == nullptr ? 0 : static_cast<size_t>(batch->num_pieces());
  prefix_kv_.assign(pieces, nullptr);
  prefix_dkv_.assign(pieces, nullptr);
}

bf16* CpuBlockOps::bf16_input(int layer, Act in) const {
  if (!memory_.bf16_inputs) return nullptr;
  const Bf16Inputs h = memory_.bf16_inputs(layer, rows_);
  switch (in) {
    case Act::ln1: return h.ln1;
    case Act::atty: return h.atty;
    case Act::ln2: return h.ln2;
    case Act::fch_act: return h.fch_act;
    default: return nullptr;
  }
}

AttentionPrefix CpuBlockOps::prefix() const {
  AttentionPrefix prefix;
  if (!batch_->pos_offset.empty()) {
    prefix.offset = batch_->pos_offset.data();
    prefix.kv = prefix_kv_.data();
    prefix.dkv = prefix_dkv_.data();
  }
  return prefix;
}

void CpuBlockOps::weights_needed(int layer) {
  if (memory_.weights_needed) memory_.weights_needed(layer);
}

void CpuBlockOps::norm(const NormArgs& a) {
  const NormTensors t = norm_tensors(a.layer, a.out);
  const float* in = stream(a.layer, a.in);
  const float eps = static_cast<float>(spec_.norm_eps);
  if (a.rms)
    rmsnorm_forward(t.out, t.rstd, in, t.w, rows_, spec_.n_embd, eps);
  else
    layernorm_forward(t.out, t.mean, t.rstd, in, t.w, t.b, rows_, spec_.n_embd, eps);
}

void CpuBlockOps::linear(const LinearArgs& a) {
  const LinearTensors t = linear_tensors(a.layer, a.weight);
  matmul_forward(act(a.layer, a.out), act(a.layer, a.in), t.w, t.b, rows_, t.in, t.out, bf16_input(a.layer, a.in));
}

void CpuBlockOps::linear_gelu(const LinearGeluArgs& a) {
  linear({.layer = a.layer, .out = a.pre_gelu, .in = a.in, .weight = a.weight});
  gelu({.layer = a.layer, .out = a.out, .in = a.pre_gelu});
}

void CpuBlockOps::projection_residual_norm(const ResidualNormArgs& a) {
  const LinearTensors t = linear_tensors(a.layer, a.weight);
  matmul_forward_residual(stream(a.layer, a.out), stream(a.layer, a.residual), act(a.layer, a.in), t.w, t.b, rows_,
                          t.in, t.out, bf16_input(a.layer, a.in));
  norm({.layer = a.layer, .out = a.norm_out, .in = a.out, .rms = a.rms});
}

void CpuBlockOps::gelu(const ActivationArgs& a) {
  gelu_forward(act(a.layer, a.out), act(a.layer, a.in), static_cast<size_t>(rows_) * spec_.ffn_width());
}

void CpuBlockOps::swiglu(const ActivationArgs& a) {
  swiglu_forward(act(a.layer, a.out), act(a.layer, a.in), rows_, spec_.ffn_width());
}

void CpuBlockOps::rope(const RopeArgs& a) { rope_forward(act(a.layer, Act::qkv), positions_, rows_, shape_, *rope_); }

void CpuBlockOps::attention_kernel(int layer, float* out, const AttentionPrefix& prefix, AttentionPieces which) {
  const BlockActivations x = memory_.activations(layer, rows_);
  attention_forward(out, x.att, x.qkv, batch_->cu_seqlens.data(), batch_->num_pieces(), shape_, bf16_gemm_, prefix,
                    which);
}

void CpuBlockOps::attention_kernel_backward(int layer, const AttentionPrefix& prefix, AttentionPieces which) {
  const BlockActivations x = memory_.activations(layer, rows_);
  model::attention_backward(grad(Grad::dqkv), grad(Grad::datty), x.qkv, x.att, batch_->cu_seqlens.data(),
                            batch_->num_pieces(), shape_, bf16_gemm_, prefix, which);
}

void CpuBlockOps::attention(const AttentionArgs& a) {
  float* out = act(a.layer, a.out);
  if (a.pieces == AttentionPieces::all) return attention_kernel(a.layer, out, {}, a.pieces);
  const AttentionPrefix p = prefix();
  if (a.pieces == AttentionPieces::with_prefix) {
    if (p.offset == nullptr) return;
    for (int piece = 0; piece < batch_->num_pieces(); ++piece)
      prefix_kv_[piece] = p.of(piece) > 0 ? batch_->exchange->prefix_kv(a.layer, piece) : nullptr;
  }
  attention_kernel(a.layer, out, p, a.pieces);
}

void CpuBlockOps::kv_send(const ExchangeArgs& a) { batch_->exchange->forward_send(a.layer, act(a.layer, Act::qkv)); }

void CpuBlockOps::kv_wait(const ExchangeArgs& a) { batch_->exchange->forward_wait(a.layer); }

void CpuBlockOps::kv_progress() {
  if (exchanging()) batch_->exchange->progress();
}

void CpuBlockOps::linear_backward(const LinearBackwardArgs& a) {
  const LinearTensors t = linear_tensors(a.layer, a.weight);
  matmul_backward_overwrite_dinp(grad(a.dinp), t.dw, t.db, grad(a.dout), act(a.layer, a.in), t.w, rows_, t.in, t.out,
                                 bf16_input(a.layer, a.in));
}

void CpuBlockOps::linear_gelu_backward(const LinearGeluBackwardArgs& a) {
  linear_backward({.layer = a.layer, .dinp = a.dinp, .dout = a.dout, .in = a.in, .weight = a.weight});
  gelu_backward_inplace(grad(a.dinp), act(a.layer, a.pre_gelu), static_cast<size_t>(rows_) * spec_.ffn_width());
}

void CpuBlockOps::swiglu_backward(const ActivationBackwardArgs& a) {
  model::swiglu_backward(grad(a.dinp), grad(a.dout), act(a.layer, a.in), rows_, spec_.ffn_width());
}

void CpuBlockOps::norm_backward(const NormBackwardArgs& a) {
  const NormTensors t = norm_tensors(a.layer, a.norm);
  const float* in = stream(a.layer, a.in);
  if (a.rms)
    rmsnorm_backward(grad(a.dinp), t.dw, grad(a.dout), in, t.w, t.rstd, rows_, spec_.n_embd);
  else
    layernorm_backward(grad(a.dinp), t.dw, t.db, grad(a.dout), in, t.w, t.mean, t.rstd, rows_, spec_.n_embd);
}

void CpuBlockOps::rope_backward(const RopeBackwardArgs&) {
  model::rope_backward(grad(Grad::dqkv), positions_, rows_, shape_, *rope_);
}

void CpuBlockOps::attention_backward(const AttentionBackwardArgs& a) {
  // The fp32 kernels add into dqkv: zeroed before the first call of the layer.
  if (zero_dqkv_ && a.pieces != AttentionPieces::without_prefix)
    std::memset(grad(Grad::dqkv), 0, sizeof(float) * static_cast<size_t>(rows_) * spec_.qkv_width());
  if (a.pieces == AttentionPieces::all) return attention_kernel_backward(a.layer, {}, a.pieces);
  const AttentionPrefix p = prefix();
  if (a.pieces == AttentionPieces::with_prefix) {
    if (p.offset == nullptr) return;
    for (int piece = 0; piece < batch_->num_pieces(); ++piece) {
      const bool has = p.of(piece) > 0;
      prefix_kv_[piece] = has ? batch_->exchange->prefix_kv(a.layer, piece) : nullptr;
      prefix_dkv_[piece] = has ? batch_->exchange->prefix_dkv(a.layer, piece) : nullptr;
    }
  }
  attention_kernel_backward(a.layer, p, a.pieces);
}

void CpuBlockOps::kv_send_grads(const ExchangeArgs& a) { batch_->exchange->backward_send(a.layer); }

void CpuBlockOps::kv_wait_add_grads(const ExchangeArgs& a) {
  batch_->exchange->backward_wait_add(a.layer, grad(Grad::dqkv));
}

}  // namespace kilter::model
