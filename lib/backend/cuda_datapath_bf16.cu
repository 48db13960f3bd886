// CudaModel's bf16-storage datapath (train.precision = bf16 with train.bf16_storage; docs/gpu.md,
// "bf16 storage"): every activation is written in bf16 by the kernel that produces it, every GEMM
// takes bf16 operands with fp32 accumulation, and the fp32 master weights are read through their
// bf16 working copy, which AdamW writes in the same launch (the head's with its vocabulary padded
// to a multiple of 128). Gradients of the weights stay fp32 in the flat buffer the reducer and
// ZeRO-1 read. The steps, in CpuModel's order (its bf16-storage oracle, cpu_model_bf16.cpp, rounds
// at exactly these points):
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

void CudaModel::forward_kernels_bf16(bool with_loss) {
  const ActivationsBf16& x = bacts_;
  const int N = layout_now_.N, C = cfg_.n_embd;
  const bool rms = cfg_.llama();
  const float eps = static_cast<float>(cfg_.norm_eps);
  kc::encoder_forward_bf16(x.encoded, acts_.inputs, params_ + offsets_.wte, model::tensor_at(params_, offsets_.wpe),
                           acts_.cu_seqlens, layout_now_.pieces, N, C, s_, acts_.pos_offset);
  const BlockTensors p0 = block_tensors(params_, 0);
  const BlockBf16& first = x.blocks[0];
  kc::residual_norm_forward_bf16(nullptr, first.ln1, first.ln1_mean, first.ln1_rstd, x.encoded, nullptr, p0.ln1_w,
                                 p0.ln1_b, N, C, rms, eps, s_);
  for (int l = 0; l < cfg_.n_layer; ++l) block_forward_bf16(l, false);
  if (!with_loss) return;
  KILTER_CUDA_CHECK(cudaMemsetAsync(loss_device_, 0, sizeof(double), s_));
  kc::classifier_chunks_bf16(*g_, nullptr, nullptr, x.lnf, head_bf16_, acts_.targets, N, C, cfg_.vocab_size,
                             vocab_padded_, x.classifier_rows, x.logits, x.row_losses, loss_device_, 0.0f, nullptr,
                             /*backward=*/false);
  KILTER_CUDA_CHECK(cudaMemcpyAsync(host_scalars_, loss_device_, sizeof(double), cudaMemcpyDeviceToHost, s_));
}

