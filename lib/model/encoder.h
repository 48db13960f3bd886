// Token + learned position embedding (GPT-2). Positions restart at 0 in every row.
#pragma once
#include <cstdint>

namespace kilter::model {

// out (B,T,C) = wte[inp] + wpe[t]. inp (B,T); wte (V,C); wpe (maxT,C).
// A negative token id (padding) contributes no token embedding: the row is wpe[t] alone.
void encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B, int T, int C);

// dwte[inp] += dout, dwpe[t] += dout for t < lengths[b] only: padded positions add nothing.
// dout (B,T,C); lengths (B).
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp,
                      const int32_t* lengths, int B, int T, int C);

}  // namespace kilter::model
