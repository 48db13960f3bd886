// The CPU kernels' one entry to BLAS: row-major sgemm through OpenBLAS, with an optional
// in-place profile (calls, FLOPs, seconds) so the benchmark can report the GEMM rate reached
// inside a real training step rather than on a synthetic shape.
#pragma once
#include <cstdint>

namespace kilter::model {

// C (M,N) = alpha * op(A) (M,K) @ op(B) (K,N) + beta * C, all row-major; op = transpose when
// the flag is set. lda/ldb/ldc are the row strides of the stored matrices.
void sgemm_rowmajor(bool transpose_a, bool transpose_b, int M, int N, int K, float alpha, const float* A, int lda,
                    const float* B, int ldb, float beta, float* C, int ldc);

struct GemmProfile {
  int64_t calls = 0;
  double flops = 0.0;    // 2*M*N*K per call
  double seconds = 0.0;  // wall time inside sgemm
};

// Profiling is off by default (no clock reads). Not thread-safe: for single-threaded callers
// such as bench/cpu_step.
void gemm_profile_enable(bool on);
GemmProfile gemm_profile_take();  // returns the totals so far and resets them

}  // namespace kilter::model
