// CpuBf16BlockOps: the CPU bf16-storage op table of the block schedule (block_ops_cpu.h), the
// oracle of the CUDA bf16 datapath entry for entry, over the kernels' CPU twins (bf16_ops.h,
// attention_bf16.h): activations are bf16 values in fp32 buffers, rounded where the device stores
// them; GEMMs multiply them with the weights' bf16 copy, accumulating in fp32; the residual
// stream's gradient stays fp32 with a bf16 copy the GEMMs read; weight gradients stay fp32.
#include "lib/model/attention_bf16.h"
#include "lib/model/bf16_ops.h"
#include "lib/model/block_ops_cpu.h"

namespace kilter::model {

namespace {
NormSpec norm_spec(bool rms, const ModelSpec& spec) { return {rms, static_cast<float>(spec.norm_eps)}; }
}  // namespace

void CpuBf16BlockOps::norm(const NormArgs& a) {
  const NormTensors t = norm_tensors(a.layer, a.out);
  norm_forward_bf16(t.out, t.mean, t.rstd, stream(a.layer, a.in), t.w, t.b, rows_, spec_.n_embd, norm_spec(a.rms, spec_));
}

void CpuBf16BlockOps::linear(const LinearArgs& a) {
  const LinearTensors t = linear_tensors(a.layer, a.weight);
  linear_forward_bf16(act(a.layer, a.out), nullptr, act(a.layer, a.in), working(t.w), working(t.b), rows_, t.in, t.out);
}

void CpuBf16BlockOps::linear_gelu(const LinearGeluArgs& a) {
  // recompute = gelu recomputes GELU from the stored bf16 pre-activation: the forward starts there too.
  if (recompute_ == Recompute::gelu) return CpuBlockOps::linear_gelu(a);
  const LinearTensors t = linear_tensors(a.layer, a.weight);
  linear_forward_bf16(act(a.layer, a.out), act(a.layer, a.pre_gelu), act(a.layer, a.in), working(t.w), working(t.b),
                      rows_, t.in, t.out);
}

void CpuBf16BlockOps::projection_residual_norm(const ResidualNormArgs& a) {
  const LinearTensors t = linear_tensors(a.layer, a.weight);
  linear_forward_bf16(memory_.projection, nullptr, act(a.layer, a.in), working(t.w), working(t.b), rows_, t.in, t.out);
  const NormTensors n = norm_tensors(a.layer, a.norm_out);
  residual_norm_forward_bf16(stream(a.layer, a.out), n.out, n.mean, n.rstd, stream(a.layer, a.residual),
                             memory_.projection, n.w, n.b, rows_, spec_.n_embd, norm_spec(a.rms, spec_));
}

void CpuBf16BlockOps::gelu(const ActivationArgs& a) {
  gelu_forward_bf16(act(a.layer, a.out), act(a.layer, a.in), static_cast<size_t>(rows_) * spec_.ffn_width());
}

void CpuBf16BlockOps::swiglu(const ActivationArgs& a) {
  swiglu_forward_bf16(act(a.layer, a.out), act(a.layer, a.in), rows_, spec_.ffn_width());
}

void CpuBf16BlockOps::rope(const RopeArgs& a) {
  float* qkv = act(a.layer, Act::qkv);
  rope_forward(qkv, positions_, rows_, shape_, *rope_);
  round_bf16_columns(qkv, rows_, shape_.row_width(), 0, shape_.q_width() + shape_.n_kv_head * shape_.head_dim);
}

void CpuBf16BlockOps::attention_kernel(int layer, float* out, const AttentionPrefix& prefix, AttentionPieces which) {
  const BlockActivations x = memory_.activations(layer, rows_);
  attention_bf16_forward(out, x.att, x.qkv, batch_->cu_seqlens.data(), batch_->num_pieces(), shape_, prefix, which);
}

void CpuBf16BlockOps::attention_kernel_backward(int layer, const AttentionPrefix& prefix, AttentionPieces which) {
  const BlockActivations x = memory_.activations(layer, rows_);
  attention_bf16_backward(grad(Grad::dqkv), grad(Grad::datty), x.qkv, x.att, batch_->cu_seqlens.data(),
                          batch_->num_pieces(), shape_, prefix, which);
}

void CpuBf16BlockOps::linear_backward(const LinearBackwardArgs& a) {
  const LinearTensors t = linear_tensors(a.layer, a.weight);
  linear_backward_bf16(grad(a.dinp), t.dw, t.db, gemm_input(a.dout), act(a.layer, a.in), working(t.w), nullptr, rows_,
                       t.in, t.out);
}

void CpuBf16BlockOps::linear_gelu_backward(const LinearGeluBackwardArgs& a) {
  const LinearTensors t = linear_tensors(a.layer, a.weight);
  linear_backward_bf16(grad(a.dinp), t.dw, t.db, gemm_input(a.dout), act(a.layer, a.in), working(t.w),
                       act(a.layer, a.pre_gelu), rows_, t.in, t.out);
}

void CpuBf16BlockOps::swiglu_backward(const ActivationBackwardArgs& a) {
  swiglu_backward_bf16(grad(a.dinp), grad(a.dout), act(a.layer, a.in), rows_, spec_.ffn_width());
}

void CpuBf16BlockOps::norm_backward(const NormBackwardArgs& a) {
  const NormTensors t = norm_tensors(a.layer, a.norm);
  norm_backward_bf16(grad(a.dinp), memory_.dresidual_bf16, t.dw, t.db, grad(a.dout), stream(a.layer, a.in), t.w, t.mean,
                     t.rstd, rows_, spec_.n_embd, norm_spec(a.rms, spec_));
}

void CpuBf16BlockOps::rope_backward(const RopeBackwardArgs&) {
  float* dqkv = grad(Grad::dqkv);
  model::rope_backward(dqkv, positions_, rows_, shape_, *rope_);
  round_bf16_columns(dqkv, rows_, shape_.row_width(), 0, shape_.q_width() + shape_.n_kv_head * shape_.head_dim);
}

void CpuBf16BlockOps::kv_wait_add_grads(const ExchangeArgs& a) {
  // The dK/dV of later parts elsewhere arrive in fp32 and are added, then the sums rounded, as the
  // device's staging does.
  CpuBlockOps::kv_wait_add_grads(a);
  round_bf16_inplace(grad(Grad::dqkv), static_cast<size_t>(rows_) * spec_.qkv_width());
}

}  // namespace kilter::model
