// CpuModel's bf16-storage head (cpu_model.h, bf16_storage), the oracle of the CUDA bf16 datapath's
// (lib/backend/cuda_datapath_bf16.cu lists the datapath's steps): bf16 logits, the loss, bf16
// dlogits (classifier_bf16). The blocks run through the block schedule on the CPU bf16-storage op
// table (lib/model/block_ops_cpu.cpp), which rounds where the device stores bf16 and fuses what the
// device fuses; the embeddings are rounded once in CpuModel::forward.
#include "lib/backend/cpu_model.h"
#include "lib/model/bf16_ops.h"

namespace kilter::backend {

using model::Batch;

double CpuModel::forward_loss_bf16(const Batch& batch) {
  forward(batch);
  head_needs_embeddings();
  const double loss = model::classifier_bf16(nullptr, nullptr, lnf_.data(), working(params_.data() + offsets_.head),
                                             batch.targets.data(), batch.N, cfg_.n_embd, cfg_.vocab_size, 0.0f);
  if (units_) units_->pass_done();
  return loss;
}

double CpuModel::forward_backward_bf16(const Batch& batch, float loss_scale, const model::GradReadyFn& on_ready) {
  forward(batch);
  if (backward_start_hook_) backward_start_hook_();
  head_needs_embeddings();
  const double loss = model::classifier_bf16(dln_.data(), grads_.data() + offsets_.head, lnf_.data(),
                                             working(params_.data() + offsets_.head), batch.targets.data(), batch.N,
                                             cfg_.n_embd, cfg_.vocab_size, loss_scale);
  head_finished();
  ops_->kv_progress();  // the K/V exchange moves (kv_exchange.h)
  backward_from_final_norm(batch, on_ready);
  if (units_) units_->pass_done();
  return loss;
}

}  // namespace kilter::backend
