// The CPU's op tables of the block schedule (block_ops_cpu.h): the fp32 table over the kernels of
// lib/model, and the bf16-storage table, the CUDA bf16 datapath's oracle entry for entry, over
// the kernels' CPU twins (bf16_ops.h, attention_bf16.h): activations are bf16 values in fp32
// buffers, rounded where the device stores them; GEMMs multiply them with the weights' bf16 copy,
// accumulating in fp32; the residual stream's gradient stays fp32 with a bf16 copy the GEMMs read;
// weight gradients stay fp32.
#include "lib/model/block_ops_cpu.h"

#include <cstring>

#include "lib/model/attention_bf16.h"
#include "lib/model/bf16_ops.h"
#include "lib/model/gelu.h"
#include "lib/model/layernorm.h"
#include "lib/model/matmul.h"
#include "lib/model/rmsnorm.h"
#include "lib/model/swiglu.h"

namespace kilter::model {

namespace {

// fp32, and the bf16-GEMM precision (the GEMMs under the owner's Bf16MatmulScope, their inputs'
// roundings kept for the backward). Fusions: the residual add in the projection's GEMM; the rest
// two calls.
class CpuBlockOps : public BlockOps, protected BlockNames<float, BlockMemory> {
 public:
  CpuBlockOps(const ModelSpec& spec, const BlockMemory& memory, bool bf16_gemm, Recompute recompute)
      : BlockNames(spec, memory), bf16_gemm_(bf16_gemm), recompute_(recompute),
        shape_{spec.n_head, spec.kv_heads(), spec.head_dim()} {}

  void weights_needed(int layer) override {
    if (memory_.weights_needed) memory_.weights_needed(layer);
  }
  void norm(const NormArgs& a) override {
    const NormTensors t = norm_tensors(a.layer, a.out);
    const float eps = static_cast<float>(spec_.norm_eps);
    if (a.rms)
      rmsnorm_forward(t.out, t.rstd, stream(a.layer, a.in), t.w, rows(), spec_.n_embd, eps);
    else
      layernorm_forward(t.out, t.mean, t.rstd, stream(a.layer, a.in), t.w, t.b, rows(), spec_.n_embd, eps);
  }
  void linear(const LinearArgs& a) override {
    const LinearTensors t = linear_tensors(a.layer, a.weight);
    matmul_forward(act(a.layer, a.out), act(a.layer, a.in), t.w, t.b, rows(), t.in, t.out, bf16_input(a.layer, a.in));
  }
  void projection_residual_norm(const ResidualNormArgs& a) override {
    const LinearTensors t = linear_tensors(a.layer, a.weight);
    matmul_forward_residual(stream(a.layer, a.out), stream(a.layer, a.residual), act(a.layer, a.in), t.w, t.b, rows(),
                            t.in, t.out, bf16_input(a.layer, a.in));
    norm({.layer = a.layer, .out = a.norm_out, .in = a.out, .rms = a.rms});
  }
  void gelu(const ActivationArgs& a) override {
    gelu_forward(act(a.layer, a.out), act(a.layer, a.in), static_cast<size_t>(rows()) * spec_.ffn_width());
  }
  void swiglu(const ActivationArgs& a) override {
    swiglu_forward(act(a.layer, a.out), act(a.layer, a.in), rows(), spec_.ffn_width());
  }
  void rope(const LayerArgs& a) override {
    rope_forward(act(a.layer, Act::qkv), memory_.positions, rows(), shape_, *memory_.rope);
  }
  void attention(const AttentionArgs& a) override {
    if (memory_.attention) return memory_.attention(a.layer);
    float* out = act(a.layer, a.out);
    if (a.pieces == AttentionPieces::all) return attention_kernel(a.layer, out, {}, a.pieces);
    const AttentionPrefix p = prefix();
    if (a.pieces == AttentionPieces::with_prefix) {
      if (p.offset == nullptr) return;
      for (int piece = 0; piece < batch().num_pieces(); ++piece)
        prefix_kv_[piece] = p.of(piece) > 0 ? batch().exchange->prefix_kv(a.layer, piece) : nullptr;
    }
    attention_kernel(a.layer, out, p, a.pieces);
  }
  bool exchanging() const override { return memory_.batch != nullptr && memory_.batch->exchange != nullptr; }
  void kv_send(const LayerArgs& a) override { batch().exchange->forward_send(a.layer, act(a.layer, Act::qkv)); }
  void kv_wait(const LayerArgs& a) override { batch().exchange->forward_wait(a.layer); }
  void kv_progress() override {
    if (exchanging()) batch().exchange->progress();
  }

