// Helpers shared by the model unit tests: random fills, a tiny GPT configuration and batches
// with padded rows, and the finite-difference rule the gradient checks use.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "lib/model/init.h"
#include "lib/model/model.h"

namespace kilter::model::testing {

inline std::vector<float> random_vector(size_t n, uint64_t seed, double stddev = 1.0) {
  SplitMix64 rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(stddev * rng.normal());
  return v;
}

inline GPTConfig tiny_config() {
  GPTConfig cfg;
  cfg.n_layer = 2;
  cfg.n_head = 2;
  cfg.n_embd = 8;
  cfg.block_size = 8;
  cfg.vocab_size = 11;
  return cfg;
}

// A batch whose rows have the given lengths (<= T); tokens and targets drawn from `seed`;
// padded positions hold input -1 and target -1. Targets of `masked_real` positions are -1 as well
// (a real position without a target, as at the end of a document).
inline Batch make_batch(const std::vector<int>& lengths, int T, int vocab, uint64_t seed,
                        const std::vector<std::pair<int, int>>& masked_real = {}) {
  Batch batch;
  batch.B = static_cast<int>(lengths.size());
  batch.T = T;
  batch.inputs.assign(static_cast<size_t>(batch.B) * T, -1);
  batch.targets.assign(static_cast<size_t>(batch.B) * T, -1);
  batch.lengths.assign(lengths.begin(), lengths.end());
  SplitMix64 rng(seed);
  for (int b = 0; b < batch.B; ++b)
    for (int t = 0; t < lengths[b]; ++t) {
      batch.inputs[static_cast<size_t>(b) * T + t] = static_cast<int32_t>(rng.next() % vocab);
      batch.targets[static_cast<size_t>(b) * T + t] = static_cast<int32_t>(rng.next() % vocab);
    }
  for (auto [b, t] : masked_real) batch.targets[static_cast<size_t>(b) * T + t] = -1;
  batch.num_targets = std::count_if(batch.targets.begin(), batch.targets.end(), [](int32_t x) { return x >= 0; });
  return batch;
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

}  // namespace kilter::model::testing
