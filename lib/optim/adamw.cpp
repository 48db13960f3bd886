// AdamW update loop (formula in adamw.h). Bias corrections are computed once per call in double.
#include "lib/optim/adamw.h"

#include <cmath>

#include "io/base/error.h"
#include "lib/model/vecmath.h"

namespace kilter::optim {
namespace {

KILTER_SIMD_CLONES
void adamw_loop(float* params, const float* grads, float* m, float* v, size_t n, float decay_factor, float beta1,
                float beta2, float eps, float grad_scale, float step_size, float inv_sqrt_bc2) {
  for (size_t i = 0; i < n; ++i) {
    const float g = grads[i] * grad_scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) * inv_sqrt_bc2 + eps;
    params[i] = params[i] * decay_factor - step_size * mi / denom;
  }
}

}  // namespace

void adamw_update(float* params, const float* grads, float* m, float* v, size_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, float grad_scale, int64_t t) {
  KILTER_CHECK(t >= 1, "adamw_update: step t must be >= 1 (1-based), got " << t);
  const double bias_correction1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(t));
  const double bias_correction2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(t));
  const float step_size = static_cast<float>(lr / bias_correction1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bias_correction2));
  const float decay_factor = 1.0f - lr * weight_decay;
  adamw_loop(params, grads, m, v, n, decay_factor, beta1, beta2, eps, grad_scale, step_size, inv_sqrt_bc2);
}

}  // namespace kilter::optim
