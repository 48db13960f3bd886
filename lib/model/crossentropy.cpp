// Cross-entropy forward/backward (shapes in crossentropy.h). The row's log-sum-exp is taken
// around its maximum; the per-row loss is formed in double so that summing thousands of rows
// does not lose the small ones.
#include "lib/model/crossentropy.h"

#include <cmath>
#include <cstddef>
#include <cstring>

#include "lib/model/vecmath.h"

#pragma GCC diagnostic ignored "-Wpsabi"  // 8-lane helpers are inlined; no ABI crosses them

namespace kilter::model {
namespace {

// Sum of exp(x[j] - shift) over the row, with partial sums so it vectorizes.
KILTER_SIMD_CLONES
float sum_exp_shifted(const float* x, int V, float shift) {
  f32x8 acc0 = splat8(0.0f), acc1 = splat8(0.0f);
  const f32x8 shift8 = splat8(shift);
  int j = 0;
  for (; j + 2 * kVec <= V; j += 2 * kVec) {
    acc0 += fast_exp8(load8(x + j) - shift8);
    acc1 += fast_exp8(load8(x + j + kVec) - shift8);
  }
  float lanes[kVec];
  store8(lanes, acc0 + acc1);
  float total = 0.0f;
  for (int l = 0; l < kVec; ++l) total += lanes[l];
  for (; j < V; ++j) total += fast_expf(x[j] - shift);
  return total;
}

KILTER_SIMD_CLONES
void accumulate_softmax_grad(float* dlogits, const float* x, int V, float shift, float factor) {
  int j = 0;
  for (; j + kVec <= V; j += kVec)
    store8(dlogits + j, load8(dlogits + j) + fast_exp8(load8(x + j) - splat8(shift)) * factor);
  for (; j < V; ++j) dlogits[j] += fast_expf(x[j] - shift) * factor;
}

KILTER_SIMD_CLONES
void exp_shifted_inplace(float* x, int V, float shift) {
  int j = 0;
  for (; j + kVec <= V; j += kVec) store8(x + j, fast_exp8(load8(x + j) - splat8(shift)));
  for (; j < V; ++j) x[j] = fast_expf(x[j] - shift);
}

KILTER_SIMD_CLONES
void scale_inplace(float* x, int V, float factor) {
  for (int j = 0; j < V; ++j) x[j] *= factor;
}

KILTER_SIMD_CLONES
float row_max(const float* x, int V) { return lane_max(x, V); }

}  // namespace

double crossentropy_forward_backward(float* dlogits, const float* logits, const int32_t* targets, int N, int V,
                                     float dloss_scale) {
  double loss = 0.0;
  for (int n = 0; n < N; ++n) {
    const int32_t target = targets[n];
    if (target < 0) continue;
    const float* x = logits + static_cast<size_t>(n) * V;
    float* dx = dlogits + static_cast<size_t>(n) * V;
    const float mx = row_max(x, V);
    const float sum = sum_exp_shifted(x, V, mx);
    loss += std::log(static_cast<double>(sum)) + mx - x[target];
    accumulate_softmax_grad(dx, x, V, mx, dloss_scale / sum);
    dx[target] -= dloss_scale;
  }
  return loss;
}

double crossentropy_forward_backward_inplace(float* logits, const int32_t* targets, int N, int V, float dloss_scale) {
  double loss = 0.0;
  for (int n = 0; n < N; ++n) {
    float* x = logits + static_cast<size_t>(n) * V;
    const int32_t target = targets[n];
    if (target < 0) {
      std::memset(x, 0, sizeof(float) * V);
      continue;
    }
    const float mx = row_max(x, V);
    const float target_logit = x[target];
    exp_shifted_inplace(x, V, mx);
    const float sum = lane_sum(x, V);
    loss += std::log(static_cast<double>(sum)) + mx - target_logit;
    scale_inplace(x, V, dloss_scale / sum);
    x[target] -= dloss_scale;
  }
  return loss;
}

double crossentropy_forward(const float* logits, const int32_t* targets, int N, int V) {
  double loss = 0.0;
  for (int n = 0; n < N; ++n) {
    const int32_t target = targets[n];
    if (target < 0) continue;
    const float* x = logits + static_cast<size_t>(n) * V;
    const float mx = row_max(x, V);
    loss += std::log(static_cast<double>(sum_exp_shifted(x, V, mx))) + mx - x[target];
  }
  return loss;
}

}  // namespace kilter::model
