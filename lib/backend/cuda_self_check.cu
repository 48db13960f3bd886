// The runtime self-check of the bf16-storage datapath (train.bf16_storage = auto): code that has
// never run on a device must not become the default without one. At model set-up, a small model
// of the run's architecture (its arch, grouped heads, tied or untied head, qkv bias, RoPE scaling,
// norm epsilon; 2 layers, head_dim 16, a vocabulary of 300 that the padding to 384 exercises, the
// run's recompute mode) takes one micro-batch of mixed piece lengths through the bf16 datapath on
// this device with small chunk budgets (the attention scores a row at a time, the classifier in
// 64-row chunks), then an AdamW step (which writes the bf16 weight copy) and a forward_loss, and
// the same through the CPU oracle (CpuModel with bf16_storage, from the same weights). Both round
// at the same points, so they differ only by fp32 summation order and the bf16 roundings it
// flips. Tolerances: the losses within 1e-2 relative, every gradient tensor within 5e-2 of its
// largest value (the oracle itself is 1.6e-2 from fp32: model_bf16_storage_test). A wrong kernel
// (a transpose, an epilogue, an index) misses by far more. Takes well under a second.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "lib/backend/cpu_model.h"
#include "lib/backend/cuda_model_impl.cuh"

namespace kilter::backend {

namespace {

// The run's architecture at a small size.
ModelSpec self_check_spec(const ModelSpec& cfg) {
  ModelSpec spec;
  spec.arch = cfg.arch;
  spec.n_layer = 2;
  spec.block_size = 64;
  spec.vocab_size = 300;
  spec.norm_eps = cfg.norm_eps;
  spec.tie_embeddings = cfg.tie_embeddings;
  const int group = cfg.n_head / cfg.kv_heads();
  spec.n_kv_head = group <= 8 ? 2 : 1;
  spec.n_head = spec.n_kv_head * group;
  spec.n_embd = spec.n_head * 16;
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

// Pieces of 64, 64, 60 (one attention group of three rows), 33, 1 and 17 tokens; deterministic.
Batch self_check_batch(int vocab) {
  Batch batch;
  batch.clear();
  uint32_t state = 12345u;
  auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return static_cast<int32_t>((state >> 8) % static_cast<uint32_t>(vocab));
  };
  for (int len : {64, 64, 60, 33, 1, 17}) {
    std::vector<int32_t> inputs(len), targets(len);
    for (int t = 0; t < len; ++t) inputs[t] = next(), targets[t] = t + 1 < len ? next() : -1;
    batch.append_piece(inputs.data(), targets.data(), len);
  }
  return batch;
}

std::vector<float> device_grads(model::Model& m) {
  m.synchronize();
  std::vector<float> host(m.layout().num_params);
  KILTER_CUDA_CHECK(cudaMemcpy(host.data(), m.grads(), sizeof(float) * host.size(), cudaMemcpyDeviceToHost));
  return host;
}

// "" when within tolerance, else what differed.
std::string compare(const model::ParamLayout& layout, const std::vector<float>& gpu, const float* cpu) {
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

}  // namespace

std::string CudaModel::bf16_storage_self_check(const ModelSpec& cfg, const model::BackendOptions& options) {
  try {
    const ModelSpec spec = self_check_spec(cfg);
    model::BackendOptions on = options;
    on.bf16_storage = "on";
    on.cuda_graphs = false;
    CudaModel gpu(spec, 1, on);
    gpu.set_chunk_budgets(static_cast<size_t>(spec.n_head) * 64 * 64, 64 * 384 * sizeof(kc::bf16));
    CpuModel cpu(spec, 1, "bf16", options.recompute, /*bf16_storage=*/true);
    gpu.init_params(4242);
    cpu.init_params(4242);
    const Batch batch = self_check_batch(spec.vocab_size);
    const float scale = 1.0f / static_cast<float>(batch.num_targets);
    gpu.zero_grads();
    cpu.zero_grads();
    const double gpu_loss = gpu.forward_backward(batch, scale, {});
    const double cpu_loss = cpu.forward_backward(batch, scale, {});
    std::string why = compare_loss("loss", gpu_loss, cpu_loss);
    if (why.empty()) why = compare(cpu.layout(), device_grads(gpu), cpu.grads());
    if (!why.empty()) return why;
    model::AdamWParams adam;
    adam.lr = 1e-3f;
    adam.t = 1;
    gpu.adamw_step(adam);
    cpu.adamw_step(adam);
    return compare_loss("forward_loss after an AdamW step", gpu.forward_loss(batch), cpu.forward_loss(batch));
  } catch (const Error& e) {
    cudaGetLastError();
    return std::string("it failed to run: ") + e.what();
  }
}

}  // namespace kilter::backend
