// kilter_model_dump OUT_DIR: writes the inputs and outputs of one CPU forward/backward and one
// AdamW step for tests/python/torch_parity.py: layout.json (config, tensor layout, batch,
// summed loss, hyper-parameters), params.f32 / grads.f32 / params_after_adamw.f32 (raw float32
// in layout order). The weights are random (not GPT-2 init) so biases and LayerNorms matter,
// and the batch is packed: pieces of mixed lengths (a full-context one, one of length 1, one
// longer than a 64-row attention block) and positions without a target.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "lib/backend/cpu_model.h"
#include "tests/unit/model_testing.h"

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

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: kilter_model_dump OUT_DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  kilter::model::GPTConfig cfg;
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
  const double loss_sum = model.forward_backward(batch, loss_scale, {});
  write_floats(dir + "/params.f32", params.data(), layout.num_params);
  write_floats(dir + "/grads.f32", model.grads(), layout.num_params);

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
  meta["num_params"] = layout.num_params;
  for (const kilter::model::ParamTensor& t : layout.tensors)
    meta["tensors"].push_back(
        {{"name", t.name}, {"shape", t.shape}, {"offset", t.offset}, {"size", t.size}, {"decay", t.decay}});
  meta["batch"] = {{"N", batch.N}, {"inputs", batch.inputs}, {"targets", batch.targets},
                   {"cu_seqlens", batch.cu_seqlens}};
  meta["loss_sum"] = loss_sum;
  meta["loss_scale"] = loss_scale;
  meta["adamw"] = {{"lr", adamw.lr},       {"beta1", adamw.beta1}, {"beta2", adamw.beta2},
                   {"eps", adamw.eps},     {"weight_decay", adamw.weight_decay},
                   {"grad_scale", adamw.grad_scale}};
  std::ofstream(dir + "/layout.json") << meta.dump(1) << "\n";
  std::printf("kilter_model_dump: %zu parameters, %lld targets, loss sum %.6f -> %s\n", layout.num_params,
              static_cast<long long>(batch.num_targets), loss_sum, dir.c_str());
  return 0;
}