void CudaModel::block_forward_bf16(int l, bool recomputing) {
  const ActivationsBf16& x = bacts_;
  const int N = layout_now_.N, C = cfg_.n_embd, F = cfg_.ffn_width(), W = cfg_.qkv_width();
  const bool rms = cfg_.llama();
  const float eps = static_cast<float>(cfg_.norm_eps);
  const BlockBf16& a = x.blocks[l];
  const kc::bf16* residual_in = l == 0 ? x.encoded : x.blocks[l - 1].residual3;
  const BlockTensors p = block_tensors(params_, l);
  // The forward's ln_1 came fused with the previous residual add: the same kernel without the
  // add gives the same bits from the stored sum.
  if (recomputing)
    kc::residual_norm_forward_bf16(nullptr, a.ln1, a.ln1_mean, a.ln1_rstd, residual_in, nullptr, p.ln1_w, p.ln1_b, N,
                                   C, rms, eps, s_);
  kc::linear_forward_bf16(*g_, a.qkv, nullptr, a.ln1, working(p.qkv_w), working(p.qkv_b), N, C, W);
  if (cfg_.llama())
    kc::rope_forward(a.qkv, acts_.cu_seqlens, acts_.pos_offset, layout_now_.pieces, N, cfg_.n_head, cfg_.kv_heads(),
                     cfg_.head_dim(), rope_cos_, rope_sin_, s_);
  attention_forward_bf16(l, a, a.atty, recomputing);
  kc::linear_forward_bf16(*g_, x.projection, nullptr, a.atty, working(p.attproj_w), working(p.attproj_b), N, C, C);
  kc::residual_norm_forward_bf16(a.residual2, a.ln2, a.ln2_mean, a.ln2_rstd, residual_in, x.projection, p.ln2_w,
                                 p.ln2_b, N, C, rms, eps, s_);
  if (cfg_.llama()) {
    kc::linear_forward_bf16(*g_, a.fch, nullptr, a.ln2, working(p.fc_w), working(p.fc_b), N, C, 2 * F);
    kc::swiglu_forward(a.fch_act, a.fch, N, F, s_);
  } else if (recompute_ != Recompute::gelu) {
    kc::linear_forward_bf16(*g_, a.fch_act, a.fch, a.ln2, working(p.fc_w), working(p.fc_b), N, C, F);
  } else {
    // recompute = gelu recomputes GELU from the stored pre-activation: the forward must start there too.
    kc::linear_forward_bf16(*g_, a.fch, nullptr, a.ln2, working(p.fc_w), working(p.fc_b), N, C, F);
    kc::gelu_forward(a.fch_act, a.fch, static_cast<size_t>(N) * F, s_);
  }
  if (recomputing) return;
  kc::linear_forward_bf16(*g_, x.projection, nullptr, a.fch_act, working(p.fcproj_w), working(p.fcproj_b), N, F, C);
  // The next norm fused with this residual add: the next block's ln_1, or ln_f after the last.
  const bool last = l + 1 == cfg_.n_layer;
  const BlockBf16* next = last ? nullptr : &x.blocks[l + 1];
  const BlockTensors q = last ? BlockTensors{} : block_tensors(params_, l + 1);
  kc::residual_norm_forward_bf16(a.residual3, last ? x.lnf : next->ln1, last ? x.lnf_mean : next->ln1_mean,
                                 last ? x.lnf_rstd : next->ln1_rstd, a.residual2, x.projection,
                                 last ? params_ + offsets_.lnf_w : q.ln1_w,
                                 last ? model::tensor_at(params_, offsets_.lnf_b) : q.ln1_b, N, C, rms, eps, s_);
}

void CudaModel::attention_forward_bf16(int layer, const BlockBf16& a, kc::bf16* out, bool recomputing) {
  if (batch_sdpa_) return sdpa_forward_bf16(layer, a, out, /*exchange_calls=*/!recomputing);
  const ActivationsBf16& x = bacts_;
  const int N = layout_now_.N, C = cfg_.n_embd, NH = cfg_.n_head, NKV = cfg_.kv_heads(), W = cfg_.qkv_width();
  if (exchange_ != nullptr && !recomputing) {
    // The exchange reads fp32 rows from its own stream or the host: converted, and final.
    kc::to_float(x.exchange_qkv, a.qkv, static_cast<size_t>(N) * W, s_);
    KILTER_CUDA_CHECK(cudaStreamSynchronize(s_));
    exchange_->forward_send(layer, x.exchange_qkv);
  }
  const model::AttentionGroups& groups = layout_now_.groups;
  kc::gather_padded_rows(x.padded_qkv, a.qkv, acts_.padded_token, groups.padded_rows(), W, s_);
  for (size_t g = 0; g < groups.groups.size(); ++g) {
    const model::AttentionGroup& group = groups.groups[g];
    kc::attention_bf16_forward(*g_, x.padded_io + group.first_row * C, a.att + x.saved_offset[g],
                               x.padded_qkv + group.first_row * W, acts_.lengths + group.first_length, group.B,
                               group.T, C, NH, NKV, x.attention_workspace, score_budget_);
  }
  kc::scatter_padded_rows(out, x.padded_io, acts_.padded_token, groups.padded_rows(), C, s_);
  if (exchange_ == nullptr) return;
  // The later parts, once their prefixes have arrived (a recomputation reads the ones the
  // exchange still holds).
  if (!recomputing) exchange_->forward_wait(layer);
  const std::vector<PrefixedPiece>& prefixed = layout_now_.prefixed;
  for (size_t k = 0; k < prefixed.size(); ++k) {
    const PrefixedPiece& part = prefixed[k];
    kc::attention_prefix_bf16_forward(*g_, out + static_cast<size_t>(part.first_row) * C,
                                      a.att + x.prefixed_saved_offset[k], a.qkv + static_cast<size_t>(part.first_row) * W,
                                      exchange_->prefix_kv(layer, part.piece), part.offset, part.len, C, NH, NKV,
                                      x.attention_workspace);
  }
}

