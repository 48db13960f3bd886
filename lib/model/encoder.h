// Token + learned position embedding (GPT-2) of a packed micro-batch: positions restart at 0 in
// every piece, or continue from the piece's offset when it is a later part of a cut piece. Without
// a position table (wpe null: the Llama family, whose positions RoPE gives) only the tokens'.
#pragma once
#include <cstdint>

namespace kilter::model {

// out (N,C) = wte[inp] + wpe[position]: position = pos_offset[p] + (row - cu_seqlens[p]) in
// piece p. inp (N); cu_seqlens (pieces+1); pos_offset (pieces) or null (all 0); wte (V,C);
// wpe (maxT,C) or null.
void encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, const int32_t* cu_seqlens,
                     int pieces, int C, const int32_t* pos_offset = nullptr);

// The same from the bf16 working copy of wte and wpe (their bits, as lib/model/gemm.h's bf16),
// summed in fp32: the distributed optimizer's bf16 storage, whose fp32 master is sharded.
void encoder_forward_bf16(float* out, const int32_t* inp, const uint16_t* wte, const uint16_t* wpe,
                          const int32_t* cu_seqlens, int pieces, int C, const int32_t* pos_offset = nullptr);

// dwte[inp] += dout, dwpe[position] += dout (dwpe null: none). dout (N,C).
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, const int32_t* cu_seqlens,
                      int pieces, int C, const int32_t* pos_offset = nullptr);

}  // namespace kilter::model
