// GPU training-step benchmark: tokens/s and model FLOP utilization (MFU) of the CUDA model on
// one device, for a given shape (GPT-2 or Llama: --arch, --n-kv-head, --ffn-hidden), precision,
// activation storage (--bf16-storage off|on|auto), attention engine and CUDA graphs on/off. A step is what the trainer does: zero grads,
// forward+backward of one micro-batch, the global norm (clipping), AdamW. It checks what it times:
// the same batch is trained on every step, so the loss must be finite and must fall.
// FLOPs per token follow nanoGPT/PaLM: 6 * (params - wpe) + 12 * n_layer * n_embd * T for GPT-2;
// for Llama the spec's dense FLOPs (6 x every Linear, the head included, not the embedding lookup)
// + 12 * n_layer * (n_head * head_dim) * T.
// Peak: --peak-tflops, else the H100/H200 datasheet (dense bf16 989.4 TFLOP/s, fp32 66.9).
// Prints a human line and a `RESULT key=value ...` line; exit 1 if the check fails.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "io/base/cuda_common.h"
#include "lib/backend/cuda_model.h"
#include "lib/model/model.h"

namespace km = kilter::model;

namespace {

struct Options {
  std::string name = "custom";
  km::ModelSpec cfg{4, 4, 256, 256, 8192};
  int B = 8, T = 256;
  std::string precision = "bf16";
  std::string attention = "auto";
  bool graphs = false;
  std::string recompute = "none";
  std::string bf16_storage = "off";
  int shard_ranks = 1;  // > 1: hold the AdamW moments of 1/shard_ranks of the buffer (rank 0 of a ZeRO-1 run)
  int steps = 10, warmup = 3;
  double peak_tflops = 0.0;
};

void usage() {
  std::printf("usage: kilter_bench_gpu_step [--name S] [--n-layer L] [--n-head H] [--n-embd C] [--vocab V]\n"
              "         [--B rows] [--T tokens] [--precision fp32|bf16] [--attention auto|sdpa|cudnn|cublaslt]\n"
              "         [--graphs 0|1] [--recompute none|gelu|attention|block] [--shard-ranks P]\n"
              "         [--arch gpt2|llama] [--n-kv-head K] [--ffn-hidden F] [--untied 0|1] [--bf16-storage off|on|auto]\n"
              "         [--steps N] [--warmup N] [--peak-tflops X]\n");
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help") {
      usage();
      std::exit(0);
    }
    if (i + 1 >= argc) {
      usage();
      KILTER_FAIL("kilter_bench_gpu_step: " << flag << " needs a value");
    }
    const std::string value = argv[++i];
    if (flag == "--name") o.name = value;
    else if (flag == "--n-layer") o.cfg.n_layer = std::stoi(value);
    else if (flag == "--n-head") o.cfg.n_head = std::stoi(value);
    else if (flag == "--n-embd") o.cfg.n_embd = std::stoi(value);
    else if (flag == "--vocab") o.cfg.vocab_size = std::stoi(value);
    else if (flag == "--B") o.B = std::stoi(value);
    else if (flag == "--T") o.T = std::stoi(value);
    else if (flag == "--precision") o.precision = value;
    else if (flag == "--attention") o.attention = value;
    else if (flag == "--graphs") o.graphs = value == "1" || value == "on" || value == "true";
    else if (flag == "--recompute") o.recompute = value;
    else if (flag == "--bf16-storage") o.bf16_storage = value;
    else if (flag == "--arch") o.cfg.arch = value;
    else if (flag == "--n-kv-head") o.cfg.n_kv_head = std::stoi(value);
    else if (flag == "--ffn-hidden") o.cfg.ffn_hidden = std::stoi(value);
    else if (flag == "--untied") o.cfg.tie_embeddings = value == "1" ? "false" : "true";
    else if (flag == "--shard-ranks") o.shard_ranks = std::stoi(value);
    else if (flag == "--steps") o.steps = std::stoi(value);
    else if (flag == "--warmup") o.warmup = std::stoi(value);
    else if (flag == "--peak-tflops") o.peak_tflops = std::stod(value);
    else {
      usage();
      KILTER_FAIL("kilter_bench_gpu_step: unknown flag " << flag);
    }
  }
  KILTER_CHECK(o.B > 0 && o.T > 0 && o.steps > 0 && o.warmup >= 0, "kilter_bench_gpu_step: B, T, steps must be positive");
  o.cfg.block_size = o.T;
  // With graphs, a shape's segments are decided on their fifth occurrence (eager, timed eager,
  // capture, timed replay, decision): keep all of that out of the timed steps.
  if (o.graphs && o.warmup < 5) o.warmup = 5;
  return o;
}

