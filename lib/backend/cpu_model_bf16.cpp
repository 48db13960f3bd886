// CpuModel's bf16-storage path (cpu_model.h, bf16_storage): the oracle of the CUDA backend's bf16
// datapath. The blocks run through the block schedule on the bf16-storage op table
// (lib/model/block_ops_cpu.h: CpuBf16BlockOps), which rounds where the device stores bf16 and
// fuses what the device fuses:
//   forward:  encoded = round(wte + wpe); ln_1 = round(norm(encoded)); per block
//             qkv = round(ln_1 W^T + b) [llama: RoPE, rounded], attention (bf16 twin),
//             residual_2 = round(x + round(atty W^T + b)), ln_2 = round(norm(residual_2)) (fused),
//             gpt2: fch = round(h), fch_gelu = round(gelu(h)) (GELU_AUX epilogue; under
//             recompute = gelu the GELU of the rounded fch), llama: fch = round(h),
//             act = round(silu(gate) up), then residual_3 = round(residual_2 + round(act W^T + b))
//             and the next norm (the next block's ln_1, or ln_f) fused with it;
//   head:     bf16 logits, loss, bf16 dlogits (classifier_bf16, here);
//   backward: the residual stream's gradient in fp32 with a bf16 copy that the GEMMs read; every
//             other gradient of an activation rounded to bf16 where its kernel writes it; weight
//             and bias gradients fp32 (DGELU and BGRADB epilogues, or their fallbacks).
// Cut pieces: the K/V are the bf16 qkv values; the dK/dV of later parts elsewhere are added in
// fp32 and rounded, as the device's staging does.
#include "lib/backend/cpu_model.h"
#include "lib/model/bf16_ops.h"

namespace kilter::backend {

using model::Batch;

double CpuModel::forward_loss_bf16(const Batch& batch) {
  forward(batch);
  return model::classifier_bf16(nullptr, nullptr, lnf_.data(), working(params_.data() + offsets_.head),
                                batch.targets.data(), batch.N, cfg_.n_embd, cfg_.vocab_size, 0.0f);
}

double CpuModel::forward_backward_bf16(const Batch& batch, float loss_scale, const model::GradReadyFn& on_ready) {
  forward(batch);
  if (backward_start_hook_) backward_start_hook_();
  const double loss = model::classifier_bf16(dln_.data(), grads_.data() + offsets_.head, lnf_.data(),
                                             working(params_.data() + offsets_.head), batch.targets.data(), batch.N,
                                             cfg_.n_embd, cfg_.vocab_size, loss_scale);
  exchange_progress(batch);
  backward_from_final_norm(batch, on_ready);
  return loss;
}

}  // namespace kilter::backend
