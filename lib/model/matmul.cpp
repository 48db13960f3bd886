// Linear layer forward/backward on OpenBLAS sgemm (shapes in matmul.h). All matrices are
// row-major; the weight's [out, in] layout means the forward multiplies by its transpose.
#include "lib/model/matmul.h"

#include <cstddef>
#include <cstring>

#include "lib/model/gemm.h"
#include "lib/model/vecmath.h"

namespace kilter::model {
namespace {

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

void matmul_backward_impl(float* dinp, float dinp_beta, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, int N, int C, int OC) {
  if (dinp)  // dinp (N,C) (+)= dout (N,OC) @ weight (OC,C)
    sgemm_rowmajor(false, false, N, C, OC, 1.0f, dout, OC, weight, C, dinp_beta,
                dinp, C);
  // dweight (OC,C) += dout^T (OC,N) @ inp (N,C)
  sgemm_rowmajor(true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
  if (dbias) column_sums_accumulate(dbias, dout, N, OC);
}

}  // namespace

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC) {
  float beta = 0.0f;
  if (bias) {
    fill_rows_with_bias(out, bias, N, OC);
    beta = 1.0f;
  }
  sgemm_rowmajor(false, true, N, OC, C, 1.0f, inp, C, weight, C, beta, out, OC);
}

void matmul_forward_residual(float* out, const float* residual, const float* inp, const float* weight,
                             const float* bias, int N, int C, int OC) {
  if (out != residual || bias) add_rows(out, residual, bias, N, OC);
  sgemm_rowmajor(false, true, N, OC, C, 1.0f, inp, C, weight, C, 1.0f, out, OC);
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC) {
  matmul_backward_impl(dinp, 1.0f, dweight, dbias, dout, inp, weight, N, C, OC);
}

void matmul_backward_overwrite_dinp(float* dinp, float* dweight, float* dbias, const float* dout,
                                    const float* inp, const float* weight, int N, int C, int OC) {
  matmul_backward_impl(dinp, 0.0f, dweight, dbias, dout, inp, weight, N, C, OC);
}

}  // namespace kilter::model
