// Token + learned position embedding (GPT-2) of a packed micro-batch: positions restart at 0 in
// every piece.
#pragma once
#include <cstdint>

namespace kilter::model {

// out (N,C) = wte[inp] + wpe[position], position counted from the start of each piece.
// inp (N); cu_seqlens (pieces+1); wte (V,C); wpe (maxT,C).
void encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, const int32_t* cu_seqlens,
                     int pieces, int C);

// dwte[inp] += dout, dwpe[position] += dout. dout (N,C).
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, const int32_t* cu_seqlens,
                      int pieces, int C);

}  // namespace kilter::model
