// RMSNorm forward/backward (shapes in rmsnorm.h). With r = 1/sqrt(mean(x^2) + eps) and g = w*dy,
// dx = r g - r^3 x mean(g x): the norm's Jacobian, one row mean per token.
#include "lib/model/rmsnorm.h"

#include <cmath>
#include <cstddef>

#include "lib/model/vecmath.h"

namespace kilter::model {

KILTER_SIMD_CLONES
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps) {
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<size_t>(n) * C;
    float* y = out + static_cast<size_t>(n) * C;
    const float r = 1.0f / std::sqrt(lane_dot(x, x, C) / C + eps);
    for (int c = 0; c < C; ++c) y[c] = weight[c] * (x[c] * r);
    rstd[n] = r;
  }
}

KILTER_SIMD_CLONES
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const float* dy = dout + static_cast<size_t>(n) * C;
    const float* x = inp + static_cast<size_t>(n) * C;
    float* dx = dinp + static_cast<size_t>(n) * C;
    const float r = rstd[n];
    float acc[kSimdLanes] = {0};
    int i = 0;
    for (; i + kSimdLanes <= C; i += kSimdLanes)
      for (int j = 0; j < kSimdLanes; ++j) acc[j] += weight[i + j] * dy[i + j] * x[i + j];
    float gx = 0.0f;
    for (int j = 0; j < kSimdLanes; ++j) gx += acc[j];
    for (; i < C; ++i) gx += weight[i] * dy[i] * x[i];
    const float scale = r * r * r * gx / C;
    for (int c = 0; c < C; ++c) {
      dweight[c] += dy[c] * (x[c] * r);
      dx[c] += weight[c] * dy[c] * r - x[c] * scale;
    }
  }
}

}  // namespace kilter::model
