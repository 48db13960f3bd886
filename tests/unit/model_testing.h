// Helpers shared by the model unit tests: random fills, a tiny GPT configuration, packed
// batches of mixed piece lengths, and the finite-difference rule the gradient checks use.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
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

inline ModelSpec tiny_config() {
  ModelSpec cfg;
  cfg.n_layer = 2;
  cfg.n_head = 2;
  cfg.n_embd = 8;
  cfg.block_size = 8;
  cfg.vocab_size = 11;
  return cfg;
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
