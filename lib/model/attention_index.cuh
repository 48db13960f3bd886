// Index arithmetic shared by the cuBLASLt attention engines (attention.cu on fp32 rows,
// attention_bf16.cu on bf16 rows): where an element of the head-major tensors the batched GEMMs
// run on lives in the token-major q|k|v rows (model::AttentionShape: NH query heads, then NKV key
// heads, then NKV value heads; query head h reads K/V head h / (NH / NKV)), and in a later part's
// prefix rows. Included by .cu files only.
#pragma once
#include <cstddef>

namespace kilter::model::cuda {

// Element i of a head-major (B,NH,T,hd) tensor: its row b, head h, position t and lane d, and
// its index in the token-major layout (B,T,k,NH,hd) with k = 1 (out, dout) or 3 (qkv, dqkv).
struct HeadElement {
  int b, h, t, d;
  __device__ HeadElement(size_t i, int T, int NH, int hd) {
    d = static_cast<int>(i % hd);
    size_t rest = i / hd;
    t = static_cast<int>(rest % T);
    rest /= T;
    h = static_cast<int>(rest % NH);
    b = static_cast<int>(rest / NH);
  }
  __device__ size_t token_major(int T, int NH, int hd, int k) const {
    return (static_cast<size_t>(b) * T + t) * k * NH * hd + static_cast<size_t>(h) * hd + d;
  }
};

// Where query head h's q, k and v sit in a q|k|v row (model::AttentionShape, NKV K/V heads):
// the row's start plus the column of each.
struct QkvColumns {
  size_t row, q, k, v;
  __device__ QkvColumns(const HeadElement& e, int T, int NH, int NKV, int hd) {
    const size_t W = static_cast<size_t>(NH + 2 * NKV) * hd, C = static_cast<size_t>(NH) * hd;
    const int g = e.h / (NH / NKV);
    row = (static_cast<size_t>(e.b) * T + e.t) * W;
    q = static_cast<size_t>(e.h) * hd + e.d;
    k = C + static_cast<size_t>(g) * hd + e.d;
    v = C + static_cast<size_t>(NKV + g) * hd + e.d;
  }
};

// A later part of a cut piece: q (NH,L,hd) from its own rows of qkv (L,W); k and v (NH,s+L,hd):
// rows j < s from the prefix (s,KVW: k | v of the NKV K/V heads), rows j >= s from qkv row j - s,
// each K/V head copied to its query heads. Element i of the (NH, s+L, hd) keys: key row j of query
// head h, where its K/V head's columns are, and q's index (NH,L,hd).
struct PrefixedElement {
  int h, j, d;
  size_t q_col, k_col, v_col, prefix_k_col, prefix_v_col, prefix_row, own_row, q_index;
  bool in_prefix;
  __device__ PrefixedElement(size_t i, int s, int L, int NH, int NKV, int hd) {
    const int Tk = s + L;
    d = static_cast<int>(i % hd);
    j = static_cast<int>((i / hd) % Tk);
    h = static_cast<int>(i / (static_cast<size_t>(hd) * Tk));
    const int g = h / (NH / NKV);
    const size_t C = static_cast<size_t>(NH) * hd, W = static_cast<size_t>(NH + 2 * NKV) * hd;
    const size_t KVW = static_cast<size_t>(2 * NKV) * hd;
    q_col = static_cast<size_t>(h) * hd + d;
    k_col = C + static_cast<size_t>(g) * hd + d;
    v_col = C + static_cast<size_t>(NKV + g) * hd + d;
    prefix_k_col = static_cast<size_t>(g) * hd + d;
    prefix_v_col = static_cast<size_t>(NKV + g) * hd + d;
    in_prefix = j < s;
    prefix_row = static_cast<size_t>(j) * KVW;
    own_row = static_cast<size_t>(j - s) * W;
    q_index = in_prefix ? 0 : (static_cast<size_t>(h) * L + (j - s)) * hd + d;
  }
};

}  // namespace kilter::model::cuda
