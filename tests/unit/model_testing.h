// Helpers shared by the model unit tests: random fills, small GPT-2 and Llama configurations,
// packed batches of mixed piece lengths, and the finite-difference rule the gradient checks use.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "lib/model/gemm.h"
#include "lib/model/init.h"
#include "lib/model/model.h"

namespace kilter::model::testing {

inline std::vector<float> random_vector(size_t n, uint64_t seed, double stddev = 1.0) {
  SplitMix64 rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(stddev * rng.normal());
  return v;
}

// A GPT-2 of this shape, every other [model] key at its default.
inline ModelSpec gpt2_config(int n_layer, int n_head, int n_embd, int block_size, int vocab_size) {
  ModelSpec cfg;
  cfg.n_layer = n_layer;
  cfg.n_head = n_head;
  cfg.n_embd = n_embd;
  cfg.block_size = block_size;
  cfg.vocab_size = vocab_size;
  return cfg;
}

inline ModelSpec tiny_config() { return gpt2_config(2, 2, 8, 8, 11); }

// A small Llama: 2 layers, 4 query heads over 2 K/V heads of 4 columns, an MLP of 24, untied.
inline ModelSpec tiny_llama_config(int block_size, int vocab_size) {
  ModelSpec cfg = gpt2_config(2, 4, 16, block_size, vocab_size);
  cfg.arch = "llama";
  cfg.n_kv_head = 2;
  cfg.ffn_hidden = 24;
  return cfg;
}

// Weights away from GPT-2's init (biases 0, norm weights 1), so that every path carries signal.
inline void randomize_params(Model& model, uint64_t seed) {
  const std::vector<float> p = random_vector(model.layout().num_params, seed, 0.3);
  model.set_params(p.data());
}

// A packed batch of pieces of the given lengths (each >= 1); tokens and targets drawn from
// `seed`. Targets of the `masked` (piece, position) pairs are -1 (a position without a target,
// as at the end of a document).
inline Batch make_batch(const std::vector<int>& lengths, int vocab, uint64_t seed,
                        const std::vector<std::pair<int, int>>& masked = {}) {
  Batch batch;
  batch.clear();
  SplitMix64 rng(seed);
  for (int len : lengths) {
    std::vector<int32_t> inputs(len), targets(len);
    for (int t = 0; t < len; ++t) {
      inputs[t] = static_cast<int32_t>(rng.next() % vocab);
      targets[t] = static_cast<int32_t>(rng.next() % vocab);
    }
    batch.append_piece(inputs.data(), targets.data(), len);
  }
  for (auto [p, t] : masked) {
    int32_t& target = batch.targets[batch.cu_seqlens[p] + t];
    if (target >= 0) --batch.num_targets;
    target = -1;
  }
  return batch;
}

// The pieces [first, first + count) of a packed batch, as a batch of their own.
inline Batch sub_batch(const Batch& batch, int first, int count) {
  Batch out;
  out.clear();
  for (int p = first; p < first + count; ++p) {
    const int begin = batch.cu_seqlens[p];
    out.append_piece(batch.inputs.data() + begin, batch.targets.data() + begin, batch.piece_len(p));
  }
  return out;
}

// Five-point central difference (error O(h^4)) of f at x[i]; x is restored afterwards.
inline double central_difference(const std::function<double()>& f, float* x, double h) {
  const float saved = *x;
  auto at = [&](double delta) {
    *x = static_cast<float>(saved + delta);
    const double value = f();
    *x = saved;
    return value;
  };
  return (8.0 * (at(h) - at(-h)) - (at(2 * h) - at(-2 * h))) / (12.0 * h);
}

inline double max_abs(const float* x, size_t n) {
  double m = 0.0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(static_cast<double>(x[i])));
  return m;
}

// The model gradient check: `per_tensor` elements of every parameter tensor, picked from `seed`,
// whose analytic gradient must be within 1e-2 * max|analytic of that tensor| + 1e-4 of the
// five-point difference (h = 2^-7) of `objective`, which reads the weights at `params` (each
// element perturbed in place and restored). Returns a line per element outside that, and per
// tensor whose gradient is all zero (it was not reached); none when the gradients agree.
inline std::vector<std::string> gradient_mismatches(const ParamLayout& layout, const float* analytic, float* params,
                                                    const std::function<double()>& objective, uint64_t seed,
                                                    int per_tensor = 6) {
  std::vector<std::string> mismatches;
  SplitMix64 pick(seed);
  for (const ParamTensor& tensor : layout.tensors) {
    const double scale = max_abs(analytic + tensor.offset, tensor.size);
    if (!(scale > 0.0)) {
      mismatches.push_back(tensor.name + " has an all-zero gradient");
      continue;
    }
    for (int k = 0; k < per_tensor; ++k) {
      const size_t i = tensor.offset + pick.next() % tensor.size;
      const double fd = central_difference(objective, params + i, 0.0078125);
      const double allowed = 1e-2 * scale + 1e-4;
      if (std::fabs(analytic[i] - fd) <= allowed) continue;
      std::ostringstream line;
      line << tensor.name << " element " << i - tensor.offset << ": analytic " << analytic[i] << ", difference " << fd
           << ", allowed " << allowed;
      mismatches.push_back(line.str());
    }
  }
  return mismatches;
}

// The whole model's gradient check, on a model whose weights live in host memory (the CPU
// backend): forward_backward of `batch` at its weights, then gradient_mismatches against
// loss_scale * forward_loss(batch). The loss forward_backward returns must be forward_loss's (to
// 1e-9 relative).
inline std::vector<std::string> model_gradient_mismatches(Model& model, const Batch& batch, float loss_scale,
                                                          uint64_t seed) {
  model.zero_grads();
  const double loss = model.forward_backward(batch, loss_scale, {});
  const double evaluated = model.forward_loss(batch);
  const std::vector<float> grads(model.grads(), model.grads() + model.layout().num_params);
  std::vector<std::string> mismatches = gradient_mismatches(
      model.layout(), grads.data(), model.params(), [&] { return loss_scale * model.forward_loss(batch); }, seed);
  if (!(std::fabs(loss - evaluated) <= 1e-9 * loss)) {
    std::ostringstream line;
    line.precision(17);
    line << "forward_backward's loss " << loss << " is not forward_loss's " << evaluated;
    mismatches.insert(mismatches.begin(), line.str());
  }
  return mismatches;
}

// Sets the GEMM threads for a scope and restores them after: tests whose threads are the ranks run
// one GEMM thread per model (and TSan sees no OpenMP pool).
class ScopedGemmThreads {
 public:
  explicit ScopedGemmThreads(int threads) : saved_(gemm_threads()) { set_gemm_threads(threads); }
  ~ScopedGemmThreads() { set_gemm_threads(saved_); }
  ScopedGemmThreads(const ScopedGemmThreads&) = delete;
  ScopedGemmThreads& operator=(const ScopedGemmThreads&) = delete;

 private:
  int saved_;
};

}  // namespace kilter::model::testing
