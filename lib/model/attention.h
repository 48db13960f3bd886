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
// bf16_inputs (train.precision=bf16): the score and value products take bf16 inputs (q, k, v and
// the softmax rounded to bf16) with fp32 accumulation, as torch autocast does; the softmax, the
// saved att and the outputs stay fp32. Needs gemm_has_bf16().
void attention_forward(float* out, float* att, const float* qkv, const int32_t* cu_seqlens, int pieces, int C,
                       int NH, bool bf16_inputs = false);

// Accumulates (+=) into dqkv (N,3C). dout (N,C); att as saved by attention_forward.
// bf16_inputs: the four products take bf16 inputs (dout, q, k, v, att and the score gradient
// rounded to bf16), fp32 accumulation; the softmax backward and dqkv stay fp32.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att,
                        const int32_t* cu_seqlens, int pieces, int C, int NH, bool bf16_inputs = false);

}  // namespace kilter::model
