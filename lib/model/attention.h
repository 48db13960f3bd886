// Causal multi-head self-attention over variable-length rows, scale 1/sqrt(head_dim).
#pragma once
#include <cstdint>

namespace kilter::model {

// qkv (B,T,3C): q | k | v, head h at columns [h*hs, (h+1)*hs) of each, hs = C/NH.
// out (B,T,C), heads concatenated. att (B,NH,T,T) receives the softmax that backward needs;
// only its causal, in-length part (i < lengths[b], j <= i) is meaningful. Row b attends over its
// first lengths[b] positions only; rows t >= lengths[b] of out are 0.
void attention_forward(float* out, float* att, const float* qkv, const int32_t* lengths, int B, int T, int C,
                       int NH);

// Accumulates (+=) into dqkv (B,T,3C). dout (B,T,C); att as saved by attention_forward.
// Padded rows contribute nothing.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att,
                        const int32_t* lengths, int B, int T, int C, int NH);

}  // namespace kilter::model
