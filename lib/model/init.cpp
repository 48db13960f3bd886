// GPT-2 initialization from a portable generator (see init.h for the rules).
#include "lib/model/init.h"

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

namespace {
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

void init_gpt2_params(float* params, const ParamLayout& layout, const GPTConfig& cfg, uint64_t seed) {
  const double std_default = 0.02;
  const double std_residual = 0.02 / std::sqrt(2.0 * cfg.n_layer);
  for (size_t index = 0; index < layout.tensors.size(); ++index) {
    const ParamTensor& tensor = layout.tensors[index];
    float* p = params + tensor.offset;
    const bool layernorm = tensor.name.find(".ln_") != std::string::npos;
    if (ends_with(tensor.name, ".bias")) {
      for (size_t i = 0; i < tensor.size; ++i) p[i] = 0.0f;
    } else if (layernorm) {
      for (size_t i = 0; i < tensor.size; ++i) p[i] = 1.0f;
    } else {
      const double stddev = ends_with(tensor.name, "c_proj.weight") ? std_residual : std_default;
      SplitMix64 rng(seed ^ (0xD1B54A32D192ED03ull * (index + 1)));
      for (size_t i = 0; i < tensor.size; ++i) p[i] = static_cast<float>(stddev * rng.normal());
    }
  }
}

}  // namespace kilter::model
