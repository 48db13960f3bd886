// The CPU kernels' one entry to a GEMM engine: row-major fp32 GEMM (sgemm), row-major bf16-input
// GEMM with fp32 accumulation and output, the conversion to bf16, the engine's thread count, and
// an optional in-place profile (calls, FLOPs, seconds) so the benchmark can report the GEMM rate
// reached inside a real training step rather than on a synthetic shape.
// Engine: oneDNN when the build found it (KILTER_WITH_ONEDNN: dnnl_sgemm for fp32, the matmul
// primitive cached per shape for bf16), else OpenBLAS (fp32 only).
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>

namespace kilter::model {

// bfloat16 as stored: the high 16 bits of an IEEE fp32.
using bf16 = uint16_t;

// C (M,N) = alpha * op(A) (M,K) @ op(B) (K,N) + beta * C, all row-major; op = transpose when
// the flag is set. lda/ldb/ldc are the row strides of the stored matrices.
void sgemm_rowmajor(bool transpose_a, bool transpose_b, int M, int N, int K, float alpha, const float* A, int lda,
                    const float* B, int ldb, float beta, float* C, int ldc);

// The same with bf16 A and B, products accumulated in fp32, C fp32; bias (N floats, may be null)
// is added to every row of alpha * op(A) @ op(B) before beta * C. Needs gemm_has_bf16(); throws
// kilter::Error otherwise.
void gemm_bf16_rowmajor(bool transpose_a, bool transpose_b, int M, int N, int K, float alpha, const bf16* A,
                        int lda, const bf16* B, int ldb, float beta, float* C, int ldc,
                        const float* bias = nullptr);

// out[i] = in[i] rounded to the nearest bf16 (ties to even; NaN stays NaN).
void to_bf16(bf16* out, const float* in, size_t n);
// The same for a (rows, cols) block: row r of out starts at out + r * ld_out, of in at in + r * ld_in.
void to_bf16_rows(bf16* out, size_t ld_out, const float* in, size_t ld_in, int rows, int cols);
inline float bf16_to_float(bf16 x) {
  const uint32_t bits = static_cast<uint32_t>(x) << 16;
  float f;
  __builtin_memcpy(&f, &bits, sizeof f);
  return f;
}

// True when bf16 GEMMs run on bf16 instructions here (oneDNN with AVX512_BF16 or AMX).
bool gemm_has_bf16();
// One line naming the engine and the ISA it dispatches to, e.g. "oneDNN 2.6.3 avx512_core_bf16".
std::string gemm_engine();

// Threads of this process's GEMMs (oneDNN: OpenMP threads of the calling thread; OpenBLAS: its
// pool). The trainer passes train.threads.
void set_gemm_threads(int threads);
int gemm_threads();

// One GEMM problem as profiled: (bf16 inputs, transpose A, transpose B, M, N, K).
using GemmShape = std::tuple<bool, bool, bool, int, int, int>;

struct GemmProfile {
  int64_t calls = 0;
  double flops = 0.0;    // 2*M*N*K per call
  double seconds = 0.0;  // wall time inside the GEMM engine
  double convert_seconds = 0.0;  // inside to_bf16 (activations per GEMM, weights per step)
  // Per shape: calls and seconds, so a benchmark can time the same shapes standalone.
  std::map<GemmShape, std::pair<int64_t, double>> shapes;
};

// Profiling is off by default (no clock reads). Not thread-safe: for single-threaded callers
// such as bench/cpu_step.
void gemm_profile_enable(bool on);
GemmProfile gemm_profile_take();  // returns the totals so far and resets them

}  // namespace kilter::model