  void linear_backward(const LinearBackwardArgs& a) override {
    const LinearTensors t = linear_tensors(a.layer, a.weight);
    matmul_backward_overwrite_dinp(grad(a.dinp), t.dw, t.db, grad(a.dout), act(a.layer, a.in), t.w, rows(), t.in,
                                   t.out, bf16_input(a.layer, a.in));
  }
  void linear_gelu_backward(const LinearGeluBackwardArgs& a) override {
    linear_backward({.layer = a.layer, .dinp = a.dinp, .dout = a.dout, .in = a.in, .weight = a.weight});
    gelu_backward_inplace(grad(a.dinp), act(a.layer, a.pre_gelu), static_cast<size_t>(rows()) * spec_.ffn_width());
  }
  void swiglu_backward(const ActivationBackwardArgs& a) override {
    model::swiglu_backward(grad(a.dinp), grad(a.dout), act(a.layer, a.in), rows(), spec_.ffn_width());
  }
  void norm_backward(const NormBackwardArgs& a) override {
    const NormTensors t = norm_tensors(a.layer, a.norm);
    const float* in = stream(a.layer, a.in);
    if (a.rms)
      rmsnorm_backward(grad(a.dinp), t.dw, grad(a.dout), in, t.w, t.rstd, rows(), spec_.n_embd);
    else
      layernorm_backward(grad(a.dinp), t.dw, t.db, grad(a.dout), in, t.w, t.mean, t.rstd, rows(), spec_.n_embd);
  }
  void rope_backward(const LayerArgs&) override {
    model::rope_backward(grad(Grad::dqkv), memory_.positions, rows(), shape_, *memory_.rope);
  }
  void attention_backward(const AttentionBackwardArgs& a) override {
    // The fp32 kernels add into dqkv: zeroed before the layer's first call.
    if (zero_dqkv_ && a.pieces != AttentionPieces::without_prefix)
      std::memset(grad(Grad::dqkv), 0, sizeof(float) * static_cast<size_t>(rows()) * spec_.qkv_width());
    if (a.pieces == AttentionPieces::all) return attention_kernel_backward(a.layer, {}, a.pieces);
    const AttentionPrefix p = prefix();
    if (a.pieces == AttentionPieces::with_prefix) {
      if (p.offset == nullptr) return;
      for (int piece = 0; piece < batch().num_pieces(); ++piece) {
        const bool has = p.of(piece) > 0;
        prefix_kv_[piece] = has ? batch().exchange->prefix_kv(a.layer, piece) : nullptr;
        prefix_dkv_[piece] = has ? batch().exchange->prefix_dkv(a.layer, piece) : nullptr;
      }
    }
    attention_kernel_backward(a.layer, p, a.pieces);
  }
  void kv_send_grads(const LayerArgs& a) override { batch().exchange->backward_send(a.layer); }
  void kv_wait_add_grads(const LayerArgs& a) override {
    batch().exchange->backward_wait_add(a.layer, grad(Grad::dqkv));
  }

