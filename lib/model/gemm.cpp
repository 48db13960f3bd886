// sgemm wrapper and its optional profile (see gemm.h).
#include "lib/model/gemm.h"

#include <cblas.h>

#include <chrono>

namespace kilter::model {
namespace {
bool profile_on = false;
GemmProfile profile;
}  // namespace

void sgemm_rowmajor(bool transpose_a, bool transpose_b, int M, int N, int K, float alpha, const float* A, int lda,
                    const float* B, int ldb, float beta, float* C, int ldc) {
  const CBLAS_TRANSPOSE op_a = transpose_a ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE op_b = transpose_b ? CblasTrans : CblasNoTrans;
  if (!profile_on) {
    cblas_sgemm(CblasRowMajor, op_a, op_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  cblas_sgemm(CblasRowMajor, op_a, op_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  profile.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  profile.flops += 2.0 * M * N * K;
  profile.calls += 1;
}

void gemm_profile_enable(bool on) { profile_on = on; }

GemmProfile gemm_profile_take() {
  const GemmProfile taken = profile;
  profile = GemmProfile{};
  return taken;
}

}  // namespace kilter::model
