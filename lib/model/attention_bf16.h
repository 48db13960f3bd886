// CPU twin of the CUDA backend's bf16-storage attention (lib/model/attention_bf16.cu, the
// cuBLASLt engine with bf16 in and out; docs/gpu.md, "bf16 storage"): the same packed pieces,
// prefixes and grouped-query heads as attention.h, with its rounding points. Per query head h
// and its key/value head g:
//   forward:  S = scale q_h k_g^T (fp32), P = causal softmax(S) (fp32), att = round(P) (kept),
//             out_h = round(att v_g);
//   backward: dS = dout_h v_g^T (fp32), dv_h = round(att^T dout_h),
//             dP = round(att (dS - rowsum(att dS)) scale), dq_h = round(dP k_g),
//             dk_h = round(dP^T q_h); the K/V head's gradient is round(sum of its query heads'
//             dk_h, dv_h in head order) in dqkv, and that fp32 sum added (+=) into a prefix's dkv.
// Values are bf16 held in floats (bf16_ops.h). att has attention.h's layout.
#pragma once
#include <cstdint>

#include "lib/model/attention.h"

namespace kilter::model {

// out (N, q_width) of the computed pieces, overwritten; att as attention_forward keeps it.
void attention_bf16_forward(float* out, float* att, const float* qkv, const int32_t* cu_seqlens, int pieces,
                            const AttentionShape& shape, const AttentionPrefix& prefix = {},
                            AttentionPieces which = AttentionPieces::all);
// dqkv (N, row_width): the computed pieces' rows OVERWRITTEN (q, k and v columns); each prefix's
// dkv += its fp32 sums.
void attention_bf16_backward(float* dqkv, const float* dout, const float* qkv, const float* att,
                             const int32_t* cu_seqlens, int pieces, const AttentionShape& shape,
                             const AttentionPrefix& prefix = {}, AttentionPieces which = AttentionPieces::all);

}  // namespace kilter::model
