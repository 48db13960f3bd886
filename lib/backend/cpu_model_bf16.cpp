// CpuModel's bf16-storage path (cpu_model.h, bf16_storage): the oracle of the CUDA backend's
// bf16 datapath (lib/backend/cuda_datapath_bf16.cu), step for step, composed from the kernels' CPU
// twins (lib/model/bf16_ops.h, attention_bf16.h). Activations are bf16 values held in the fp32
// buffers of the activation plan; what the device fuses is fused the same way here:
//   forward:  encoded = round(wte + wpe); ln_1 = round(norm(encoded)); per block
//             qkv = round(ln_1 W^T + b) [llama: RoPE, rounded], attention (bf16 twin),
//             residual_2 = round(x + round(atty W^T + b)), ln_2 = round(norm(residual_2)) (fused),
//             gpt2: fch = round(h), fch_gelu = round(gelu(h)) (GELU_AUX epilogue; under
//             recompute = gelu the GELU of the rounded fch), llama: fch = round(h),
//             act = round(silu(gate) up), then residual_3 = round(residual_2 + round(act W^T + b))
//             and the next norm (the next block's ln_1, or ln_f) fused with it;
//   head:     bf16 logits, loss, bf16 dlogits (classifier_bf16);
//   backward: the residual stream's gradient in fp32 with a bf16 copy that the GEMMs read; every
//             other gradient of an activation rounded to bf16 where its kernel writes it; weight
//             and bias gradients fp32 (DGELU and BGRADB epilogues, or their fallbacks).
// The steps that are the fp32 model's too live in cpu_model.cpp: the embeddings, the blocks' loop
// of the backward, and attention with the K/V exchange of cut pieces (the bf16 twins chosen
// there), whose K/V are the bf16 qkv values and whose dK/dV are added in fp32 and rounded, as the
// device's staging does.
#include <cstring>

#include "io/base/error.h"
#include "lib/backend/cpu_model.h"
#include "lib/model/bf16_ops.h"
#include "lib/model/rope.h"

