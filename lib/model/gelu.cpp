// Tanh-approximate GELU forward/backward (shapes in gelu.h), 8 lanes at a time on fast_tanh8
// with a scalar tail; both forms compute the same formula.
#include "lib/model/gelu.h"

#include "lib/model/vecmath.h"

#pragma GCC diagnostic ignored "-Wpsabi"  // 8-lane helpers below are inlined; no ABI crosses them

namespace kilter::model {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

inline f32x8 gelu8(const f32x8& x) {
  const f32x8 u = kSqrt2OverPi * (x + kCubic * x * x * x);
  return 0.5f * x * (1.0f + fast_tanh8(u));
}

inline f32x8 gelu_derivative8(const f32x8& x) {
  const f32x8 u = kSqrt2OverPi * (x + kCubic * x * x * x);
  const f32x8 t = fast_tanh8(u);
  const f32x8 du_dx = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du_dx;
}

inline float gelu1(float x) {
  const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
  return 0.5f * x * (1.0f + fast_tanhf(u));
}

inline float gelu_derivative1(float x) {
  const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
  const float t = fast_tanhf(u);
  const float du_dx = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du_dx;
}

}  // namespace

KILTER_SIMD_CLONES
void gelu_forward(float* out, const float* inp, size_t N) {
  size_t i = 0;
  for (; i + kVec <= N; i += kVec) store8(out + i, gelu8(load8(inp + i)));
  for (; i < N; ++i) out[i] = gelu1(inp[i]);
}

KILTER_SIMD_CLONES
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t N) {
  size_t i = 0;
  for (; i + kVec <= N; i += kVec)
    store8(dinp + i, load8(dinp + i) + gelu_derivative8(load8(inp + i)) * load8(dout + i));
  for (; i < N; ++i) dinp[i] += gelu_derivative1(inp[i]) * dout[i];
}

KILTER_SIMD_CLONES
void gelu_backward_inplace(float* d, const float* inp, size_t N) {
  size_t i = 0;
  for (; i + kVec <= N; i += kVec) store8(d + i, gelu_derivative8(load8(inp + i)) * load8(d + i));
  for (; i < N; ++i) d[i] = gelu_derivative1(inp[i]) * d[i];
}

}  // namespace kilter::model
