// The bf16-storage twins (bf16_ops.h): the plain CPU ops on bf16 values, rounded where the
// CUDA kernels store bf16. GEMMs are fp32 sgemm on bf16 values (exact products; see the header).
#include "lib/model/bf16_ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "lib/model/gelu.h"
#include "lib/model/layernorm.h"
#include "lib/model/rmsnorm.h"
#include "lib/model/swiglu.h"

namespace kilter::model {

void round_bf16_inplace(float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = round_bf16(x[i]);
}

void round_bf16_columns(float* x, int rows, int ld, int first, int count) {
  for (int r = 0; r < rows; ++r) round_bf16_inplace(x + static_cast<size_t>(r) * ld + first, static_cast<size_t>(count));
}

void bf16_to_floats(float* out, const bf16* in, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = bf16_to_float(in[i]);
}

namespace {

// The working copy of a weight (rows x cols bf16) as floats, in this thread's scratch.
const float* expanded(const bf16* weight, size_t n, std::vector<float>& scratch) {
  if (scratch.size() < n) scratch.resize(n);
  bf16_to_floats(scratch.data(), weight, n);
  return scratch.data();
}

thread_local std::vector<float> weight_scratch, bias_scratch, product_scratch;

}  // namespace

void norm_forward_bf16(float* out, float* mean, float* rstd, const float* x, const float* weight, const float* bias,
                       int N, int C, const NormSpec& norm) {
  if (norm.rms)
    rmsnorm_forward(out, rstd, x, weight, N, C, norm.eps);
  else
    layernorm_forward(out, mean, rstd, x, weight, bias, N, C, norm.eps);
  round_bf16_inplace(out, static_cast<size_t>(N) * C);
}

void residual_norm_forward_bf16(float* residual, float* out, float* mean, float* rstd, const float* a,
                                const float* b, const float* weight, const float* bias, int N, int C,
                                const NormSpec& norm) {
  const size_t n = static_cast<size_t>(N) * C;
  for (size_t i = 0; i < n; ++i) residual[i] = round_bf16(a[i] + b[i]);
  norm_forward_bf16(out, mean, rstd, residual, weight, bias, N, C, norm);
}

void norm_backward_bf16(float* dresidual, float* dresidual_bf16, float* dweight, float* dbias, const float* dout,
                        const float* x, const float* weight, const float* mean, const float* rstd, int N, int C,
                        const NormSpec& norm) {
  if (norm.rms)
    rmsnorm_backward(dresidual, dweight, dout, x, weight, rstd, N, C);
  else
    layernorm_backward(dresidual, dweight, dbias, dout, x, weight, mean, rstd, N, C);
  const size_t n = static_cast<size_t>(N) * C;
  for (size_t i = 0; i < n; ++i) dresidual_bf16[i] = round_bf16(dresidual[i]);
}

void linear_forward_bf16(float* out, float* pre_gelu, const float* inp, const bf16* weight, const bf16* bias, int N,
                         int C, int OC) {
  const size_t n = static_cast<size_t>(N) * OC;
  const float* w = expanded(weight, static_cast<size_t>(OC) * C, weight_scratch);
  float* h = pre_gelu != nullptr ? pre_gelu : out;
  sgemm_rowmajor(false, true, N, OC, C, 1.0f, inp, C, w, C, 0.0f, h, OC);
  if (bias != nullptr) {
    const float* b = expanded(bias, static_cast<size_t>(OC), bias_scratch);
    for (int r = 0; r < N; ++r)
      for (int c = 0; c < OC; ++c) h[static_cast<size_t>(r) * OC + c] += b[c];
  }
  if (pre_gelu != nullptr) gelu_forward(out, h, n);  // of the unrounded sum, as the epilogue does
  round_bf16_inplace(out, n);
  if (pre_gelu != nullptr) round_bf16_inplace(pre_gelu, n);
}

void linear_backward_bf16(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const bf16* weight, const float* pre_gelu, int N, int C, int OC) {
  if (dinp != nullptr) {
    const float* w = expanded(weight, static_cast<size_t>(OC) * C, weight_scratch);
    sgemm_rowmajor(false, false, N, C, OC, 1.0f, dout, OC, w, C, 0.0f, dinp, C);
    if (pre_gelu != nullptr) gelu_backward_inplace(dinp, pre_gelu, static_cast<size_t>(N) * C);
    round_bf16_inplace(dinp, static_cast<size_t>(N) * C);
  }
  sgemm_rowmajor(true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
  if (dbias != nullptr)
    for (int r = 0; r < N; ++r)
      for (int c = 0; c < OC; ++c) dbias[c] += dout[static_cast<size_t>(r) * OC + c];
}

void gelu_forward_bf16(float* out, const float* inp, size_t n) {
  gelu_forward(out, inp, n);
  round_bf16_inplace(out, n);
}

void swiglu_forward_bf16(float* out, const float* inp, int N, int F) {
  swiglu_forward(out, inp, N, F);
  round_bf16_inplace(out, static_cast<size_t>(N) * F);
}

void swiglu_backward_bf16(float* dinp, const float* dout, const float* inp, int N, int F) {
  swiglu_backward(dinp, dout, inp, N, F);
  round_bf16_inplace(dinp, static_cast<size_t>(N) * 2 * F);
}

namespace {

// One row of bf16 logits (V): its loss, and with dlogits its gradient in place, rounded. The
// arithmetic of the CUDA classifier kernel: max, sum of expf around it, then softmax - onehot.
double classifier_row(float* logits, int V, int target, float dloss_scale, bool backward) {
  float row_max = -INFINITY;
  for (int j = 0; j < V; ++j) row_max = std::max(row_max, logits[j]);
  float sum = 0.0f;
  for (int j = 0; j < V; ++j) sum += std::exp(logits[j] - row_max);
  const double loss = std::log(static_cast<double>(sum)) + row_max - logits[target];
  if (!backward) return loss;
  const float inv_sum = 1.0f / sum;
  for (int j = 0; j < V; ++j) {
    const float p = std::exp(logits[j] - row_max) * inv_sum;
    logits[j] = round_bf16((p - (j == target ? 1.0f : 0.0f)) * dloss_scale);
  }
  return loss;
}

}  // namespace

double classifier_bf16(float* dx, float* dweight, const float* x, const bf16* weight, const int32_t* targets, int N,
                       int C, int V, float dloss_scale) {
  constexpr int kChunkRows = 256;  // target rows whose logits exist at once
  const bool backward = dx != nullptr;
  const float* w = expanded(weight, static_cast<size_t>(V) * C, weight_scratch);
  if (backward) std::fill(dx, dx + static_cast<size_t>(N) * C, 0.0f);
  std::vector<int> rows;
  for (int r = 0; r < N; ++r)
    if (targets[r] >= 0) rows.push_back(r);
  std::vector<float> xs(static_cast<size_t>(kChunkRows) * C), dxs(xs.size());
  std::vector<float>& logits = product_scratch;
  logits.resize(static_cast<size_t>(kChunkRows) * V);
  double loss = 0.0;
  for (size_t first = 0; first < rows.size(); first += kChunkRows) {
    const int n = static_cast<int>(std::min<size_t>(kChunkRows, rows.size() - first));
    for (int i = 0; i < n; ++i)
      std::copy(x + static_cast<size_t>(rows[first + i]) * C, x + static_cast<size_t>(rows[first + i] + 1) * C,
                xs.begin() + static_cast<size_t>(i) * C);
    sgemm_rowmajor(false, true, n, V, C, 1.0f, xs.data(), C, w, C, 0.0f, logits.data(), V);
    round_bf16_inplace(logits.data(), static_cast<size_t>(n) * V);
    for (int i = 0; i < n; ++i)
      loss += classifier_row(logits.data() + static_cast<size_t>(i) * V, V, targets[rows[first + i]], dloss_scale,
                             backward);
    if (!backward) continue;
    sgemm_rowmajor(false, false, n, C, V, 1.0f, logits.data(), V, w, C, 0.0f, dxs.data(), C);
    round_bf16_inplace(dxs.data(), static_cast<size_t>(n) * C);
    for (int i = 0; i < n; ++i)
      std::copy(dxs.begin() + static_cast<size_t>(i) * C, dxs.begin() + static_cast<size_t>(i + 1) * C,
                dx + static_cast<size_t>(rows[first + i]) * C);
    sgemm_rowmajor(true, false, V, C, n, 1.0f, logits.data(), V, xs.data(), C, 1.0f, dweight, C);
  }
  return loss;
}

}  // namespace kilter::model
