// kilter_model_dump OUT_DIR: writes the inputs and outputs of one CPU forward/backward and one
// AdamW step for tests/python/torch_parity.py: layout.json (config, tensor layout, batch,
// summed loss, hyper-parameters), params.f32 / grads.f32 / params_after_adamw.f32 (raw float32
// in layout order). The weights are random (not GPT-2 init) so biases and LayerNorms matter,
// and the batch is packed: pieces of mixed lengths (a full-context one, one of length 1, one
// longer than a 64-row attention block) and positions without a target.
// kilter_model_dump OUT_DIR --cut (issue 23): the same batch, but its loss and gradients are
// those of the pieces of 80 and 66 tokens cut between three "ranks" (CpuModels in threads joined
// by tests/unit/thread_kv_exchange.h), summed over the ranks; the batch written is the uncut one,
// so torch_parity.py compares a cut computation with PyTorch running whole pieces.
// kilter_model_dump OUT_DIR --llama CASE (issue 38): the same batch through a model.arch = llama
// model (tests/e2e/llama_parity.sh compares it with transformers' LlamaForCausalLM or
// Qwen2ForCausalLM): CASE gqa (4 query heads over 2 K/V heads, untied, rope_theta 5e5, an MLP
// width of its own), tied (tied head, as many K/V heads as query heads, eps 1e-6), llama3 (one
// K/V head, llama3 RoPE scaling whose bands all fall inside the head), qwen2 (q/k/v biases).
// It also writes logits.f32: the logits of every position, each piece fed on its own through
// the KV-cache generator (lib/model/generate.h, what `kilter sample` runs).
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "lib/backend/cpu_model.h"
#include "lib/model/generate.h"
#include "tests/unit/model_testing.h"
#include "tests/unit/thread_kv_exchange.h"