 protected:
  const Batch& batch() const { return *memory_.batch; }
  bf16* bf16_input(int layer, Act in) const {  // the forward's rounding of a Linear input
    if (!memory_.bf16_inputs) return nullptr;
    const Bf16Inputs h = memory_.bf16_inputs(layer, rows());
    return in == Act::ln1 ? h.ln1 : in == Act::atty ? h.atty : in == Act::ln2 ? h.ln2 : h.fch_act;
  }
  // The batch's prefixes over prefix_kv_ / prefix_dkv_ (offset null when no piece has one).
  AttentionPrefix prefix() {
    AttentionPrefix prefix;
    if (batch().pos_offset.empty()) return prefix;
    prefix_kv_.resize(batch().pos_offset.size());
    prefix_dkv_.resize(batch().pos_offset.size());
    return {batch().pos_offset.data(), prefix_kv_.data(), prefix_dkv_.data()};
  }
  virtual void attention_kernel(int layer, float* out, const AttentionPrefix& prefix, AttentionPieces which) {
    const BlockActivations x = memory_.activations(layer, rows());
    attention_forward(out, x.att, x.qkv, batch().cu_seqlens.data(), batch().num_pieces(), shape_, bf16_gemm_, prefix,
                      which);
  }
  virtual void attention_kernel_backward(int layer, const AttentionPrefix& prefix, AttentionPieces which) {
    const BlockActivations x = memory_.activations(layer, rows());
    model::attention_backward(grad(Grad::dqkv), grad(Grad::datty), x.qkv, x.att, batch().cu_seqlens.data(),
                              batch().num_pieces(), shape_, bf16_gemm_, prefix, which);
  }

  bool bf16_gemm_;
  Recompute recompute_;
  AttentionShape shape_;
  bool zero_dqkv_ = true;  // the bf16 twins overwrite the rows of the pieces they compute
  // Per piece of the batch: its prefix's K/V and dK/dV in the exchange (null: none).
  std::vector<const float*> prefix_kv_;
  std::vector<float*> prefix_dkv_;
};

// bf16 storage: the device's fusions (the residual add with the next norm, GELU in the GEMM's
// epilogue but under recompute = gelu, which restarts from the stored bf16 pre-activation, DGELU).
class CpuBf16BlockOps final : public CpuBlockOps {
 public:
  CpuBf16BlockOps(const ModelSpec& spec, const BlockMemory& memory, Recompute recompute)
      : CpuBlockOps(spec, memory, false, recompute) {
    zero_dqkv_ = false;
  }
  void norm(const NormArgs& a) override {
    const NormTensors t = norm_tensors(a.layer, a.out);
    norm_forward_bf16(t.out, t.mean, t.rstd, stream(a.layer, a.in), t.w, t.b, rows(), spec_.n_embd, norm_spec(a.rms));
  }
  void linear(const LinearArgs& a) override {
    const LinearTensors t = linear_tensors(a.layer, a.weight);
    linear_forward_bf16(act(a.layer, a.out), nullptr, act(a.layer, a.in), working(t.w), working(t.b), rows(), t.in,
                        t.out);
  }
  void linear_gelu(const LinearGeluArgs& a) override {
    if (recompute_ == Recompute::gelu) return BlockOps::linear_gelu(a);
    const LinearTensors t = linear_tensors(a.layer, a.weight);
    linear_forward_bf16(act(a.layer, a.out), act(a.layer, a.pre_gelu), act(a.layer, a.in), working(t.w),
                        working(t.b), rows(), t.in, t.out);
  }
  void projection_residual_norm(const ResidualNormArgs& a) override {
    const LinearTensors t = linear_tensors(a.layer, a.weight);
    linear_forward_bf16(memory_.projection, nullptr, act(a.layer, a.in), working(t.w), working(t.b), rows(), t.in,
                        t.out);
    const NormTensors n = norm_tensors(a.layer, a.norm_out);
    residual_norm_forward_bf16(stream(a.layer, a.out), n.out, n.mean, n.rstd, stream(a.layer, a.residual),
                               memory_.projection, n.w, n.b, rows(), spec_.n_embd, norm_spec(a.rms));
  }
  void gelu(const ActivationArgs& a) override {
    gelu_forward_bf16(act(a.layer, a.out), act(a.layer, a.in), static_cast<size_t>(rows()) * spec_.ffn_width());
  }
  void swiglu(const ActivationArgs& a) override {
    swiglu_forward_bf16(act(a.layer, a.out), act(a.layer, a.in), rows(), spec_.ffn_width());
  }
  void rope(const LayerArgs& a) override {
    CpuBlockOps::rope(a);
    round_qk(act(a.layer, Act::qkv));
  }
  void linear_backward(const LinearBackwardArgs& a) override {
    const LinearTensors t = linear_tensors(a.layer, a.weight);
    linear_backward_bf16(grad(a.dinp), t.dw, t.db, gemm_input(a.dout), act(a.layer, a.in), working(t.w), nullptr,
                         rows(), t.in, t.out);
  }
  void linear_gelu_backward(const LinearGeluBackwardArgs& a) override {
    const LinearTensors t = linear_tensors(a.layer, a.weight);
    linear_backward_bf16(grad(a.dinp), t.dw, t.db, gemm_input(a.dout), act(a.layer, a.in), working(t.w),
                         act(a.layer, a.pre_gelu), rows(), t.in, t.out);
  }
  void swiglu_backward(const ActivationBackwardArgs& a) override {
    swiglu_backward_bf16(grad(a.dinp), grad(a.dout), act(a.layer, a.in), rows(), spec_.ffn_width());
  }
  void norm_backward(const NormBackwardArgs& a) override {
    const NormTensors t = norm_tensors(a.layer, a.norm);
    norm_backward_bf16(grad(a.dinp), memory_.dresidual_bf16, t.dw, t.db, grad(a.dout), stream(a.layer, a.in), t.w,
                       t.mean, t.rstd, rows(), spec_.n_embd, norm_spec(a.rms));
  }
  void rope_backward(const LayerArgs& a) override {
    CpuBlockOps::rope_backward(a);
    round_qk(grad(Grad::dqkv));
  }
  void kv_wait_add_grads(const LayerArgs& a) override {
    // The dK/dV of later parts elsewhere arrive in fp32 and are added, then the sums rounded, as
    // the device's staging does.
    CpuBlockOps::kv_wait_add_grads(a);
    round_bf16_inplace(grad(Grad::dqkv), static_cast<size_t>(rows()) * spec_.qkv_width());
  }

