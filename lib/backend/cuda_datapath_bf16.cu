// CudaModel's bf16-storage datapath (train.precision = bf16 with train.bf16_storage; docs/gpu.md,
// "bf16 storage"): every activation is written in bf16 by the kernel that produces it, every GEMM
// takes bf16 operands with fp32 accumulation, and the fp32 master weights are read through their
// bf16 working copy, which AdamW writes in the same launch (the head's with its vocabulary padded
// to a multiple of 128). Gradients of the weights stay fp32 in the flat buffer the reducer and
// ZeRO-1 read. The blocks run through the block schedule (lib/model/block_schedule.h) on this
// datapath's op table, Bf16Ops below, whose entries are the CUDA twins of the CPU bf16-storage
// table's (its oracle, lib/model/block_ops_cpu.h, rounds at exactly these points):
//   forward:  encoder (bf16), ln_1; per block: qkv GEMM (bias epilogue) [llama: RoPE], attention
//             (cuDNN SDPA on the rows where sdpa_for_batch chose it, cuda_attention_sdpa.cu; else
//             the bf16 cuBLASLt engine in padded groups), the output projection, the residual add
//             fused with ln_2, the first MLP GEMM with GELU in its epilogue (GELU_AUX; llama: the
//             gate|up GEMM and SwiGLU), the second MLP GEMM, the residual add fused with the next
//             norm (the next block's ln_1, or ln_f);
//   head:     the chunked classifier (bf16 logits of a chunk of rows, loss, dlogits in place, its
//             two GEMMs), then ln_f's backward;
//   backward: per block the MLP (DGELU epilogue; llama: SwiGLU's backward), its weight gradients
//             with BGRADB bias gradients, ln_2's backward (the residual gradient in fp32 plus its
//             bf16 copy), the attention projection, attention, [RoPE's backward], the QKV GEMM,
//             ln_1's backward; then the embeddings from the fp32 residual gradient.
// Cut pieces: the K/V exchange moves fp32 rows, so a layer's qkv is converted into fp32 staging
// before forward_send, and the dK/dV it brings are added (fp32, then rounded) from a zeroed fp32
// staging that backward_wait_add fills.
#include <algorithm>
#include <cstring>

#include "lib/backend/cuda_model_impl.cuh"

