// Linear layer forward/backward on gemm.h (shapes in matmul.h): fp32 sgemm, or bf16 inputs with
// fp32 accumulation under a Bf16MatmulScope. All matrices are row-major; the weight's [out, in]
// layout means the forward multiplies by its transpose.
#include "lib/model/matmul.h"

#include <cstddef>
#include <cstring>
#include <vector>

#include "lib/model/gemm.h"
#include "lib/model/vecmath.h"

namespace kilter::model {
namespace {

// The calling thread's bf16 mode (Bf16MatmulScope).
struct Bf16State {
  bool on = false;
  const float* weights = nullptr;
  const bf16* shadow = nullptr;
  size_t count = 0;
};
thread_local Bf16State bf16_state;

// Per-thread bf16 staging buffers, grown to the largest operand seen.
struct Bf16Scratch {
  std::vector<bf16> a, b, w;
};
thread_local Bf16Scratch scratch;

const bf16* rounded(std::vector<bf16>& buffer, const float* x, size_t n) {
  if (buffer.size() < n) buffer.resize(n);
  to_bf16(buffer.data(), x, n);
  return buffer.data();
}

// The bf16 copy of weight (rows x cols): the scope's shadow when the weight lies in its range.
const bf16* bf16_weight(const float* weight, size_t n) {
  const Bf16State& s = bf16_state;
  if (weight >= s.weights && weight + n <= s.weights + s.count) return s.shadow + (weight - s.weights);
  return rounded(scratch.w, weight, n);
}

KILTER_SIMD_CLONES
void fill_rows_with_bias(float* out, const float* bias, int N, int OC) {
  for (int n = 0; n < N; ++n) std::memcpy(out + static_cast<size_t>(n) * OC, bias, sizeof(float) * OC);
}

KILTER_SIMD_CLONES
void add_rows(float* out, const float* residual, const float* bias, int N, int OC) {
  for (int n = 0; n < N; ++n) {
    float* o = out + static_cast<size_t>(n) * OC;
    const float* r = residual + static_cast<size_t>(n) * OC;
    if (bias)
      for (int c = 0; c < OC; ++c) o[c] = r[c] + bias[c];
    else
      for (int c = 0; c < OC; ++c) o[c] = r[c];
  }
}

KILTER_SIMD_CLONES
void column_sums_accumulate(float* dbias, const float* dout, int N, int OC) {
  for (int n = 0; n < N; ++n) {
    const float* row = dout + static_cast<size_t>(n) * OC;
    for (int c = 0; c < OC; ++c) dbias[c] += row[c];
  }
}

// bf16 mode: out (N,OC) = inp (N,C) @ weight^T + bias + beta * out, the bias added by the GEMM.
// The rounding of inp goes to keep (when given) or to scratch.
void linear_gemm_bf16(float* out, float beta, const float* inp, const float* weight, const float* bias, int N, int C,
                      int OC, bf16* keep) {
  const size_t n = static_cast<size_t>(N) * C;
  if (keep) to_bf16(keep, inp, n);
  const bf16* a = keep ? keep : rounded(scratch.a, inp, n);
  const bf16* w = bf16_weight(weight, static_cast<size_t>(OC) * C);
  gemm_bf16_rowmajor(false, true, N, OC, C, 1.0f, a, C, w, C, beta, out, OC, bias);
}

void matmul_backward_impl(float* dinp, float dinp_beta, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, int N, int C, int OC, const bf16* inp_bf16) {
  if (bf16_state.on) {
    const bf16* d = rounded(scratch.a, dout, static_cast<size_t>(N) * OC);
    if (dinp)
      gemm_bf16_rowmajor(false, false, N, C, OC, 1.0f, d, OC, bf16_weight(weight, static_cast<size_t>(OC) * C), C,
                         dinp_beta, dinp, C);
    const bf16* x = inp_bf16 ? inp_bf16 : rounded(scratch.b, inp, static_cast<size_t>(N) * C);
    gemm_bf16_rowmajor(true, false, OC, C, N, 1.0f, d, OC, x, C, 1.0f, dweight, C);
    if (dbias) column_sums_accumulate(dbias, dout, N, OC);
    return;
  }
  if (dinp)  // dinp (N,C) (+)= dout (N,OC) @ weight (OC,C)
    sgemm_rowmajor(false, false, N, C, OC, 1.0f, dout, OC, weight, C, dinp_beta, dinp, C);
  // dweight (OC,C) += dout^T (OC,N) @ inp (N,C)
  sgemm_rowmajor(true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
  if (dbias) column_sums_accumulate(dbias, dout, N, OC);
}

}  // namespace

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC,
                    bf16* keep_inp_bf16) {
  if (bf16_state.on) {
    linear_gemm_bf16(out, 0.0f, inp, weight, bias, N, C, OC, keep_inp_bf16);
    return;
  }
  float beta = 0.0f;
  if (bias) {
    fill_rows_with_bias(out, bias, N, OC);
    beta = 1.0f;
  }
  sgemm_rowmajor(false, true, N, OC, C, 1.0f, inp, C, weight, C, beta, out, OC);
}

void matmul_forward_residual(float* out, const float* residual, const float* inp, const float* weight,
                             const float* bias, int N, int C, int OC, bf16* keep_inp_bf16) {
  if (bf16_state.on) {
    if (out != residual) add_rows(out, residual, nullptr, N, OC);
    linear_gemm_bf16(out, 1.0f, inp, weight, bias, N, C, OC, keep_inp_bf16);
    return;
  }
  if (out != residual || bias) add_rows(out, residual, bias, N, OC);
  sgemm_rowmajor(false, true, N, OC, C, 1.0f, inp, C, weight, C, 1.0f, out, OC);
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC, const bf16* inp_bf16) {
  matmul_backward_impl(dinp, 1.0f, dweight, dbias, dout, inp, weight, N, C, OC, inp_bf16);
}

void matmul_backward_overwrite_dinp(float* dinp, float* dweight, float* dbias, const float* dout,
                                    const float* inp, const float* weight, int N, int C, int OC,
                                    const bf16* inp_bf16) {
  matmul_backward_impl(dinp, 0.0f, dweight, dbias, dout, inp, weight, N, C, OC, inp_bf16);
}

Bf16MatmulScope::Bf16MatmulScope(const float* weights, const bf16* shadow, size_t count)
    : prev_on_(bf16_state.on),
      prev_weights_(bf16_state.weights),
      prev_shadow_(bf16_state.shadow),
      prev_count_(bf16_state.count) {
  bf16_state = Bf16State{true, weights, shadow, count};
}

Bf16MatmulScope::~Bf16MatmulScope() { bf16_state = Bf16State{prev_on_, prev_weights_, prev_shadow_, prev_count_}; }

}  // namespace kilter::model
