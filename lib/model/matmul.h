// Linear layer as in torch.nn.Linear: weights are [out, in]. GEMMs go through OpenBLAS sgemm.
#pragma once

namespace kilter::model {

// out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias (OC); bias may be null.
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC);

// out (N,OC) = residual (N,OC) + inp @ weight^T + bias: the residual add fused into the GEMM
// (out must not alias inp; it may alias residual).
void matmul_forward_residual(float* out, const float* residual, const float* inp, const float* weight,
                             const float* bias, int N, int C, int OC);

// Accumulates (+=): dinp (N,C) += dout @ weight; dweight (OC,C) += dout^T @ inp;
// dbias (OC) += column sums of dout. dout (N,OC). dbias may be null.
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC);

// As matmul_backward, but dinp is OVERWRITTEN (saves zeroing a buffer the caller would only
// accumulate into once); dinp may be null when the input needs no gradient.
void matmul_backward_overwrite_dinp(float* dinp, float* dweight, float* dbias, const float* dout,
                                    const float* inp, const float* weight, int N, int C, int OC);

}  // namespace kilter::model
