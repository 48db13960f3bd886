// Small vectorizable math helpers shared by the CPU kernels: a polynomial exp/tanh in scalar and
// 8-lane form (libm's expf/tanhf are scalar calls and would dominate GELU and softmax), and
// the KILTER_SIMD_CLONES attribute that compiles a hot loop for AVX2+FMA as well as the
// baseline ISA and picks one at load time, so the default (non -march=native) build still uses
// the machine's vector width. Reductions keep 16 partial sums because the compiler may not
// reorder a plain float sum (no -ffast-math), and a single accumulator does not vectorize.
#pragma once
#include <cstdint>
#include <cstring>

// Not under TSan: target_clones makes an ifunc resolver, which the dynamic loader runs before
// TSan's runtime is up, and an instrumented resolver crashes the process at load time.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__) && \
    !defined(__SANITIZE_THREAD__)
#define KILTER_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define KILTER_SIMD_CLONES
#endif

namespace kilter::model {

constexpr int kSimdLanes = 16;  // partial sums per reduction (two AVX registers)

// exp(x) with relative error below 2e-7 on [-87, 88]; inputs outside are clamped (so
// fast_expf(-inf) is about 1e-38, never NaN). Cephes polynomial on the reduced argument.
// Scalar form, for loop tails; fast_exp8 below is the same computation on 8 lanes.
static inline float fast_expf(float x) {
  x = x < 88.0f ? x : 88.0f;
  x = x > -87.0f ? x : -87.0f;
  // round(x / ln2) by the 1.5*2^23 trick: exact, branch-free and vectorizable.
  const float shifter = 12582912.0f;
  float n = (x * 1.44269504088896341f + shifter) - shifter;
  float r = x - n * 0.693359375f;       // ln2 split in a high part exact in float...
  r = r - n * (-2.12194440e-4f);        // ...and the low remainder
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// tanh(x) = 1 - 2 / (exp(2x) + 1); saturates cleanly to +-1 for large |x|.
static inline float fast_tanhf(float x) { return 1.0f - 2.0f / (fast_expf(2.0f * x) + 1.0f); }

// Eight floats as a GCC generic vector: one AVX register in the x86-64-v3 clone, two SSE
// registers in the baseline one. Written out explicitly because GCC will not if-convert (and so
// not auto-vectorize) the clamps of fast_expf under the default -ftrapping-math.
// (-Wpsabi: these helpers are always inlined, so the 32-byte vector ABI note does not apply.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float f32x8 __attribute__((vector_size(32)));
typedef int32_t i32x8 __attribute__((vector_size(32)));
typedef float f32x8_memory __attribute__((vector_size(32), aligned(4), may_alias));
constexpr int kVec = 8;

static inline f32x8 splat8(float s) { return f32x8{s, s, s, s, s, s, s, s}; }
static inline f32x8 load8(const float* p) { return *reinterpret_cast<const f32x8_memory*>(p); }
static inline void store8(float* p, const f32x8& v) { *reinterpret_cast<f32x8_memory*>(p) = v; }

// Vector arguments go by reference: by value, GCC prints an ABI note for every includer.
static inline f32x8 fast_exp8(const f32x8& x_in) {
  f32x8 x = x_in;
  x = x < splat8(88.0f) ? x : splat8(88.0f);
  x = x > splat8(-87.0f) ? x : splat8(-87.0f);
  const f32x8 shifter = splat8(12582912.0f);
  const f32x8 n = (x * 1.44269504088896341f + shifter) - shifter;
  f32x8 r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  f32x8 p = splat8(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const i32x8 bits = (__builtin_convertvector(n, i32x8) + 127) << 23;
  return p * (f32x8)bits;  // a vector cast reinterprets the bits
}

static inline f32x8 fast_tanh8(const f32x8& x) { return 1.0f - 2.0f / (fast_exp8(2.0f * x) + 1.0f); }
#pragma GCC diagnostic pop

// Sum of x[0..n) with kSimdLanes partial sums (vectorizes without -ffast-math).
static inline float lane_sum(const float* x, int n) {
  float acc[kSimdLanes] = {0};
  int i = 0;
  for (; i + kSimdLanes <= n; i += kSimdLanes)
    for (int j = 0; j < kSimdLanes; ++j) acc[j] += x[i + j];
  float total = 0.0f;
  for (int j = 0; j < kSimdLanes; ++j) total += acc[j];
  for (; i < n; ++i) total += x[i];
  return total;
}

// Sum of x[i]*y[i] over [0, n), same scheme.
static inline float lane_dot(const float* x, const float* y, int n) {
  float acc[kSimdLanes] = {0};
  int i = 0;
  for (; i + kSimdLanes <= n; i += kSimdLanes)
    for (int j = 0; j < kSimdLanes; ++j) acc[j] += x[i + j] * y[i + j];
  float total = 0.0f;
  for (int j = 0; j < kSimdLanes; ++j) total += acc[j];
  for (; i < n; ++i) total += x[i] * y[i];
  return total;
}

// Largest of x[0..n), n >= 1.
static inline float lane_max(const float* x, int n) {
  float acc[kSimdLanes];
  for (int j = 0; j < kSimdLanes; ++j) acc[j] = x[0];
  int i = 0;
  for (; i + kSimdLanes <= n; i += kSimdLanes)
    for (int j = 0; j < kSimdLanes; ++j) acc[j] = acc[j] > x[i + j] ? acc[j] : x[i + j];
  float best = acc[0];
  for (int j = 1; j < kSimdLanes; ++j) best = best > acc[j] ? best : acc[j];
  for (; i < n; ++i) best = best > x[i] ? best : x[i];
  return best;
}

}  // namespace kilter::model
