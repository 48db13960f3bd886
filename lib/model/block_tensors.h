// Pointers to one transformer block's tensors inside a flat buffer (parameters or gradients),
// in ParamLayout's nanoGPT order, and to its saved activations. Shared by every backend, so the
// order is written once.
#pragma once
#include <cstddef>

namespace kilter::model {

struct BlockTensors {
  float *ln1_w, *ln1_b, *qkv_w, *qkv_b, *attproj_w, *attproj_b;
  float *ln2_w, *ln2_b, *fc_w, *fc_b, *fcproj_w, *fcproj_b;
};

// Saved activations of one block for a (B,T) micro-batch (host or device pointers).
struct BlockActivations {
  float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *residual2;
  float *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu, *residual3;
};

// `block` points at the block's first tensor (ln_1.weight); C = n_embd.
inline BlockTensors block_tensors_at(float* block, size_t C) {
  float* p = block;
  BlockTensors t;
  t.ln1_w = p;      p += C;
  t.ln1_b = p;      p += C;
  t.qkv_w = p;      p += 3 * C * C;
  t.qkv_b = p;      p += 3 * C;
  t.attproj_w = p;  p += C * C;
  t.attproj_b = p;  p += C;
  t.ln2_w = p;      p += C;
  t.ln2_b = p;      p += C;
  t.fc_w = p;       p += 4 * C * C;
  t.fc_b = p;       p += 4 * C;
  t.fcproj_w = p;   p += 4 * C * C;
  t.fcproj_b = p;
  return t;
}

}  // namespace kilter::model
