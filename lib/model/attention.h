// Causal multi-head self-attention over a packed micro-batch, scale 1/sqrt(head_dim): each piece
// (cu_seqlens) attends causally over itself only, so the work is proportional to sum(len^2).
#pragma once
#include <cstddef>
#include <cstdint>

namespace kilter::model {

// Floats of the saved softmax for these pieces: NH * sum(len^2).
size_t attention_saved_floats(const int32_t* cu_seqlens, int pieces, int NH);

// qkv (N,3C): q | k | v, head h at columns [h*hs, (h+1)*hs) of each, hs = C/NH.
// out (N,C), heads concatenated. att (attention_saved_floats) receives the softmax that backward
// needs: piece p's heads follow one another, each a (len,len) matrix of which only the causal
// part (j <= i) is meaningful; piece p starts at NH * sum of the earlier pieces' len^2.
void attention_forward(float* out, float* att, const float* qkv, const int32_t* cu_seqlens, int pieces, int C,
                       int NH);

// Accumulates (+=) into dqkv (N,3C). dout (N,C); att as saved by attention_forward.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att,
                        const int32_t* cu_seqlens, int pieces, int C, int NH);

}  // namespace kilter::model
