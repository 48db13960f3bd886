// The runtime self-checks of the engines a run would otherwise trust untested: code that has never
// run on a device must not become the default without one. Each takes a small model of the run's
// architecture (its arch, grouped heads, tied or untied head, qkv bias, RoPE scaling, norm epsilon;
// 2 layers, a vocabulary of 300 that the padding to 384 exercises, the run's recompute mode)
// through one micro-batch of mixed piece lengths with small chunk budgets (the attention scores a
// row at a time, the classifier in 64-row chunks), then an AdamW step (which writes the bf16
// weight copy) and a forward_loss, and the same through a reference from the same weights.
//   bf16 datapath (train.bf16_storage = auto): the bf16-storage datapath with its cuBLASLt
//     epilogues and the bf16 cuBLASLt attention (attention_bf16.cu, the engine a refused SDPA
//     bucket falls back to), head_dim 16, against the CPU oracle (CpuModel with bf16_storage).
//     SDPA is not inside: it proves itself per bucket (cuda_attention_sdpa.cu) and in its own probe.
//   sdpa: the run's own heads (count, grouping, head_dim) with cuDNN SDPA on every bucket, pieces
//     up to 256 tokens; on the bf16-storage datapath against the CPU oracle, on the fp32-activation
//     datapath against the same model on cuBLASLt attention.
// Both sides round at the same points, so they differ only by fp32 summation order and the bf16
// roundings it flips (SDPA: its bf16 probabilities). Tolerances: the losses within 1e-2
// relative, every gradient tensor within 5e-2 of its largest value (the oracle itself is 1.6e-2
// from fp32: model_bf16_storage_test). A wrong kernel (a transpose, an epilogue, an index, a mask
// off by one key) misses by far more. Each takes well under a second; the trainer runs them in a
// child process (engine_probe.h), the model in-process where no trainer decided (choose_storage).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "lib/backend/cpu_model.h"
#include "lib/backend/cuda_model_impl.cuh"

