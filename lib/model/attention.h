// Causal multi-head self-attention over a packed micro-batch, scale 1/sqrt(head_dim): each piece
// (cu_seqlens) attends causally over itself only, so the work is proportional to sum(len^2).
// A piece that is a later part of a cut piece has a PREFIX: the s earlier tokens of
// its piece, held by other ranks, whose keys and values its queries also see (query i of the part
// sees keys 0 .. s+i of the whole piece: the bottom-right causal mask). Its work is len * (s+len).
#pragma once
#include <cstddef>
#include <cstdint>

namespace kilter::model {

// The heads of attention and where they sit in a row of the fused q|k|v projection: n_head query
// heads, then n_kv_head key heads, then n_kv_head value heads, head_dim columns each. Query head
// h reads key/value head h / (n_head / n_kv_head) (grouped-query attention; n_kv_head = n_head is
// multi-head attention). A prefix row (kv_exchange.h) holds the key heads, then the value heads.
struct AttentionShape {
  int n_head = 0, n_kv_head = 0, head_dim = 0;
  static AttentionShape mha(int C, int NH) { return {NH, NH, C / NH}; }
  int q_width() const { return n_head * head_dim; }  // the output's width too
  int row_width() const { return (n_head + 2 * n_kv_head) * head_dim; }
  int kv_width() const { return 2 * n_kv_head * head_dim; }
  int group(int h) const { return h / (n_head / n_kv_head); }
  int q_col(int h) const { return h * head_dim; }
  int k_col(int h) const { return q_width() + group(h) * head_dim; }
  int v_col(int h) const { return q_width() + (n_kv_head + group(h)) * head_dim; }
  int prefix_k_col(int h) const { return group(h) * head_dim; }
  int prefix_v_col(int h) const { return (n_kv_head + group(h)) * head_dim; }
};

// The prefixes of a micro-batch's pieces (lib/model/kv_exchange.h delivers them). Default: none.
struct AttentionPrefix {
  const int32_t* offset = nullptr;  // per piece: s, its earlier tokens (0: none); null = all 0
  const float* const* kv = nullptr; // per piece with s > 0: s rows of kv_width floats, k | v, in token order
  float* const* dkv = nullptr;      // backward, per piece with s > 0: s rows of kv_width, dk | dv (+=)
  int of(int piece) const { return offset == nullptr ? 0 : offset[piece]; }
};

// Which pieces a call computes: the CPU backend runs the pieces without a prefix while the
// prefixes of the others are in flight (kv_exchange.h), then those.
enum class AttentionPieces { all, without_prefix, with_prefix };

// Calls f(p, L, s, att_p) for each piece a call for `which` computes: its length L, its prefix s
// and its saved softmax att_p (NH x L x (s+L), after every earlier piece's, computed or not).
template <class Att, class F>
void for_each_piece(const int32_t* cu_seqlens, int pieces, int NH, const AttentionPrefix& prefix,
                    AttentionPieces which, Att* att, F&& f) {
  for (int p = 0; p < pieces; ++p) {
    const int L = cu_seqlens[p + 1] - cu_seqlens[p], s = prefix.of(p);
    if (which == AttentionPieces::all || (which == AttentionPieces::with_prefix) == (s > 0)) f(p, L, s, att);
    att += static_cast<size_t>(NH) * L * (s + L);
  }
}

// Floats of the saved softmax for these pieces: NH * sum(len * (s + len)), s = pos_offset[p]
// (pos_offset may be null: no prefixes).
size_t attention_saved_floats(const int32_t* cu_seqlens, int pieces, int NH, const int32_t* pos_offset = nullptr);

// qkv (N, row_width): q | k | v as AttentionShape places them.
// out (N, q_width), heads concatenated. att (attention_saved_floats) receives the softmax that backward
// needs: piece p's heads follow one another, each a (len, s+len) matrix of which only the causal
// part (key j <= s+i) is meaningful; piece p starts at NH * sum of the earlier pieces'
// len*(s+len), whichever pieces a call computes.
// bf16_inputs (train.precision=bf16): the score and value products take bf16 inputs (q, k, v,
// prefix k and v, and the softmax rounded to bf16) with fp32 accumulation, as torch autocast does;
// the softmax, the saved att and the outputs stay fp32. Needs gemm_has_bf16().
void attention_forward(float* out, float* att, const float* qkv, const int32_t* cu_seqlens, int pieces,
                       const AttentionShape& shape, bool bf16_inputs = false, const AttentionPrefix& prefix = {},
                       AttentionPieces which = AttentionPieces::all);
// Multi-head attention over rows of 3C (n_embd C, NH heads).
inline void attention_forward(float* out, float* att, const float* qkv, const int32_t* cu_seqlens, int pieces, int C,
                              int NH, bool bf16_inputs = false, const AttentionPrefix& prefix = {},
                              AttentionPieces which = AttentionPieces::all) {
  attention_forward(out, att, qkv, cu_seqlens, pieces, AttentionShape::mha(C, NH), bf16_inputs, prefix, which);
}

// Accumulates (+=) into dqkv (N, row_width), and into prefix.dkv the gradient of each prefix's k
// and v (the query heads of a group add into their key/value head, in head order).
// dout (N, q_width); att as saved by attention_forward; prefix as given to it.
// bf16_inputs: the four products take bf16 inputs (dout, q, k, v, att and the score gradient
// rounded to bf16), fp32 accumulation; the softmax backward, dqkv and dkv stay fp32.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att,
                        const int32_t* cu_seqlens, int pieces, const AttentionShape& shape, bool bf16_inputs = false,
                        const AttentionPrefix& prefix = {}, AttentionPieces which = AttentionPieces::all);
inline void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att,
                               const int32_t* cu_seqlens, int pieces, int C, int NH, bool bf16_inputs = false,
                               const AttentionPrefix& prefix = {}, AttentionPieces which = AttentionPieces::all) {
  attention_backward(dqkv, dout, qkv, att, cu_seqlens, pieces, AttentionShape::mha(C, NH), bf16_inputs, prefix, which);
}

}  // namespace kilter::model
