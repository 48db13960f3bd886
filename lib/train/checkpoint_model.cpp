// ModelSpec <-> a checkpoint's model attributes (checkpoint_model.h).
#include "lib/train/checkpoint_model.h"

namespace kilter::train {

model::ModelSpec spec_of(const io::CheckpointInfo& info) {
  model::ModelSpec spec;
  spec.n_layer = int(info.n_layer);
  spec.n_head = int(info.n_head);
  spec.n_embd = int(info.n_embd);
  spec.block_size = int(info.block_size);
  spec.vocab_size = int(info.vocab_size);
  spec.arch = info.arch;
  spec.n_kv_head = int(info.n_kv_head);
  spec.ffn_hidden = int(info.ffn_hidden);
  spec.rope_theta = info.rope_theta;
  spec.rope_scaling = info.rope_scaling;
  spec.rope_factor = info.rope_factor;
  spec.rope_low_freq_factor = info.rope_low_freq_factor;
  spec.rope_high_freq_factor = info.rope_high_freq_factor;
  spec.rope_original_context = int(info.rope_original_context);
  spec.norm_eps = info.norm_eps;
  spec.tie_embeddings = info.tie_embeddings;
  spec.qkv_bias = info.qkv_bias != 0;
  return spec;
}

void set_model_keys(io::CheckpointInfo& info, const model::ModelSpec& spec) {
  info.n_layer = spec.n_layer;
  info.n_head = spec.n_head;
  info.n_embd = spec.n_embd;
  info.block_size = spec.block_size;
  info.vocab_size = spec.vocab_size;
  info.arch = spec.arch;
  info.n_kv_head = spec.n_kv_head;
  info.ffn_hidden = spec.ffn_hidden;
  info.rope_theta = spec.rope_theta;
  info.rope_scaling = spec.rope_scaling;
  info.rope_factor = spec.rope_factor;
  info.rope_low_freq_factor = spec.rope_low_freq_factor;
  info.rope_high_freq_factor = spec.rope_high_freq_factor;
  info.rope_original_context = spec.rope_original_context;
  info.norm_eps = spec.norm_eps;
  info.tie_embeddings = spec.tie_embeddings;
  info.qkv_bias = spec.qkv_bias ? 1 : 0;
}

}  // namespace kilter::train
