// Initialization from a portable generator (see init.h for the rules).
#include "lib/model/init.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace kilter::model {

uint64_t SplitMix64::next() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double SplitMix64::uniform_open01() {
  // 53 random bits, shifted by half a step so that neither 0 nor 1 occurs.
  return (static_cast<double>(next() >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

double SplitMix64::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  const double radius = std::sqrt(-2.0 * std::log(uniform_open01()));
  const double angle = 6.283185307179586 * uniform_open01();
  spare_ = radius * std::sin(angle);
  has_spare_ = true;
  return radius * std::cos(angle);
}

void init_params(float* params, const ParamLayout& layout, const ModelSpec& spec, uint64_t seed) {
  const double std_default = 0.02;
  const double std_residual = 0.02 / std::sqrt(2.0 * spec.n_layer);
  for (size_t index = 0; index < layout.tensors.size(); ++index) {
    const ParamTensor& tensor = layout.tensors[index];
    float* p = params + tensor.offset;
    switch (tensor.init) {
      case TensorInit::zeros: std::fill(p, p + tensor.size, 0.0f); break;
      case TensorInit::ones: std::fill(p, p + tensor.size, 1.0f); break;
      case TensorInit::normal:
      case TensorInit::normal_residual: {
        const double stddev = tensor.init == TensorInit::normal_residual ? std_residual : std_default;
        SplitMix64 rng(seed ^ (0xD1B54A32D192ED03ull * (index + 1)));
        for (size_t i = 0; i < tensor.size; ++i) p[i] = static_cast<float>(stddev * rng.normal());
        break;
      }
    }
  }
}

}  // namespace kilter::model
