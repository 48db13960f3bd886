// A typed cuBLASLt product of the bf16 datapath (GemmCall, lib/model/cuda_ops.h), as the Linear
// layers (matmul.cu), the LM head (classifier.cu) and the bf16 attention engine (attention_bf16.cu)
// start one: D (m,n) = op(A) op(B), every other field at its default (bf16 operands and D, alpha
// 1, beta 0, packed, no epilogue) for the caller to change before Gemm::run_typed.
#pragma once
#include "lib/model/cuda_ops.h"

namespace kilter::model::cuda {

inline GemmCall gemm_call(void* D, const void* A, const void* B, int m, int n, int k, bool trans_a = false,
                          bool trans_b = false) {
  GemmCall call;
  call.D = D;
  call.A = A;
  call.B = B;
  call.m = m, call.n = n, call.k = k;
  call.trans_a = trans_a, call.trans_b = trans_b;
  return call;
}

}  // namespace kilter::model::cuda