double datasheet_peak_tflops(const std::string& device_name, const std::string& precision) {
  if (device_name.find("H100") != std::string::npos || device_name.find("H200") != std::string::npos)
    return precision == "bf16" ? 989.4 : 66.9;
  return 0.0;
}

// The attention engine the timed steps ran on, from the model's description after them: cuDNN
// SDPA where a shape bucket passed its self-check, else the per-group engine (cuDNN's fused
// attention or cuBLASLt with the masked softmax).
std::string attention_engine(const std::string& described) {
  const bool sdpa_built = described.find("SDPA") != std::string::npos &&
                          described.find("SDPA off") == std::string::npos;
  if (sdpa_built && described.find("(0 shape buckets passed") == std::string::npos) return "sdpa";
  // The groups' engine stands after the SDPA text: "..., else <engine>" or "SDPA off (why); <engine>".
  const size_t off = described.find("SDPA off (");
  const size_t groups = sdpa_built ? described.find("), else ") : off == std::string::npos ? described.find(", attention ")
                                                                                          : described.find("); ", off);
  const std::string rest = described.substr(groups == std::string::npos ? 0 : groups + 2);
  return rest.find("cuDNN") != std::string::npos && rest.find("(cuDNN:") == std::string::npos ? "cudnn" : "cublaslt";
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    if (!kilter::backend::cuda_device_present()) {
      std::printf("SKIPPED: no CUDA device (%s)\n", kilter::backend::cuda_device_absent_reason().c_str());
      return 77;
    }
    const int device = kilter::backend::cuda_device_index();
    cudaDeviceProp prop{};
    KILTER_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    const double peak = o.peak_tflops > 0 ? o.peak_tflops : datasheet_peak_tflops(prop.name, o.precision);

    km::BackendOptions backend;
    backend.precision = o.precision;
    backend.attention = o.attention;
    backend.cuda_graphs = o.graphs;
    backend.recompute = o.recompute;
    backend.bf16_storage = o.bf16_storage;
    size_t free_before = 0, total_memory = 0;
    KILTER_CUDA_CHECK(cudaMemGetInfo(&free_before, &total_memory));
    std::unique_ptr<km::Model> model;
    try {
      model = kilter::backend::make_cuda_model(o.cfg, 1, backend);
    } catch (const kilter::Error& e) {
      // No usable cuDNN on this machine: measure cuBLASLt attention and say so (attention= in RESULT).
      if (o.attention != "cudnn" || std::string(e.what()).find("cuDNN cannot be used") == std::string::npos) throw;
      std::printf("NOTE: %s\n", e.what());
      backend.attention = "cublaslt";
      model = kilter::backend::make_cuda_model(o.cfg, 1, backend);
    }
    std::printf("%s\n", model->describe().c_str());
    if (o.shard_ranks > 1) {
      const size_t padded = model->layout().padded_size, share = (padded + o.shard_ranks - 1) / o.shard_ranks;
      model->shard_optimizer({{0, share}});
    }
    model->init_params(1337);
    model->reserve(o.B * o.T, o.T);
    // B packed pieces of T tokens each.
    km::Batch batch;
    batch.clear();
    std::mt19937 gen(7);
    std::uniform_int_distribution<int> token(0, o.cfg.vocab_size - 1);
    std::vector<int32_t> inputs(o.T), targets(o.T);
    for (int b = 0; b < o.B; ++b) {
      for (int t = 0; t < o.T; ++t) {
        inputs[t] = token(gen);
        targets[t] = token(gen);
      }
      batch.append_piece(inputs.data(), targets.data(), o.T);
    }
    const float loss_scale = 1.0f / static_cast<float>(batch.num_targets);

    double first_loss = 0.0, last_loss = 0.0;
    auto step = [&](int64_t t) {
      model->zero_grads();
      const double loss = model->forward_backward(batch, loss_scale, {}) * loss_scale;
      const double norm = std::sqrt(model->grad_norm_squared());
      km::AdamWParams adam;
      adam.lr = 1e-3f;
      adam.grad_scale = norm > 1.0 ? static_cast<float>(1.0 / norm) : 1.0f;
      adam.t = t;
      model->adamw_step(adam);
      return loss;
    };
    int64_t t = 1;
    for (int i = 0; i < o.warmup; ++i) {
      const double loss = step(t++);
      if (i == 0) first_loss = loss;
    }
    model->synchronize();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < o.steps; ++i) {
      const double loss = step(t++);
      if (o.warmup == 0 && i == 0) first_loss = loss;
      last_loss = loss;
    }
    model->synchronize();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string after = model->describe();
    if (o.graphs || o.attention != "cublaslt") std::printf("after the run: %s\n", after.c_str());
    // Device memory the model took (state, moments, arena, engine workspaces): free memory before
    // it was made minus free memory after the run.
    size_t free_after = 0;
    KILTER_CUDA_CHECK(cudaMemGetInfo(&free_after, &total_memory));
    const double model_gib = static_cast<double>(free_before - std::min(free_before, free_after)) / (1u << 30);

    const km::ParamLayout& layout = model->layout();
    const double attention_flops = 12.0 * o.cfg.n_layer * o.cfg.n_head * o.cfg.head_dim() * o.T;
    const double flops_per_token =
        o.cfg.llama() ? km::dense_flops_per_token(o.cfg) + attention_flops
                      : 6.0 * (static_cast<double>(layout.num_params) -
                               static_cast<double>(layout.find("transformer.wpe.weight").size)) +
                            attention_flops;
    const bool storage = model->describe().find("activations bf16") != std::string::npos;
    const double tokens_per_s = static_cast<double>(o.B) * o.T * o.steps / seconds;
    const double achieved_tflops = flops_per_token * tokens_per_s / 1e12;
    const double mfu = peak > 0 ? achieved_tflops / peak : NAN;
    const bool ok = std::isfinite(first_loss) && std::isfinite(last_loss) && last_loss < first_loss;
    std::printf("%-10s %-5s B=%-3d T=%-5d params=%.1fM  recompute %s  shard 1/%d  %.2f GiB  %.1f ms/step  %.0f tokens/s  "
                "%.1f TFLOP/s  MFU %s  loss %.4f -> %.4f %s\n",
                o.name.c_str(), o.precision.c_str(), o.B, o.T, layout.num_params / 1e6, o.recompute.c_str(),
                o.shard_ranks, model_gib, 1e3 * seconds / o.steps,
                tokens_per_s, achieved_tflops, peak > 0 ? (std::to_string(100.0 * mfu).substr(0, 5) + "%").c_str() : "n/a",
                first_loss, last_loss, ok ? "(check ok)" : "(CHECK FAILED: loss must be finite and fall)");
    std::printf("RESULT name=%s arch=%s storage=%s precision=%s attention=%s graphs=%d recompute=%s shard=%d memory_gib=%.3f B=%d T=%d "
                "device=\"%s\" tokens_per_s=%.1f "
                "ms_per_step=%.3f tflops=%.2f peak_tflops=%.1f mfu=%.4f first_loss=%.5f last_loss=%.5f check=%s\n",
                o.name.c_str(), o.cfg.arch.c_str(), storage ? "bf16" : "fp32", o.precision.c_str(),
                attention_engine(after).c_str(), o.graphs ? 1 : 0,
                o.recompute.c_str(), o.shard_ranks, model_gib, o.B, o.T,
                prop.name, tokens_per_s, 1e3 * seconds / o.steps,
                achieved_tflops, peak, peak > 0 ? mfu : -1.0, first_loss, last_loss, ok ? "ok" : "failed");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kilter_bench_gpu_step: %s\n", e.what());
    return 1;
  }
}
