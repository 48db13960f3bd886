// Causal multi-head self-attention over a packed micro-batch, scale 1/sqrt(head_dim): each piece
// (cu_seqlens) attends causally over itself only, so the work is proportional to sum(len^2).
// A piece that is a later part of a cut piece (issue 23) has a PREFIX: the s earlier tokens of
// its piece, held by other ranks, whose keys and values its queries also see (query i of the part
// sees keys 0 .. s+i of the whole piece: the bottom-right causal mask). Its work is len * (s+len).
#pragma once
#include <cstddef>
#include <cstdint>

namespace kilter::model {

// The prefixes of a micro-batch's pieces (lib/model/kv_exchange.h delivers them). Default: none.
struct AttentionPrefix {
  const int32_t* offset = nullptr;  // per piece: s, its earlier tokens (0: none); null = all 0
  const float* const* kv = nullptr; // per piece with s > 0: s rows of 2C floats, k | v, in token order
  float* const* dkv = nullptr;      // backward, per piece with s > 0: s rows of 2C, dk | dv (+=)
  int of(int piece) const { return offset == nullptr ? 0 : offset[piece]; }
};

// Which pieces a call computes: the CPU backend runs the pieces without a prefix while the
// prefixes of the others are in flight (kv_exchange.h), then those.
enum class AttentionPieces { all, without_prefix, with_prefix };

// Floats of the saved softmax for these pieces: NH * sum(len * (s + len)), s = pos_offset[p]
// (pos_offset may be null: no prefixes).
size_t attention_saved_floats(const int32_t* cu_seqlens, int pieces, int NH, const int32_t* pos_offset = nullptr);

// qkv (N,3C): q | k | v, head h at columns [h*hs, (h+1)*hs) of each, hs = C/NH.
// out (N,C), heads concatenated. att (attention_saved_floats) receives the softmax that backward
// needs: piece p's heads follow one another, each a (len, s+len) matrix of which only the causal
// part (key j <= s+i) is meaningful; piece p starts at NH * sum of the earlier pieces'
// len*(s+len), whichever pieces a call computes.
// bf16_inputs (train.precision=bf16): the score and value products take bf16 inputs (q, k, v,
// prefix k and v, and the softmax rounded to bf16) with fp32 accumulation, as torch autocast does;
// the softmax, the saved att and the outputs stay fp32. Needs gemm_has_bf16().
void attention_forward(float* out, float* att, const float* qkv, const int32_t* cu_seqlens, int pieces, int C,
                       int NH, bool bf16_inputs = false, const AttentionPrefix& prefix = {},
                       AttentionPieces which = AttentionPieces::all);

// Accumulates (+=) into dqkv (N,3C), and into prefix.dkv the gradient of each prefix's k and v.
// dout (N,C); att as saved by attention_forward; prefix as given to it.
// bf16_inputs: the four products take bf16 inputs (dout, q, k, v, att and the score gradient
// rounded to bf16), fp32 accumulation; the softmax backward, dqkv and dkv stay fp32.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att,
                        const int32_t* cu_seqlens, int pieces, int C, int NH, bool bf16_inputs = false,
                        const AttentionPrefix& prefix = {}, AttentionPieces which = AttentionPieces::all);

}  // namespace kilter::model