namespace kilter::backend {

using model::Act;
using model::AttentionPieces;
using model::Grad;
using model::Stream;

// The bf16-storage datapath's op table (block_schedule.h): the names resolved by BlockNames into
// the bf16 arena (bacts_) and the weights (the norms read the fp32 masters, the GEMMs their bf16
// working copy), on the segment's stream and GEMM engine (s_, g_). Fusions: the residual
// add with the next norm, GELU in the first MLP GEMM's epilogue (but under recompute = gelu,
// which restarts from the stored pre-activation), DGELU and BGRADB in the backward's GEMMs.
class CudaModel::Bf16Ops final : public DeviceOps<kc::bf16> {
 public:
  // The GEMMs read the residual stream's gradient through its bf16 copy.
  explicit Bf16Ops(CudaModel& m)
      : DeviceOps(m, m.memory_bf16_, m.bacts_,
                  {m.bacts_.dresidual_bf16, m.bacts_.dln, m.bacts_.datty, m.bacts_.dqkv, m.bacts_.dfch, m.bacts_.dact}),
        x_(m.bacts_) {}
  void norm(const model::NormArgs& a) override {
    const NormTensors n = norm_tensors(a.layer, a.out);
    kc::residual_norm_forward_bf16(nullptr, n.out, n.mean, n.rstd, stream(a.layer, a.in), nullptr, n.w, n.b, rows(),
                                   spec_.n_embd, a.rms, eps(), m_.s_);
  }
  void linear(const model::LinearArgs& a) override {
    const LinearTensors t = linear_tensors(a.layer, a.weight);
    kc::linear_forward_bf16(*m_.g_, act(a.layer, a.out), nullptr, act(a.layer, a.in), m_.working(t.w),
                            m_.working(t.b), rows(), t.in, t.out);
  }
  void linear_gelu(const model::LinearGeluArgs& a) override {
    if (m_.recompute_ == Recompute::gelu) return BlockOps::linear_gelu(a);
    const LinearTensors t = linear_tensors(a.layer, a.weight);
    kc::linear_forward_bf16(*m_.g_, act(a.layer, a.out), act(a.layer, a.pre_gelu), act(a.layer, a.in),
                            m_.working(t.w), m_.working(t.b), rows(), t.in, t.out);
  }
  void projection_residual_norm(const model::ResidualNormArgs& a) override {
    const LinearTensors t = linear_tensors(a.layer, a.weight);
    kc::linear_forward_bf16(*m_.g_, x_.projection, nullptr, act(a.layer, a.in), m_.working(t.w), m_.working(t.b),
                            rows(), t.in, t.out);
    const NormTensors n = norm_tensors(a.layer, a.norm_out);
    kc::residual_norm_forward_bf16(stream(a.layer, a.out), n.out, n.mean, n.rstd, stream(a.layer, a.residual),
                                   x_.projection, n.w, n.b, rows(), spec_.n_embd, a.rms, eps(), m_.s_);
  }
  void attention(const model::AttentionArgs& a) override;
  void kv_send(const model::LayerArgs& a) override {
    // The exchange reads fp32 rows from its own stream or the host: converted, and final.
    kc::to_float(x_.exchange_qkv, act(a.layer, Act::qkv), static_cast<size_t>(rows()) * spec_.qkv_width(), m_.s_);
    KILTER_CUDA_CHECK(cudaStreamSynchronize(m_.s_));
    m_.exchange_->forward_send(a.layer, x_.exchange_qkv);
  }

  void linear_backward(const model::LinearBackwardArgs& a) override {
    const LinearTensors t = linear_tensors(a.layer, a.weight);
    kc::linear_backward_bf16(*m_.g_, grad(a.dinp), t.dw, t.db, grad(a.dout), act(a.layer, a.in), m_.working(t.w),
                             nullptr, rows(), t.in, t.out, x_.column_scratch);
  }
  void linear_gelu_backward(const model::LinearGeluBackwardArgs& a) override {
    const LinearTensors t = linear_tensors(a.layer, a.weight);
    kc::linear_backward_bf16(*m_.g_, grad(a.dinp), t.dw, t.db, grad(a.dout), act(a.layer, a.in), m_.working(t.w),
                             act(a.layer, a.pre_gelu), rows(), t.in, t.out, x_.column_scratch);
  }
  void norm_backward(const model::NormBackwardArgs& a) override {
    // dinp is the residual stream's gradient: fp32, and its bf16 copy for the GEMMs.
    const NormTensors n = norm_tensors(a.layer, a.norm);
    kc::norm_backward_bf16(x_.dresidual, x_.dresidual_bf16, n.dw, n.db, grad(a.dout), stream(a.layer, a.in), n.w,
                           n.mean, n.rstd, rows(), spec_.n_embd, a.rms, x_.column_scratch, m_.s_);
  }
  void attention_backward(const model::AttentionBackwardArgs& a) override;
  void kv_wait_add_grads(const model::LayerArgs& a) override { m_.add_exchange_dqkv_bf16(a.layer); }