void CudaModel::attention_backward_bf16(int layer, const BlockBf16& a) {
  if (batch_sdpa_) return sdpa_backward_bf16(layer, a);
  const ActivationsBf16& x = bacts_;
  const int C = cfg_.n_embd, NH = cfg_.n_head, NKV = cfg_.kv_heads(), W = cfg_.qkv_width();
  if (exchange_ != nullptr) {
    // The later parts first (they store their own rows of dqkv), so that their prefixes' dK/dV
    // travel while the groups run.
    const std::vector<PrefixedPiece>& prefixed = layout_now_.prefixed;
    for (size_t k = 0; k < prefixed.size(); ++k) {
      const PrefixedPiece& part = prefixed[k];
      kc::attention_prefix_bf16_backward(*g_, x.dqkv + static_cast<size_t>(part.first_row) * W,
                                         exchange_->prefix_dkv(layer, part.piece),
                                         x.datty + static_cast<size_t>(part.first_row) * C,
                                         a.qkv + static_cast<size_t>(part.first_row) * W,
                                         exchange_->prefix_kv(layer, part.piece), a.att + x.prefixed_saved_offset[k],
                                         part.offset, part.len, C, NH, NKV, x.attention_workspace);
    }
    KILTER_CUDA_CHECK(cudaStreamSynchronize(s_));
    exchange_->backward_send(layer);
  }
  const model::AttentionGroups& groups = layout_now_.groups;
  kc::gather_padded_rows(x.padded_qkv, a.qkv, acts_.padded_token, groups.padded_rows(), W, s_);
  kc::gather_padded_rows(x.padded_io, x.datty, acts_.padded_token, groups.padded_rows(), C, s_);
  for (size_t g = 0; g < groups.groups.size(); ++g) {
    const model::AttentionGroup& group = groups.groups[g];
    kc::attention_bf16_backward(*g_, x.padded_dqkv + group.first_row * W, x.padded_io + group.first_row * C,
                                x.padded_qkv + group.first_row * W, a.att + x.saved_offset[g],
                                acts_.lengths + group.first_length, group.B, group.T, C, NH, NKV,
                                x.attention_workspace, score_budget_);
  }
  kc::scatter_padded_rows(x.dqkv, x.padded_dqkv, acts_.padded_token, groups.padded_rows(), W, s_);
  if (exchange_ != nullptr) add_exchange_dqkv_bf16(layer);
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
  kc::norm_backward_bf16(x.dresidual, x.dresidual_bf16, grads_ + offsets_.lnf_w, model::tensor_at(grads_, offsets_.lnf_b),
                         x.dln, x.blocks[cfg_.n_layer - 1].residual3, params_ + offsets_.lnf_w, x.lnf_mean, x.lnf_rstd,
                         N, C, cfg_.llama(), x.column_scratch, s_);
}

