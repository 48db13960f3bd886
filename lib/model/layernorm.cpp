// LayerNorm forward/backward (llm.c formulation; shapes in layernorm.h). The variance is taken
// around the mean in a second pass, which is as accurate as torch's Welford for these widths.
#include "lib/model/layernorm.h"

#include <cmath>
#include <cstddef>

#include "lib/model/vecmath.h"

namespace kilter::model {

KILTER_SIMD_CLONES
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C, float eps) {
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<size_t>(n) * C;
    float* y = out + static_cast<size_t>(n) * C;
    const float m = lane_sum(x, C) / C;
    float acc[kSimdLanes] = {0};
    int i = 0;
    for (; i + kSimdLanes <= C; i += kSimdLanes)
      for (int j = 0; j < kSimdLanes; ++j) acc[j] += (x[i + j] - m) * (x[i + j] - m);
    float var = 0.0f;
    for (int j = 0; j < kSimdLanes; ++j) var += acc[j];
    for (; i < C; ++i) var += (x[i] - m) * (x[i] - m);
    const float s = 1.0f / std::sqrt(var / C + eps);
    for (int c = 0; c < C; ++c) y[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

KILTER_SIMD_CLONES
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const float* dy = dout + static_cast<size_t>(n) * C;
    const float* x = inp + static_cast<size_t>(n) * C;
    float* dx = dinp + static_cast<size_t>(n) * C;
    const float m = mean[n];
    const float s = rstd[n];
    // The two row means the LayerNorm Jacobian needs: mean(w*dy) and mean(w*dy*xhat).
    float acc_dnorm[kSimdLanes] = {0};
    float acc_dnorm_norm[kSimdLanes] = {0};
    int i = 0;
    for (; i + kSimdLanes <= C; i += kSimdLanes) {
      for (int j = 0; j < kSimdLanes; ++j) {
        const float dnorm = weight[i + j] * dy[i + j];
        acc_dnorm[j] += dnorm;
        acc_dnorm_norm[j] += dnorm * (x[i + j] - m) * s;
      }
    }
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    for (int j = 0; j < kSimdLanes; ++j) {
      dnorm_mean += acc_dnorm[j];
      dnorm_norm_mean += acc_dnorm_norm[j];
    }
    for (; i < C; ++i) {
      const float dnorm = weight[i] * dy[i];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * (x[i] - m) * s;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    for (int c = 0; c < C; ++c) {
      const float norm = (x[c] - m) * s;
      const float dnorm = weight[c] * dy[c];
      dbias[c] += dy[c];
      dweight[c] += norm * dy[c];
      dx[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
  }
}

}  // namespace kilter::model