namespace kilter::backend {

using model::Batch;

void CpuModel::forward_bf16(const Batch& batch) {
  begin_forward(batch);
  const int N = batch.N, C = cfg_.n_embd;
  float* params = params_.data();
  model::round_bf16_inplace(encoded_.data(), static_cast<size_t>(N) * C);
  await_params(offsets_.block[0] + offsets_.block_floats);
  const BlockActivations first = block_activations(0, N);
  const BlockTensors p0 = block_tensors(params, 0);
  model::norm_forward_bf16(first.ln1, first.ln1_mean, first.ln1_rstd, encoded_.data(), p0.ln1_w, p0.ln1_b, N, C,
                           norm_spec());
  const float* residual = encoded_.data();
  for (int l = 0; l < cfg_.n_layer; ++l) {
    // A block's last step is the next norm (the next block's, or ln_f): its weights too.
    const bool last = l + 1 == cfg_.n_layer;
    await_params(last ? layout_.padded_size : offsets_.block[size_t(l) + 1] + offsets_.block_floats);
    const BlockActivations a = block_activations(l, N);
    block_forward_bf16(batch, l, residual, a, false);
    residual = a.residual3;
  }
}

void CpuModel::block_forward_bf16(const Batch& batch, int layer, const float* residual_in, const BlockActivations& a,
                                  bool recomputing) {
  const int N = batch.N, C = cfg_.n_embd, F = cfg_.ffn_width(), Cq = shape_.q_width();
  const BlockTensors p = block_tensors(params_.data(), layer);
  // The forward's ln_1 came fused with the previous block's residual add: the same norm of the
  // same stored values.
  if (recomputing)
    model::norm_forward_bf16(a.ln1, a.ln1_mean, a.ln1_rstd, residual_in, p.ln1_w, p.ln1_b, N, C, norm_spec());
  model::linear_forward_bf16(a.qkv, nullptr, a.ln1, working(p.qkv_w), working(p.qkv_b), N, C, cfg_.qkv_width());
  if (cfg_.llama()) {
    model::rope_forward(a.qkv, positions_.data(), N, shape_, rope_);
    model::round_bf16_columns(a.qkv, N, shape_.row_width(), 0, shape_.q_width() + shape_.n_kv_head * shape_.head_dim);
  }
  attention_forward(batch, layer, a, a.atty, recomputing);
  exchange_progress(batch);
  float* projection = projection_.data();
  model::linear_forward_bf16(projection, nullptr, a.atty, working(p.attproj_w), working(p.attproj_b), N, Cq, C);
  model::residual_norm_forward_bf16(a.residual2, a.ln2, a.ln2_mean, a.ln2_rstd, residual_in, projection, p.ln2_w,
                                    p.ln2_b, N, C, norm_spec());
  if (cfg_.llama()) {
    model::linear_forward_bf16(a.fch, nullptr, a.ln2, working(p.fc_w), working(p.fc_b), N, C, 2 * F);
    model::swiglu_forward_bf16(a.fch_gelu, a.fch, N, F);
  } else if (gelu_in_epilogue()) {
    model::linear_forward_bf16(a.fch_gelu, a.fch, a.ln2, working(p.fc_w), working(p.fc_b), N, C, F);
  } else {
    model::linear_forward_bf16(a.fch, nullptr, a.ln2, working(p.fc_w), working(p.fc_b), N, C, F);
    model::gelu_forward_bf16(a.fch_gelu, a.fch, static_cast<size_t>(N) * F);
  }
  exchange_progress(batch);
  if (recomputing) return;
  model::linear_forward_bf16(projection, nullptr, a.fch_gelu, working(p.fcproj_w), working(p.fcproj_b), N, F, C);
  // The next norm, fused with this residual add: the next block's ln_1, or ln_f after the last.
  const bool last = layer + 1 == cfg_.n_layer;
  const BlockActivations next = last ? BlockActivations{} : block_activations(layer + 1, N);
  const BlockTensors q = last ? BlockTensors{} : block_tensors(params_.data(), layer + 1);
  model::residual_norm_forward_bf16(a.residual3, last ? lnf_.data() : next.ln1, last ? lnf_mean_.data() : next.ln1_mean,
                                    last ? lnf_rstd_.data() : next.ln1_rstd, a.residual2, projection,
                                    last ? params_.data() + offsets_.lnf_w : q.ln1_w,
                                    last ? model::tensor_at(params_.data(), offsets_.lnf_b) : q.ln1_b, N, C, norm_spec());
  exchange_progress(batch);
}

double CpuModel::forward_loss_bf16(const Batch& batch) {
  forward_bf16(batch);
  return model::classifier_bf16(nullptr, nullptr, lnf_.data(), working(params_.data() + offsets_.head),
                                batch.targets.data(), batch.N, cfg_.n_embd, cfg_.vocab_size, 0.0f);
}

double CpuModel::forward_backward_bf16(const Batch& batch, float loss_scale, const model::GradReadyFn& on_ready) {
  forward_bf16(batch);
  if (backward_start_hook_) backward_start_hook_();
  const int N = batch.N, C = cfg_.n_embd;
  float* params = params_.data();
  float* grads = grads_.data();
  const double loss = model::classifier_bf16(dln_.data(), grads + offsets_.head, lnf_.data(),
                                             working(params + offsets_.head), batch.targets.data(), N, C,
                                             cfg_.vocab_size, loss_scale);
  exchange_progress(batch);
  std::memset(dresidual_.data(), 0, sizeof(float) * static_cast<size_t>(N) * C);
  model::norm_backward_bf16(dresidual_.data(), dresidual_bf16_.data(), grads + offsets_.lnf_w,
                            model::tensor_at(grads, offsets_.lnf_b), dln_.data(),
                            block_activations(cfg_.n_layer - 1, N).residual3, params + offsets_.lnf_w,
                            lnf_mean_.data(), lnf_rstd_.data(), N, C, norm_spec());
  if (on_ready) on_ready(offsets_.lnf_w, layout_.padded_size - offsets_.lnf_w);
  backward_blocks_and_embeddings(batch, on_ready);
  return loss;
}

void CpuModel::block_backward_bf16(const Batch& batch, int l) {
  const int N = batch.N, C = cfg_.n_embd, F = cfg_.ffn_width(), Cq = shape_.q_width();
  const BlockTensors p = block_tensors(params_.data(), l);
  const BlockTensors g = block_tensors(grads_.data(), l);
  const BlockActivations a = block_activations(l, N);
  const float* residual_in = l == 0 ? encoded_.data() : block_activations(l - 1, N).residual3;
  const float* dres = dresidual_bf16_.data();
  if (recompute_ == Recompute::block) block_forward_bf16(batch, l, residual_in, a, true);
  if (recompute_ == Recompute::gelu) {
    if (cfg_.llama())
      model::swiglu_forward_bf16(a.fch_gelu, a.fch, N, F);
    else
      model::gelu_forward_bf16(a.fch_gelu, a.fch, static_cast<size_t>(N) * F);
  }
  exchange_progress(batch);
  // MLP: the projection's input gradient through GELU's derivative (DGELU), or SwiGLU's backward.
  if (cfg_.llama()) {
    model::linear_backward_bf16(dact_.data(), g.fcproj_w, g.fcproj_b, dres, a.fch_gelu, working(p.fcproj_w), nullptr,
                                N, F, C);
    model::swiglu_backward_bf16(dfch_.data(), dact_.data(), a.fch, N, F);
  } else {
    model::linear_backward_bf16(dfch_.data(), g.fcproj_w, g.fcproj_b, dres, a.fch_gelu, working(p.fcproj_w), a.fch,
                                N, F, C);
  }
  model::linear_backward_bf16(dln_.data(), g.fc_w, g.fc_b, dfch_.data(), a.ln2, working(p.fc_w), nullptr, N, C,
                              cfg_.ffn_in_width());
  exchange_progress(batch);
  model::norm_backward_bf16(dresidual_.data(), dresidual_bf16_.data(), g.ln2_w, g.ln2_b, dln_.data(), a.residual2,
                            p.ln2_w, a.ln2_mean, a.ln2_rstd, N, C, norm_spec());
  model::linear_backward_bf16(datty_.data(), g.attproj_w, g.attproj_b, dres, a.atty, working(p.attproj_w), nullptr,
                              N, Cq, C);
  exchange_progress(batch);
  // dln_ is free until the QKV projection's backward: a recomputed attention output lands there.
  if (recompute_ == Recompute::attention) attention_forward(batch, l, a, dln_.data(), true);
  attention_backward(batch, l, a);
  if (cfg_.llama()) {
    model::rope_backward(dqkv_.data(), positions_.data(), N, shape_, rope_);
    model::round_bf16_columns(dqkv_.data(), N, shape_.row_width(), 0,
                              shape_.q_width() + shape_.n_kv_head * shape_.head_dim);
  }
  model::linear_backward_bf16(dln_.data(), g.qkv_w, g.qkv_b, dqkv_.data(), a.ln1, working(p.qkv_w), nullptr, N, C,
                              cfg_.qkv_width());
  exchange_progress(batch);
  model::norm_backward_bf16(dresidual_.data(), dresidual_bf16_.data(), g.ln1_w, g.ln1_b, dln_.data(), residual_in,
                            p.ln1_w, a.ln1_mean, a.ln1_rstd, N, C, norm_spec());
}

}  // namespace kilter::backend
