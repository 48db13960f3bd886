// The CUDA kernels' scratch sizes (the ops of cuda_ops.h take scratch of these sizes) in plain
// C++: the activation arena (lib/backend/cuda_arena_layout.h) carves them, and the memory plan
// (lib/backend/cuda_memory.cpp) counts them on a build without CUDA too.
#pragma once
#include <algorithm>
#include <cstddef>

namespace kilter::model::cuda {

constexpr size_t kGemmWorkspaceBytes = 32u << 20;  // Gemm's cuBLASLt workspace (Hopper kernels like 32 MiB)

namespace scratch_detail {
constexpr int kColumnChunks = 64;  // a deterministic column sum's partial sums per column
constexpr size_t kBf16Bytes = 2;
inline size_t align256(size_t bytes) { return (bytes + 255) / 256 * 256; }
// Rows of an attention group whose fp32 scores fit the budget (at least one).
inline int chunk_rows(int B, int T, int NH, size_t score_budget) {
  const size_t per_row = static_cast<size_t>(NH) * T * T;
  return static_cast<int>(std::max<size_t>(1, std::min<size_t>(B, score_budget / std::max<size_t>(per_row, 1))));
}
}  // namespace scratch_detail

// matmul.cu, norm_kernels.cuh: the column sums' partials.
inline size_t column_sum_scratch_floats(int C) { return static_cast<size_t>(scratch_detail::kColumnChunks) * C; }
inline size_t linear_scratch_floats(int OC) { return column_sum_scratch_floats(OC); }

// attention.cu: q, k, v, y/dy, dq, dk, dv (B*T*C each) + one (B,NH,T,T) score matrix.
inline size_t attention_workspace_floats(int B, int T, int C, int NH) {
  return 7 * static_cast<size_t>(B) * T * C + static_cast<size_t>(B) * NH * T * T;
}
// A later part: q, y/dy, dq (L*C each); k, v, dk, dv ((s+L)*C each); one (NH, L, s+L) score matrix.
inline size_t attention_prefix_workspace_floats(int s, int L, int C, int NH) {
  const size_t Tk = static_cast<size_t>(s) + L;
  return 3 * static_cast<size_t>(L) * C + 4 * Tk * C + static_cast<size_t>(NH) * L * Tk;
}

// attention_bf16.cu: the same slices in bf16 (bytes, each 256-aligned), then one chunk of rows'
// fp32 scores and bf16 dP (a later part: its whole fp32 scores and bf16 dP).
inline size_t attention_bf16_workspace_bytes(int B, int T, int C, int NH, size_t score_budget) {
  using namespace scratch_detail;
  const size_t rows = chunk_rows(B, T, NH, score_budget);
  const size_t scores = rows * NH * T * T;
  return 7 * align256(kBf16Bytes * B * T * C) + align256(sizeof(float) * scores) + align256(kBf16Bytes * scores);
}
inline size_t attention_prefix_bf16_workspace_bytes(int s, int L, int C, int NH) {
  using namespace scratch_detail;
  const size_t Tk = static_cast<size_t>(s) + L;
  return 3 * align256(kBf16Bytes * L * C) + 4 * align256(kBf16Bytes * Tk * C) + align256(sizeof(float) * NH * L * Tk) +
         align256(kBf16Bytes * NH * L * Tk);
}

}  // namespace kilter::model::cuda