namespace {

void write_floats(const std::string& path, const float* data, size_t n) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(sizeof(float) * n));
  if (!out) {
    std::fprintf(stderr, "kilter_model_dump: cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

}  // namespace

// The ranks' summed loss of `batch` cut as `ranks` says; their summed gradients in `grads`.
double cut_forward_backward(const kilter::model::ModelSpec& cfg, const std::vector<float>& params,
                            const kilter::model::Batch& batch,
                            const std::vector<std::vector<kilter::model::testing::RankPart>>& ranks, float loss_scale,
                            float* grads) {
  namespace kt = kilter::model::testing;
  const kt::CutBatches setup = kt::cut_batches(batch, ranks);
  const int n = static_cast<int>(ranks.size());
  kt::ThreadKvHub hub(n, cfg.n_layer, kilter::model::kv_row_layout(cfg), setup.cuts);
  std::vector<std::unique_ptr<kilter::backend::CpuModel>> models;
  std::vector<kilter::model::Batch> batches = setup.batches;
  for (int r = 0; r < n; ++r) {
    models.push_back(std::make_unique<kilter::backend::CpuModel>(cfg, 1));
    models[r]->set_params(params.data());
    models[r]->zero_grads();
    batches[r].exchange = hub.endpoint(r);
  }
  std::vector<double> losses(n);
  const std::vector<std::string> failures =
      kt::run_ranks(n, [&](int r) { losses[r] = models[r]->forward_backward(batches[r], loss_scale, {}); });
  for (int r = 0; r < n; ++r)
    if (!failures[r].empty()) {
      std::fprintf(stderr, "kilter_model_dump: rank %d of the cut run failed: %s\n", r, failures[r].c_str());
      std::exit(1);
    }
  for (const std::string& error : hub.errors()) {
    std::fprintf(stderr, "kilter_model_dump: exchange contract: %s\n", error.c_str());
    std::exit(1);
  }
  const size_t count = models[0]->layout().num_params;
  double loss = 0;
  std::vector<double> sum(count, 0.0);
  for (int r = 0; r < n; ++r) {
    loss += losses[r];
    for (size_t i = 0; i < count; ++i) sum[i] += models[r]->grads()[i];
  }
  for (size_t i = 0; i < count; ++i) grads[i] = static_cast<float>(sum[i]);
  return loss;
}

// The llama model of `name` (see the top), or nothing when `name` is none of the cases.
bool llama_case(const std::string& name, kilter::model::ModelSpec& cfg) {
  cfg.arch = "llama";
  cfg.ffn_hidden = 96;
  if (name == "gqa") {
    cfg.n_kv_head = 2;
    cfg.rope_theta = 500000;
    cfg.tie_embeddings = "false";
  } else if (name == "tied") {
    cfg.n_kv_head = 4;
    cfg.tie_embeddings = "true";
    cfg.norm_eps = 1e-6;
  } else if (name == "llama3") {
    // head_dim 16: wavelengths 6.3, 20, 63, ... against 32 / 4 and 32 / 1: one pair of columns
    // keeps its frequency, one is blended, the others are divided by the factor.
    cfg.n_kv_head = 1;
    cfg.rope_scaling = "llama3";
    cfg.rope_factor = 8;
    cfg.rope_low_freq_factor = 1;
    cfg.rope_high_freq_factor = 4;
    cfg.rope_original_context = 32;
  } else if (name == "qwen2") {
    cfg.n_kv_head = 2;
    cfg.qkv_bias = true;
    cfg.rope_theta = 1000000;
    cfg.norm_eps = 1e-6;
  } else {
    return false;
  }
  return true;
}

// The logits of every position of `batch`, each piece from position 0, [N, vocab].
std::vector<float> generator_logits(const kilter::model::ModelSpec& cfg, const std::vector<float>& params,
                                    const kilter::model::Batch& batch) {
  kilter::model::Generator generator(cfg, params);
  std::vector<float> logits;
  for (size_t p = 0; p + 1 < batch.cu_seqlens.size(); ++p) {
    generator.reset();
    for (int t = batch.cu_seqlens[p]; t < batch.cu_seqlens[p + 1]; ++t) {
      const float* row = generator.feed(&batch.inputs[size_t(t)], 1);
      logits.insert(logits.end(), row, row + cfg.vocab_size);
    }
  }
  return logits;
}

int main(int argc, char** argv) {
  const bool cut = argc == 3 && std::strcmp(argv[2], "--cut") == 0;
  const bool llama = argc == 4 && std::strcmp(argv[2], "--llama") == 0;
  kilter::model::ModelSpec cfg;
  if ((argc != 2 && !cut && !llama) || (llama && !llama_case(argv[3], cfg))) {
    std::fprintf(stderr, "usage: kilter_model_dump OUT_DIR [--cut | --llama gqa|tied|llama3|qwen2]\n");
    return 2;
  }
  const std::string dir = argv[1];
  cfg.n_layer = 2;
  cfg.n_head = 4;
  cfg.n_embd = 64;
  cfg.block_size = 80;  // > one 64-row attention block
  cfg.vocab_size = 97;
  kilter::backend::CpuModel model(cfg, 1);
  const kilter::model::ParamLayout& layout = model.layout();
  std::vector<float> params = kilter::model::testing::random_vector(layout.num_params, 2024, 0.2);
  model.set_params(params.data());
  const kilter::model::Batch batch =
      kilter::model::testing::make_batch({80, 45, 1, 7, 66}, cfg.vocab_size, 99, {{0, 79}, {1, 44}, {1, 10}});
  const float loss_scale = 1.0f / static_cast<float>(batch.num_targets);
  model.zero_grads();
  // Pieces 0 (80 tokens) and 4 (66) cut: [0,30) [30,61) [61,80) and [0,50) [50,66); rank 1 holds a
  // middle part, rank 2 two later parts.
  const std::vector<std::vector<kilter::model::testing::RankPart>> ranks = {
      {{0, 0, 30}, {1}, {4, 0, 50}}, {{2}, {0, 30, 61}, {3}}, {{4, 50, -1}, {0, 61, -1}}};
  const double loss_sum = cut ? cut_forward_backward(cfg, params, batch, ranks, loss_scale, model.grads())
                              : model.forward_backward(batch, loss_scale, {});
  write_floats(dir + "/params.f32", params.data(), layout.num_params);
  write_floats(dir + "/grads.f32", model.grads(), layout.num_params);
  if (llama) {
    const std::vector<float> logits = generator_logits(cfg, params, batch);
    write_floats(dir + "/logits.f32", logits.data(), logits.size());
  }

  kilter::model::AdamWParams adamw;
  adamw.lr = 1e-2f;
  adamw.weight_decay = 0.1f;
  adamw.grad_scale = 0.7f;
  adamw.t = 1;
  model.adamw_step(adamw);
  write_floats(dir + "/params_after_adamw.f32", model.params(), layout.num_params);

  nlohmann::json meta;
  meta["config"] = {{"n_layer", cfg.n_layer}, {"n_head", cfg.n_head}, {"n_embd", cfg.n_embd},
                    {"block_size", cfg.block_size}, {"vocab_size", cfg.vocab_size}};
  if (llama)
    meta["config"].update({{"arch", cfg.arch},
                           {"case", argv[3]},
                           {"n_kv_head", cfg.kv_heads()},
                           {"ffn_hidden", cfg.ffn_width()},
                           {"rope_theta", cfg.rope_theta},
                           {"rope_scaling", cfg.rope_scaling},
                           {"rope_factor", cfg.rope_factor},
                           {"rope_low_freq_factor", cfg.rope_low_freq_factor},
                           {"rope_high_freq_factor", cfg.rope_high_freq_factor},
                           {"rope_original_context", cfg.rope_original_context},
                           {"norm_eps", cfg.norm_eps},
                           {"tied", cfg.tied()},
                           {"qkv_bias", cfg.qkv_bias}});
  meta["num_params"] = layout.num_params;
  for (const kilter::model::ParamTensor& t : layout.tensors)
    meta["tensors"].push_back(
        {{"name", t.name}, {"shape", t.shape}, {"offset", t.offset}, {"size", t.size}, {"decay", t.decay}});
  meta["batch"] = {{"N", batch.N}, {"inputs", batch.inputs}, {"targets", batch.targets},
                   {"cu_seqlens", batch.cu_seqlens}};
  meta["loss_sum"] = loss_sum;
  meta["cut"] = cut ? "pieces 0 and 4 cut between 3 ranks, losses and gradients summed" : "none";
  meta["loss_scale"] = loss_scale;
  meta["adamw"] = {{"lr", adamw.lr},       {"beta1", adamw.beta1}, {"beta2", adamw.beta2},
                   {"eps", adamw.eps},     {"weight_decay", adamw.weight_decay},
                   {"grad_scale", adamw.grad_scale}};
  std::ofstream(dir + "/layout.json") << meta.dump(1) << "\n";
  std::printf("kilter_model_dump: %zu parameters, %lld targets, loss sum %.6f%s%s -> %s\n", layout.num_params,
              static_cast<long long>(batch.num_targets), loss_sum, cut ? " (cut pieces on 3 ranks)" : "",
              llama ? (std::string(" (llama, ") + argv[3] + ")").c_str() : "", dir.c_str());
  return 0;
}