namespace kilter::backend {

namespace {

// The run's architecture at a small size: head_dim 16 and two K/V heads, or (own_heads) the run's
// heads, grouping and head_dim, with pieces up to 256 tokens.
ModelSpec self_check_spec(const ModelSpec& cfg, bool own_heads) {
  ModelSpec spec;
  spec.arch = cfg.arch;
  spec.n_layer = 2;
  spec.block_size = own_heads ? std::min(cfg.block_size, 256) : 64;
  spec.vocab_size = 300;
  spec.norm_eps = cfg.norm_eps;
  spec.tie_embeddings = cfg.tie_embeddings;
  const int group = cfg.n_head / cfg.kv_heads();
  spec.n_kv_head = own_heads ? cfg.kv_heads() : group <= 8 ? 2 : 1;
  spec.n_head = spec.n_kv_head * group;
  spec.n_embd = spec.n_head * (own_heads ? cfg.head_dim() : 16);
  if (cfg.llama()) {
    spec.ffn_hidden = 96;
    spec.qkv_bias = cfg.qkv_bias;
    spec.rope_theta = cfg.rope_theta;
    spec.rope_scaling = cfg.rope_scaling;
    spec.rope_factor = cfg.rope_factor;
    spec.rope_low_freq_factor = cfg.rope_low_freq_factor;
    spec.rope_high_freq_factor = cfg.rope_high_freq_factor;
    spec.rope_original_context = std::min(cfg.rope_original_context, 32);
  }
  return spec;
}

// Pieces of L, L, L - 4 (one attention group of three rows), L / 2 + 1, 1 and 17 tokens, L the
// context (64: 64, 64, 60, 33, 1, 17); deterministic.
Batch self_check_batch(int vocab, int L) {
  Batch batch;
  batch.clear();
  uint32_t state = 12345u;
  auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return static_cast<int32_t>((state >> 8) % static_cast<uint32_t>(vocab));
  };
  for (int len : {L, L, L - 4, L / 2 + 1, 1, 17}) {
    std::vector<int32_t> inputs(len), targets(len);
    for (int t = 0; t < len; ++t) inputs[t] = next(), targets[t] = t + 1 < len ? next() : -1;
    batch.append_piece(inputs.data(), targets.data(), len);
  }
  return batch;
}

std::vector<float> host_grads(model::Model& m) {
  m.synchronize();
  std::vector<float> host(m.layout().num_params);
  if (m.backend_name() == "cpu") {
    std::copy(m.grads(), m.grads() + host.size(), host.begin());
  } else {
    KILTER_CUDA_CHECK(cudaMemcpy(host.data(), m.grads(), sizeof(float) * host.size(), cudaMemcpyDeviceToHost));
  }
  return host;
}

// "" when within tolerance, else what differed.
std::string compare(const model::ParamLayout& layout, const std::vector<float>& gpu, const std::vector<float>& cpu) {
  for (const model::ParamTensor& t : layout.tensors) {
    double diff = 0.0, scale = 0.0;
    for (size_t i = t.offset; i < t.offset + t.size; ++i) {
      if (!std::isfinite(gpu[i])) return "gradient of " + t.name + " not finite";
      diff = std::max(diff, std::fabs(double(gpu[i]) - cpu[i]));
      scale = std::max(scale, std::fabs(double(cpu[i])));
    }
    if (diff > 5e-2 * std::max(scale, 1e-30)) {
      char text[200];
      std::snprintf(text, sizeof text, "gradient of %s differs by %.3g of its scale (limit 5e-2)", t.name.c_str(),
                    diff / std::max(scale, 1e-30));
      return text;
    }
  }
  return "";
}

std::string compare_loss(const char* what, double gpu, double cpu) {
  if (std::isfinite(gpu) && std::fabs(gpu - cpu) <= 1e-2 * std::fabs(cpu)) return "";
  char text[160];
  std::snprintf(text, sizeof text, "%s %.6g against the oracle's %.6g (limit 1e-2 relative)", what, gpu, cpu);
  return text;
}

// One micro-batch, an AdamW step and a forward_loss through `tested` and `reference` (from the
// same weights): "" when they agree within the tolerances, else what differed.
std::string compare_models(model::Model& tested, model::Model& reference, const Batch& batch) {
  tested.init_params(4242);
  reference.init_params(4242);
  const float scale = 1.0f / static_cast<float>(batch.num_targets);
  tested.zero_grads();
  reference.zero_grads();
  const double tested_loss = tested.forward_backward(batch, scale, {});
  const double reference_loss = reference.forward_backward(batch, scale, {});
  std::string why = compare_loss("loss", tested_loss, reference_loss);
  if (why.empty()) why = compare(reference.layout(), host_grads(tested), host_grads(reference));
  if (!why.empty()) return why;
  model::AdamWParams adam;
  adam.lr = 1e-3f;
  adam.t = 1;
  tested.adamw_step(adam);
  reference.adamw_step(adam);
  return compare_loss("forward_loss after an AdamW step", tested.forward_loss(batch), reference.forward_loss(batch));
}

// A CudaModel for a self-check: no CUDA graphs, the small chunk budgets, its own parameter buffers
// (a run's options under train.shard = parameters leave them to the parameter holder).
std::unique_ptr<CudaModel> self_check_model(const ModelSpec& spec, const model::BackendOptions& options) {
  model::BackendOptions checked = options;
  checked.cuda_graphs = false;
  checked.params_held_elsewhere = false;
  auto gpu = std::make_unique<CudaModel>(spec, 1, checked);
  gpu->set_chunk_budgets(static_cast<size_t>(spec.n_head) * spec.block_size * spec.block_size,
                         64 * 384 * sizeof(kc::bf16));
  return gpu;
}

}  // namespace

std::string CudaModel::bf16_storage_self_check(const ModelSpec& cfg, const model::BackendOptions& options) {
  try {
    const ModelSpec spec = self_check_spec(cfg, /*own_heads=*/false);
    model::BackendOptions on = options;
    on.bf16_storage = "on";
    on.attention = "cublaslt";  // the datapath and its fallback attention; SDPA checks itself
    const std::unique_ptr<CudaModel> gpu = self_check_model(spec, on);
    CpuModel cpu(spec, 1, "bf16", options.recompute, /*bf16_storage=*/true);
    return compare_models(*gpu, cpu, self_check_batch(spec.vocab_size, spec.block_size));
  } catch (const Error& e) {
    cudaGetLastError();
    return std::string("it failed to run: ") + e.what();
  }
}

std::string cuda_sdpa_self_check(const ModelSpec& cfg, const model::BackendOptions& options) {
  try {
    const ModelSpec spec = self_check_spec(cfg, /*own_heads=*/true);
    model::BackendOptions sdpa = options;
    sdpa.attention = "sdpa";  // a bucket SDPA refuses is an error here, not a fallback
    sdpa.bf16_storage_checked = true;
    const std::unique_ptr<CudaModel> gpu = self_check_model(spec, sdpa);
    const Batch batch = self_check_batch(spec.vocab_size, spec.block_size);
    if (options.bf16_storage == "on") {
      CpuModel cpu(spec, 1, "bf16", options.recompute, /*bf16_storage=*/true);
      return compare_models(*gpu, cpu, batch);
    }
    model::BackendOptions reference = sdpa;
    reference.attention = "cublaslt";
    const std::unique_ptr<CudaModel> other = self_check_model(spec, reference);
    return compare_models(*gpu, *other, batch);
  } catch (const Error& e) {
    cudaGetLastError();
    return std::string("it failed to run: ") + e.what();
  }
}

}  // namespace kilter::backend
