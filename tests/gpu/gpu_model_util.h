// What the CUDA-model tests (gpu_model_test.cpp, gpu_bf16_model_test.cpp) share: packed
// micro-batches of mixed piece lengths, a model's parameters on the host, and optimizer steps
// driven the way the trainer drives a model.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "lib/model/model.h"
#include "tests/gpu/gpu_test_util.h"

namespace kilter::gputest {

// A packed micro-batch of `pieces` pieces: the first of max_len tokens, the second of 1, the
// others of lengths fixed by (pieces, max_len) so that a layout repeats (CUDA graphs are kept
// per layout); tokens random.
inline model::Batch random_batch(const model::ModelSpec& cfg, int pieces, int max_len) {
  model::Batch batch;
  batch.clear();
  for (int p = 0; p < pieces; ++p) {
    const int length = p == 0 ? max_len : p == 1 ? 1 : 1 + static_cast<int>((p * 7919L) % max_len);
    std::vector<int32_t> inputs(length), targets(length, -1);
    for (int t = 0; t < length; ++t) {
      inputs[t] = random_int(0, cfg.vocab_size - 1);
      // The last position of a piece has no target (the document ends there).
      if (t + 1 < length) targets[t] = random_int(0, cfg.vocab_size - 1);
    }
    batch.append_piece(inputs.data(), targets.data(), length);
  }
  return batch;
}

inline std::vector<float> params_of(const model::Model& model) {
  std::vector<float> host(model.layout().num_params);
  model.get_params(host.data());
  return host;
}

// Optimizer steps of two micro-batches each (batches 2s and 2s+1), with global-norm clipping at
// 1.0, the way the trainer drives a model. Returns the per-step losses (token means).
inline std::vector<double> run_steps(model::Model& model, const std::vector<model::Batch>& batches, int steps) {
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    const model::Batch& first = batches[2 * step];
    const model::Batch& second = batches[2 * step + 1];
    const float loss_scale = 1.0f / static_cast<float>(first.num_targets + second.num_targets);
    model.zero_grads();
    double loss = model.forward_backward(first, loss_scale, {});
    loss += model.forward_backward(second, loss_scale, {});
    losses.push_back(loss * loss_scale);
    const double norm = std::sqrt(model.grad_norm_squared());
    model::AdamWParams adam;
    adam.lr = 1e-3f;
    adam.grad_scale = norm > 1.0 ? static_cast<float>(1.0 / norm) : 1.0f;
    adam.t = step + 1;
    model.adamw_step(adam);
  }
  model.synchronize();
  return losses;
}

}  // namespace kilter::gputest
