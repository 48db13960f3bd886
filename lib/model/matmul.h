// Linear layer as in torch.nn.Linear: weights are [out, in]. GEMMs go through gemm.h (oneDNN),
// in fp32, or with bf16 inputs and fp32 accumulation while a Bf16MatmulScope is alive.
#pragma once
#include <cstddef>

#include "lib/model/gemm.h"

namespace kilter::model {

// out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias (OC); bias may be null.
// keep_inp_bf16 (N*C, may be null; used only under a Bf16MatmulScope): where the forward leaves
// its bf16 rounding of inp, so that the backward can take it (inp_bf16) instead of rounding the
// same activations again. The caller keeps both unchanged in between.
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC,
                    bf16* keep_inp_bf16 = nullptr);

// out (N,OC) = residual (N,OC) + inp @ weight^T + bias: the residual add fused into the GEMM
// (out must not alias inp; it may alias residual).
void matmul_forward_residual(float* out, const float* residual, const float* inp, const float* weight,
                             const float* bias, int N, int C, int OC, bf16* keep_inp_bf16 = nullptr);

// Accumulates (+=): dinp (N,C) += dout @ weight; dweight (OC,C) += dout^T @ inp;
// dbias (OC) += column sums of dout. dout (N,OC). dbias may be null. inp_bf16 (may be null):
// the forward's keep_inp_bf16, read instead of rounding inp under a Bf16MatmulScope.
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC, const bf16* inp_bf16 = nullptr);

// As matmul_backward, but dinp is OVERWRITTEN (saves zeroing a buffer the caller would only
// accumulate into once); dinp may be null when the input needs no gradient.
void matmul_backward_overwrite_dinp(float* dinp, float* dweight, float* dbias, const float* dout,
                                    const float* inp, const float* weight, int N, int C, int OC,
                                    const bf16* inp_bf16 = nullptr);

// train.precision=bf16 on the CPU: while alive, the matmul_* calls of THIS thread multiply bf16
// inputs with fp32 accumulation; outputs and gradients stay fp32 (as torch autocast does).
// Activations and output gradients are rounded to bf16 per call. Weights inside
// [weights, weights + count) are read from `shadow`, their bf16 copy, which the owner refreshes
// after each optimizer step (to_bf16); any other weight is rounded per call. Scopes nest.
class Bf16MatmulScope {
 public:
  Bf16MatmulScope(const float* weights, const bf16* shadow, size_t count);
  ~Bf16MatmulScope();
  Bf16MatmulScope(const Bf16MatmulScope&) = delete;
  Bf16MatmulScope& operator=(const Bf16MatmulScope&) = delete;

 private:
  bool prev_on_;
  const float* prev_weights_;
  const bf16* prev_shadow_;
  size_t prev_count_;
};

}  // namespace kilter::model
