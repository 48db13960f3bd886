// CPU twins of the CUDA backend's bf16-storage kernels (train.precision = bf16 with
// train.bf16_storage; docs/gpu.md, "bf16 storage"). Every activation of that datapath is a bf16
// value; here it is held in an fp32 array (so the plain CPU ops run on it unchanged) and each
// function rounds exactly where its CUDA twin stores bf16, round to nearest even as
// __float2bfloat16_rn does. GEMMs multiply bf16 values with fp32 accumulation: an fp32 GEMM on
// bf16 values is exact in its products (8 + 8 significant bits fit in fp32's 24), so only the
// summation order differs from the device's tensor cores. Weights and biases are the bf16
// working copy (model::bf16, as AdamW writes it on the device); norm weights and the embeddings
// are read in fp32. The CPU backend's oracle of bf16 storage (CpuModel with bf16_storage,
// lib/model/block_ops_cpu.cpp) is composed from these; attention_bf16.h holds attention's.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "lib/model/gemm.h"

namespace kilter::model {

// x rounded to the nearest bf16 (ties to even), as a float; NaN stays NaN.
inline float round_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return x;  // NaN
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  float r;
  std::memcpy(&r, &u, sizeof r);
  return r;
}
void round_bf16_inplace(float* x, size_t n);
// Columns [first, first + count) of `rows` rows `ld` floats apart.
void round_bf16_columns(float* x, int rows, int ld, int first, int count);
// n bf16 values as floats.
void bf16_to_floats(float* out, const bf16* in, size_t n);

// ---- norms (gpt2: LayerNorm with bias; llama: RMSNorm, bias null, mean unused) -------------
struct NormSpec {
  bool rms = false;
  float eps = 1e-5f;
};
// out (N,C) = round(norm(x)); mean/rstd (N) fp32 from the bf16 values of x.
void norm_forward_bf16(float* out, float* mean, float* rstd, const float* x, const float* weight, const float* bias,
                       int N, int C, const NormSpec& norm);
// The fused residual add: residual = round(a + b), then out = round(norm(residual)) (the norm
// of the stored bf16 sum, which its backward reads).
void residual_norm_forward_bf16(float* residual, float* out, float* mean, float* rstd, const float* a,
                                const float* b, const float* weight, const float* bias, int N, int C,
                                const NormSpec& norm);
// dresidual (N,C, fp32) += the norm's input gradient from dout (bf16 values); dresidual_bf16 =
// round(dresidual), the copy the next GEMMs read; dweight, dbias (fp32) +=.
void norm_backward_bf16(float* dresidual, float* dresidual_bf16, float* dweight, float* dbias, const float* dout,
                        const float* x, const float* weight, const float* mean, const float* rstd, int N, int C,
                        const NormSpec& norm);

// ---- Linear layers: h = inp (N,C) @ weight (OC,C)^T + bias (OC), fp32 accumulation ----------
// out = round(h). With pre_gelu (the cuBLASLt GELU_AUX_BIAS epilogue): pre_gelu = round(h) and
// out = round(gelu(h)), the GELU of the unrounded sum. bias may be null.
void linear_forward_bf16(float* out, float* pre_gelu, const float* inp, const bf16* weight, const bf16* bias, int N,
                         int C, int OC);
// dinp (N,C) = round(dout @ weight), or with pre_gelu (the DGELU epilogue) round(gelu'(pre_gelu)
// * (dout @ weight)), OVERWRITTEN (null: not wanted); dweight (OC,C) += dout^T @ inp and dbias
// (OC) += the column sums of dout (BGRADB), both fp32 (dbias may be null).
void linear_backward_bf16(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const bf16* weight, const float* pre_gelu, int N, int C, int OC);

// ---- elementwise -----------------------------------------------------------------------------
void gelu_forward_bf16(float* out, const float* inp, size_t n);        // round(gelu(inp))
// inp (N,2F) gate | up; out (N,F) = round(silu(gate) * up); dinp = round(swiglu'(...)).
void swiglu_forward_bf16(float* out, const float* inp, int N, int F);
void swiglu_backward_bf16(float* dinp, const float* dout, const float* inp, int N, int F);

// ---- the classifier ---------------------------------------------------------------------------
// The LM head over the rows of x (N,C) with a target (targets[i] >= 0): logits = round(x @
// weight^T) (V columns; bf16, as the device keeps them), the summed cross-entropy (fp32 math,
// double sum) returned, and with dx non-null: dlogits = round((softmax - onehot) * dloss_scale),
// dx (N,C) = round(dlogits @ weight) (rows without a target 0) and dweight (V,C) += dlogits^T @ x.
double classifier_bf16(float* dx, float* dweight, const float* x, const bf16* weight, const int32_t* targets, int N,
                       int C, int V, float dloss_scale);

}  // namespace kilter::model