 private:
  void attention_kernel(int layer, float* out, const AttentionPrefix& prefix, AttentionPieces which) override {
    const BlockActivations x = memory_.activations(layer, rows());
    attention_bf16_forward(out, x.att, x.qkv, batch().cu_seqlens.data(), batch().num_pieces(), shape_, prefix, which);
  }
  void attention_kernel_backward(int layer, const AttentionPrefix& prefix, AttentionPieces which) override {
    const BlockActivations x = memory_.activations(layer, rows());
    attention_bf16_backward(grad(Grad::dqkv), grad(Grad::datty), x.qkv, x.att, batch().cu_seqlens.data(),
                            batch().num_pieces(), shape_, prefix, which);
  }
  NormSpec norm_spec(bool rms) const { return {rms, static_cast<float>(spec_.norm_eps)}; }
  // RoPE's output (or gradient) rounded in its q and k columns, as the device's kernel stores it.
  void round_qk(float* qkv) const {
    round_bf16_columns(qkv, rows(), shape_.row_width(), 0, shape_.q_width() + shape_.n_kv_head * shape_.head_dim);
  }
  const bf16* working(const float* param) const {
    return param == nullptr ? nullptr : memory_.params_bf16 + (param - memory_.params);
  }
  // The GEMMs read dresidual's bf16 copy.
  const float* gemm_input(Grad g) const { return g == Grad::dresidual ? memory_.dresidual_bf16 : grad(g); }
};

}  // namespace

std::unique_ptr<BlockOps> make_cpu_block_ops(const ModelSpec& spec, const BlockMemory& memory, bool bf16_gemm,
                                             bool bf16_storage, Recompute recompute) {
  if (bf16_storage) return std::make_unique<CpuBf16BlockOps>(spec, memory, recompute);
  return std::make_unique<CpuBlockOps>(spec, memory, bf16_gemm, recompute);
}

}  // namespace kilter::model
