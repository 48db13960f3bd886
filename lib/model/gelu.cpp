// Tanh-approximate GELU forward/backward (shapes in gelu.h), on the vectorizable fast_tanhf.
#include "lib/model/gelu.h"

#include "lib/model/vecmath.h"

namespace kilter::model {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

inline float gelu_derivative(float x) {
  const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
  const float t = fast_tanhf(u);
  const float du_dx = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du_dx;
}

}  // namespace

KILTER_SIMD_CLONES
void gelu_forward(float* out, const float* inp, size_t N) {
  for (size_t i = 0; i < N; ++i) {
    const float x = inp[i];
    const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
    out[i] = 0.5f * x * (1.0f + fast_tanhf(u));
  }
}

KILTER_SIMD_CLONES
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t N) {
  for (size_t i = 0; i < N; ++i) dinp[i] += gelu_derivative(inp[i]) * dout[i];
}

KILTER_SIMD_CLONES
void gelu_backward_inplace(float* d, const float* inp, size_t N) {
  for (size_t i = 0; i < N; ++i) d[i] = gelu_derivative(inp[i]) * d[i];
}

}  // namespace kilter::model