void CudaModel::backward_block_bf16(int l) {
  const ActivationsBf16& x = bacts_;
  const int N = layout_now_.N, C = cfg_.n_embd, F = cfg_.ffn_width(), W = cfg_.qkv_width();
  const bool rms = cfg_.llama();
  const BlockBf16& a = x.blocks[l];
  const kc::bf16* residual_in = l == 0 ? x.encoded : x.blocks[l - 1].residual3;
  const BlockTensors p = block_tensors(params_, l);
  const BlockTensors g = block_tensors(grads_, l);
  float* scratch = x.column_scratch;
  if (recompute_ == Recompute::block) block_forward_bf16(l, true);
  if (recompute_ == Recompute::gelu) {
    if (cfg_.llama())
      kc::swiglu_forward(a.fch_act, a.fch, N, F, s_);
    else
      kc::gelu_forward(a.fch_act, a.fch, static_cast<size_t>(N) * F, s_);
  }
  // MLP: the projection's input gradient through GELU's derivative (DGELU), or SwiGLU's backward.
  if (cfg_.llama()) {
    kc::linear_backward_bf16(*g_, x.dact, g.fcproj_w, g.fcproj_b, x.dresidual_bf16, a.fch_act, working(p.fcproj_w),
                             nullptr, N, F, C, scratch);
    kc::swiglu_backward(x.dfch, x.dact, a.fch, N, F, s_);
  } else {
    kc::linear_backward_bf16(*g_, x.dfch, g.fcproj_w, g.fcproj_b, x.dresidual_bf16, a.fch_act, working(p.fcproj_w),
                             a.fch, N, F, C, scratch);
  }
  kc::linear_backward_bf16(*g_, x.dln, g.fc_w, g.fc_b, x.dfch, a.ln2, working(p.fc_w), nullptr, N, C,
                           cfg_.ffn_in_width(), scratch);
  kc::norm_backward_bf16(x.dresidual, x.dresidual_bf16, g.ln2_w, g.ln2_b, x.dln, a.residual2, p.ln2_w, a.ln2_mean,
                         a.ln2_rstd, N, C, rms, scratch, s_);
  kc::linear_backward_bf16(*g_, x.datty, g.attproj_w, g.attproj_b, x.dresidual_bf16, a.atty, working(p.attproj_w),
                           nullptr, N, C, C, scratch);
  // dln is free until the QKV projection's backward: a recomputed attention output lands there.
  if (recompute_ == Recompute::attention) attention_forward_bf16(l, a, x.dln, true);
  attention_backward_bf16(l, a);
  if (cfg_.llama())
    kc::rope_backward(x.dqkv, acts_.cu_seqlens, acts_.pos_offset, layout_now_.pieces, N, cfg_.n_head, cfg_.kv_heads(),
                      cfg_.head_dim(), rope_cos_, rope_sin_, s_);
  kc::linear_backward_bf16(*g_, x.dln, g.qkv_w, g.qkv_b, x.dqkv, a.ln1, working(p.qkv_w), nullptr, N, C, W, scratch);
  kc::norm_backward_bf16(x.dresidual, x.dresidual_bf16, g.ln1_w, g.ln1_b, x.dln, residual_in, p.ln1_w, a.ln1_mean,
                         a.ln1_rstd, N, C, rms, scratch, s_);
}

double CudaModel::forward_backward_bf16(const Batch& batch, float loss_scale, const model::GradReadyFn& on_ready) {
  upload_batch(batch, loss_scale);
  const int N = batch.N, C = cfg_.n_embd;
  run_segment(0, [&] { forward_kernels_bf16(false); });
  if (backward_start_hook_) backward_start_hook_();
  // The classifier computes logits, loss and their gradient chunk by chunk: it is the head's
  // backward segment, and the loss is known after it.
  run_segment(1, [&] { head_backward_bf16(); });
  finish_forward();
  if (on_ready) on_ready(offsets_.lnf_w, layout_.padded_size - offsets_.lnf_w);
  for (int l = cfg_.n_layer - 1; l >= 0; --l) {
    run_segment(2 + (cfg_.n_layer - 1 - l), [&] { backward_block_bf16(l); });
    if (on_ready) on_ready(offsets_.block[l], offsets_.block_floats);
  }
  run_segment(cfg_.n_layer + 2, [&] {
    kc::encoder_backward(grads_ + offsets_.wte, model::tensor_at(grads_, offsets_.wpe), bacts_.dresidual, acts_.inputs,
                         acts_.cu_seqlens, layout_now_.pieces, N, layout_now_.max_len, C, s_, acts_.pos_offset);
  });
  if (on_ready) on_ready(offsets_.wte, offsets_.embeddings_end() - offsets_.wte);
  return read_loss();
}

double CudaModel::forward_loss_bf16(const Batch& batch) {
  upload_batch(batch, 0.0f);
  // Its own segment number: the forward with the loss only is not forward_backward's segment 0.
  run_segment(cfg_.n_layer + 3, [&] { forward_kernels_bf16(true); });
  finish_forward();
  return read_loss();
}

}  // namespace kilter::backend
