// SwiGLU (swiglu.h). With s = sigmoid(g): d silu(g)/dg = s (1 + g (1 - s)).
#include "lib/model/swiglu.h"

#include <cmath>

namespace kilter::model {

void swiglu_forward(float* out, const float* inp, int N, int F) {
  for (int n = 0; n < N; ++n) {
    const float* gate = inp + size_t(n) * 2 * F;
    const float* up = gate + F;
    float* y = out + size_t(n) * F;
    for (int i = 0; i < F; ++i) y[i] = gate[i] * (1.0f / (1.0f + std::exp(-gate[i]))) * up[i];
  }
}

void swiglu_backward(float* dinp, const float* dout, const float* inp, int N, int F) {
  for (int n = 0; n < N; ++n) {
    const float* gate = inp + size_t(n) * 2 * F;
    const float* up = gate + F;
    const float* dy = dout + size_t(n) * F;
    float* dgate = dinp + size_t(n) * 2 * F;
    float* dup = dgate + F;
    for (int i = 0; i < F; ++i) {
      const float s = 1.0f / (1.0f + std::exp(-gate[i]));
      const float silu = gate[i] * s;
      dup[i] = dy[i] * silu;
      dgate[i] = dy[i] * up[i] * s * (1.0f + gate[i] * (1.0f - s));
    }
  }
}

}  // namespace kilter::model
