// Deterministic initialization of the parameters on the host, shared by every backend (the CUDA
// backend copies these values), and the portable random numbers behind it.
#pragma once
#include <cstddef>
#include <cstdint>

#include "lib/model/layout.h"

namespace kilter::model {

// splitmix64 (Steele, Lea, Flood 2014): a tiny, well-mixed generator whose output depends only
// on the seed, unlike std::normal_distribution (implementation-defined).
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next();
  double uniform_open01();  // in (0, 1): never 0, so log() is safe
  // Standard normal by Box-Muller; the second value of each pair is kept for the next call.
  double normal();

 private:
  uint64_t state_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};

// Fills params (layout.num_params floats; the padded tail, if any, is left alone) as each tensor's
// TensorInit says (GPT-2's initialization): weights ~ N(0, 0.02), projections into the residual
// stream ~ N(0, 0.02/sqrt(2*n_layer)), biases 0, norm weights 1. Each tensor draws from its own
// stream seeded by (seed, tensor index), so the values do not depend on the order of filling.
void init_params(float* params, const ParamLayout& layout, const ModelSpec& spec, uint64_t seed);

}  // namespace kilter::model
