// Rows between the datapaths and the SDPA engine's bf16 rows (attention_sdpa.h): strided fp32 <->
// bf16 conversions and bf16 copies, and the staging of later parts' K/V rows by the plan's staging
// map (from fp32 qkv rows, or from the bf16-storage datapath's bf16 rows).
// No cudnn-frontend here: these build wherever CUDA does. Their CPU twins are the CPU reference
// rounding (lib/model/gemm.h's bf16) and tests/unit/model_sdpa_plan_test.cpp's staging.
#include "io/base/cuda_common.h"
#include "lib/model/attention_sdpa.h"

namespace kilter::model::cuda {

namespace {

using backend::grid_for;

__global__ void rows_to_bf16_kernel(bf16* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows,
                                    int cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    dst[r * dst_ld + c] = __float2bfloat16_rn(src[r * src_ld + c]);
  }
}

__global__ void rows_to_fp32_kernel(float* dst, int64_t dst_ld, const bf16* src, int64_t src_ld, int64_t rows,
                                    int cols, bool accumulate) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    const float value = __bfloat162float(src[r * src_ld + c]);
    float& out = dst[r * dst_ld + c];
    out = accumulate ? out + value : value;
  }
}

}  // namespace

void rows_to_bf16(bf16* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows, int cols,
                  cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  const size_t n = static_cast<size_t>(rows) * cols;
  rows_to_bf16_kernel<<<grid_for(n, 256), 256, 0, stream>>>(dst, dst_ld, src, src_ld, rows, cols);
  KILTER_CUDA_LAUNCH_CHECK();
}

void rows_to_fp32(float* dst, int64_t dst_ld, const bf16* src, int64_t src_ld, int64_t rows, int cols, bool accumulate,
                  cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  const size_t n = static_cast<size_t>(rows) * cols;
  rows_to_fp32_kernel<<<grid_for(n, 256), 256, 0, stream>>>(dst, dst_ld, src, src_ld, rows, cols, accumulate);
  KILTER_CUDA_LAUNCH_CHECK();
}

void rows_copy_bf16(bf16* dst, int64_t dst_ld, const bf16* src, int64_t src_ld, int64_t rows, int cols,
                    cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  KILTER_CUDA_CHECK(cudaMemcpy2DAsync(dst, sizeof(bf16) * dst_ld, src, sizeof(bf16) * src_ld, sizeof(bf16) * cols,
                                      rows, cudaMemcpyDeviceToDevice, stream));
}

namespace {

// Rows of the datapath's qkv (fp32 or bf16) into the engine's bf16 rows, and back: a conversion
// where the datapath is fp32 (its dK/dV rows overwritten), a copy where it is bf16.
void rows_into_staged(bf16* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows, int cols,
                      cudaStream_t stream) {
  rows_to_bf16(dst, dst_ld, src, src_ld, rows, cols, stream);
}
void rows_into_staged(bf16* dst, int64_t dst_ld, const bf16* src, int64_t src_ld, int64_t rows, int cols,
                      cudaStream_t stream) {
  rows_copy_bf16(dst, dst_ld, src, src_ld, rows, cols, stream);
}
void rows_from_staged(float* dst, int64_t dst_ld, const bf16* src, int64_t src_ld, int64_t rows, int cols,
                      cudaStream_t stream) {
  rows_to_fp32(dst, dst_ld, src, src_ld, rows, cols, /*accumulate=*/false, stream);
}
void rows_from_staged(bf16* dst, int64_t dst_ld, const bf16* src, int64_t src_ld, int64_t rows, int cols,
                      cudaStream_t stream) {
  rows_copy_bf16(dst, dst_ld, src, src_ld, rows, cols, stream);
}

template <typename Row>
void stage_keys(const SdpaPlan& plan, const AttentionPrefix& prefix, const Row* qkv, bf16* staged,
                cudaStream_t stream) {
  const AttentionShape& shape = plan.shape;
  const int kv = shape.kv_width();
  for (const SdpaStagedRows& run : plan.staging) {
    bf16* dst = staged + static_cast<int64_t>(run.staged_row) * kv;
    if (run.from_prefix)
      rows_to_bf16(dst, kv, prefix.kv[run.piece] + static_cast<int64_t>(run.source_row) * kv, kv, run.rows, kv, stream);
    else
      rows_into_staged(dst, kv, qkv + static_cast<int64_t>(run.source_row) * shape.row_width() + shape.q_width(),
                       shape.row_width(), run.rows, kv, stream);
  }
}

template <typename Row>
void unstage_key_grads(const SdpaPlan& plan, const AttentionPrefix& prefix, const bf16* staged_grad, Row* dqkv,
                       cudaStream_t stream, SdpaUnstage which) {
  const AttentionShape& shape = plan.shape;
  const int kv = shape.kv_width();
  for (const SdpaStagedRows& run : plan.staging) {
    if (which != SdpaUnstage::all && run.from_prefix != (which == SdpaUnstage::prefix_rows)) continue;
    const bf16* src = staged_grad + static_cast<int64_t>(run.staged_row) * kv;
    if (run.from_prefix)
      rows_to_fp32(prefix.dkv[run.piece] + static_cast<int64_t>(run.source_row) * kv, kv, src, kv, run.rows, kv,
                   /*accumulate=*/true, stream);
    else
      rows_from_staged(dqkv + static_cast<int64_t>(run.source_row) * shape.row_width() + shape.q_width(),
                       shape.row_width(), src, kv, run.rows, kv, stream);
  }
}

}  // namespace

void sdpa_stage_keys(const SdpaPlan& plan, const AttentionPrefix& prefix, const bf16* qkv, bf16* staged,
                     cudaStream_t stream) {
  stage_keys(plan, prefix, qkv, staged, stream);
}

void sdpa_stage_keys(const SdpaPlan& plan, const AttentionPrefix& prefix, const float* qkv, bf16* staged,
                     cudaStream_t stream) {
  stage_keys(plan, prefix, qkv, staged, stream);
}

void sdpa_unstage_key_grads(const SdpaPlan& plan, const AttentionPrefix& prefix, const bf16* staged_grad, bf16* dqkv,
                            cudaStream_t stream, SdpaUnstage which) {
  unstage_key_grads(plan, prefix, staged_grad, dqkv, stream, which);
}

void sdpa_unstage_key_grads(const SdpaPlan& plan, const AttentionPrefix& prefix, const bf16* staged_grad, float* dqkv,
                            cudaStream_t stream, SdpaUnstage which) {
  unstage_key_grads(plan, prefix, staged_grad, dqkv, stream, which);
}

}  // namespace kilter::model::cuda