 private:
  float eps() const { return static_cast<float>(spec_.norm_eps); }
  const ActivationsBf16& x_;
};

void CudaModel::Bf16Ops::attention(const model::AttentionArgs& a) {
  const int C = spec_.n_embd, NH = spec_.n_head, NKV = spec_.kv_heads(), W = spec_.qkv_width();
  const BlockBf16& block = x_.blocks[size_t(a.layer)];
  kc::bf16* out = act(a.layer, a.out);
  if (m_.batch_sdpa_) return m_.sdpa_forward_bf16(a.layer, block, out, a.pieces);
  const Activations& ints = m_.acts_;
  if (a.pieces == AttentionPieces::with_prefix) {
    // The later parts, against the prefixes the exchange holds.
    const std::vector<PrefixedPiece>& prefixed = m_.layout_now_.prefixed;
    for (size_t k = 0; k < prefixed.size(); ++k) {
      const PrefixedPiece& part = prefixed[k];
      kc::attention_prefix_bf16_forward(*m_.g_, out + static_cast<size_t>(part.first_row) * C,
                                        block.att + x_.prefixed_saved_offset[k],
                                        block.qkv + static_cast<size_t>(part.first_row) * W,
                                        m_.exchange_->prefix_kv(a.layer, part.piece), part.offset, part.len, C, NH,
                                        NKV, x_.attention_workspace);
    }
    return;
  }
  const model::AttentionGroups& groups = m_.layout_now_.groups;
  kc::gather_padded_rows(x_.padded_qkv, block.qkv, ints.padded_token, groups.padded_rows(), W, m_.s_);
  for (size_t g = 0; g < groups.groups.size(); ++g) {
    const model::AttentionGroup& group = groups.groups[g];
    kc::attention_bf16_forward(*m_.g_, x_.padded_io + group.first_row * C, block.att + x_.saved_offset[g],
                               x_.padded_qkv + group.first_row * W, ints.lengths + group.first_length, group.B,
                               group.T, C, NH, NKV, x_.attention_workspace, m_.score_budget_);
  }
  kc::scatter_padded_rows(out, x_.padded_io, ints.padded_token, groups.padded_rows(), C, m_.s_);
}

void CudaModel::Bf16Ops::attention_backward(const model::AttentionBackwardArgs& a) {
  const int C = spec_.n_embd, NH = spec_.n_head, NKV = spec_.kv_heads(), W = spec_.qkv_width();
  const BlockBf16& block = x_.blocks[size_t(a.layer)];
  if (m_.batch_sdpa_) return m_.sdpa_backward_bf16(a.layer, block, a.pieces);
  const Activations& ints = m_.acts_;
  if (a.pieces == AttentionPieces::with_prefix) {
    // The later parts store their own rows of dqkv and add into their prefixes' dK/dV.
    const std::vector<PrefixedPiece>& prefixed = m_.layout_now_.prefixed;
    for (size_t k = 0; k < prefixed.size(); ++k) {
      const PrefixedPiece& part = prefixed[k];
      kc::attention_prefix_bf16_backward(*m_.g_, x_.dqkv + static_cast<size_t>(part.first_row) * W,
                                         m_.exchange_->prefix_dkv(a.layer, part.piece),
                                         x_.datty + static_cast<size_t>(part.first_row) * C,
                                         block.qkv + static_cast<size_t>(part.first_row) * W,
                                         m_.exchange_->prefix_kv(a.layer, part.piece),
                                         block.att + x_.prefixed_saved_offset[k], part.offset, part.len, C, NH, NKV,
                                         x_.attention_workspace);
    }
    return;
  }
  const model::AttentionGroups& groups = m_.layout_now_.groups;
  kc::gather_padded_rows(x_.padded_qkv, block.qkv, ints.padded_token, groups.padded_rows(), W, m_.s_);
  kc::gather_padded_rows(x_.padded_io, x_.datty, ints.padded_token, groups.padded_rows(), C, m_.s_);
  for (size_t g = 0; g < groups.groups.size(); ++g) {
    const model::AttentionGroup& group = groups.groups[g];
    kc::attention_bf16_backward(*m_.g_, x_.padded_dqkv + group.first_row * W, x_.padded_io + group.first_row * C,
                                x_.padded_qkv + group.first_row * W, block.att + x_.saved_offset[g],
                                ints.lengths + group.first_length, group.B, group.T, C, NH, NKV,
                                x_.attention_workspace, m_.score_budget_);
  }
  kc::scatter_padded_rows(x_.dqkv, x_.padded_dqkv, ints.padded_token, groups.padded_rows(), W, m_.s_);
}

void CudaModel::forward_kernels_bf16(bool with_loss) {
  const ActivationsBf16& x = bacts_;
  const int N = layout_now_.N, C = cfg_.n_embd;
  if (units_) {
    unit_needed(0);
    units_->prefetch(1);  // block 0's gather overlaps the embeddings
  }
  const float* wte = params_ + offsets_.wte;
  const float* wpe = model::tensor_at(params_, offsets_.wpe);
  if (master_sharded_)  // the distributed optimizer holds no whole fp32 master: the working copy
    kc::encoder_forward_bf16(x.encoded, acts_.inputs, working(wte), working(wpe), acts_.cu_seqlens,
                             layout_now_.pieces, N, C, s_, acts_.pos_offset);
  else
    kc::encoder_forward_bf16(x.encoded, acts_.inputs, wte, wpe, acts_.cu_seqlens, layout_now_.pieces, N, C, s_,
                             acts_.pos_offset);
  Bf16Ops ops(*this);
  schedule_.forward(ops);  // to ln_f's output
  if (units_) units_->forward_done(cfg_.n_layer);  // the last block's
  if (!with_loss) return;
  KILTER_CUDA_CHECK(cudaMemsetAsync(loss_device_, 0, sizeof(double), s_));
  kc::classifier_chunks_bf16(*g_, nullptr, nullptr, x.lnf, head_bf16_, acts_.targets, N, C, cfg_.vocab_size,
                             vocab_padded_, x.classifier_rows, x.logits, x.row_losses, loss_device_, 0.0f, nullptr,
                             /*backward=*/false);
  KILTER_CUDA_CHECK(cudaMemcpyAsync(host_scalars_, loss_device_, sizeof(double), cudaMemcpyDeviceToHost, s_));
}

// What later parts elsewhere computed for this batch's rows (the K/V exchange's dK/dV): added in
// fp32 into zeroed staging, then into the bf16 rows, rounded once (as attention_backward_bf16 does).
void CudaModel::add_exchange_dqkv_bf16(int layer) {
  const ActivationsBf16& x = bacts_;
  const size_t elements = static_cast<size_t>(layout_now_.N) * cfg_.qkv_width();
  KILTER_CUDA_CHECK(cudaMemsetAsync(x.exchange_dqkv, 0, sizeof(float) * elements, s_));
  KILTER_CUDA_CHECK(cudaStreamSynchronize(s_));
  exchange_->backward_wait_add(layer, x.exchange_dqkv);
  kc::add_into_bf16(x.dqkv, x.exchange_dqkv, elements, s_);
}

void CudaModel::head_backward_bf16() {
  const ActivationsBf16& x = bacts_;
  const int N = layout_now_.N, C = cfg_.n_embd;
  KILTER_CUDA_CHECK(cudaMemsetAsync(loss_device_, 0, sizeof(double), s_));
  kc::classifier_chunks_bf16(*g_, x.dln, grads_ + offsets_.head, x.lnf, head_bf16_, acts_.targets, N, C,
                             cfg_.vocab_size, vocab_padded_, x.classifier_rows, x.logits, x.row_losses, loss_device_,
                             0.0f, scale_device_, /*backward=*/true);
  KILTER_CUDA_CHECK(cudaMemcpyAsync(host_scalars_, loss_device_, sizeof(double), cudaMemcpyDeviceToHost, s_));
  KILTER_CUDA_CHECK(cudaMemsetAsync(x.dresidual, 0, sizeof(float) * static_cast<size_t>(N) * C, s_));
  Bf16Ops(*this).norm_backward({.layer = cfg_.n_layer - 1, .dinp = Grad::dresidual, .dout = Grad::dln,
                                .in = Stream::out, .norm = Act::next_ln, .rms = cfg_.llama()});
}

void CudaModel::bf16_ops_backward(int layer) {
  Bf16Ops ops(*this);
  schedule_.block_backward(ops, layer);
}

}  // namespace kilter::backend
