// The model's settings, one line each: the [model] keys of a run's config, the root attributes of
// a checkpoint that record them, and the fields of a Hugging Face config.json that give them. The
// model description (lib/model/spec.h: ModelSpec), the config's options, defaults and "did you
// mean" aliases (lib/core/config.cpp), the checkpoint's attributes (io/checkpoint_attributes.cpp,
// written and read) and the HF mapping (io/export/hf_config.cpp, imported and exported) are all
// generated from this list, so a new setting is one line here (plus, where it has one, its range
// check and the code that uses it).
// It lives in io/ because io writes checkpoints and HF configs and must not include lib/; lib
// includes it (docs/design.md, "Layout").
#pragma once
#include <string>

// X(name, type, default, since, hf_gpt2, hf_llama, aliases, help)
//   name      the INI key ([model] name), the ModelSpec field and the checkpoint's root attribute
//   type      int, double, bool or std::string
//   default   the value a config that omits the key gets
//   since     base: every checkpoint records it and the config hash always counts it;
//             later: added with the architectures, absent in older checkpoints (they read the
//             default) and left out of the config hash at its default, so those runs resume
//   hf_gpt2, hf_llama   the config.json field of GPT2LMHeadModel / the Llama family ("" none);
//             "a|b": b is an older name read too; a leading "!": required; "p.f": field f of the
//             object p (rope_scaling). Numeric settings are read and written from these columns;
//             the text and true/false ones (arch, rope_scaling, tie_embeddings, qkv_bias) are
//             spelled differently by HF and have their own code in hf_config.cpp.
//   aliases   names other trainers give the key (nanoGPT, Megatron-LM, HF), space-separated: the
//             "did you mean" of an unknown key looks them up first
//   help      the option's text in --help
#define KILTER_MODEL_SETTINGS(X)                                                                              \
  X(n_layer, int, 4, base, "!n_layer|num_hidden_layers", "!num_hidden_layers",                               \
    "num_layers n_layers num_hidden_layers", "transformer blocks")                                           \
  X(n_head, int, 4, base, "!n_head|num_attention_heads", "!num_attention_heads", "num_attention_heads n_heads", \
    "attention heads")                                                                                        \
  X(n_embd, int, 256, base, "!n_embd|hidden_size", "!hidden_size", "hidden_size d_model", "channels")         \
  X(block_size, int, 256, base, "!n_positions|max_position_embeddings", "max_position_embeddings",            \
    "seq_len seq_length context_length max_seq_len max_position_embeddings n_positions",                     \
    "context length in tokens; longer documents are cut")                                                    \
  X(vocab_size, int, 0, base, "!vocab_size", "!vocab_size", "", "vocabulary (0: from the dataset index)")     \
  X(arch, std::string, "gpt2", later, "model_type", "model_type", "model_type architecture",                 \
    "gpt2 (learned positions, LayerNorm, GELU, biases, tied head) | llama (RoPE, RMSNorm, SwiGLU, "          \
    "grouped-query attention, no biases: Llama 3, Qwen2, Mistral, SmolLM)")                                   \
  X(n_kv_head, int, 0, later, "n_head|num_attention_heads", "num_key_value_heads", "num_key_value_heads n_kv_heads",             \
    "key/value heads, a divisor of model.n_head (grouped-query attention; llama) (0: n_head)")                \
  X(ffn_hidden, int, 0, later, "n_inner", "!intermediate_size", "intermediate_size ffn_dim n_inner",         \
    "MLP width (0: gpt2 4 x n_embd; llama 8/3 x n_embd rounded up to a multiple of 256)")                    \
  X(rope_theta, double, 10000, later, "", "rope_theta", "rope_base", "llama: RoPE base frequency")            \
  X(rope_scaling, std::string, "none", later, "", "rope_scaling.rope_type", "",                              \
    "llama: none | llama3 (the long-context frequencies of Llama 3.1 and 3.2, with the four keys below)")    \
  X(rope_factor, double, 8, later, "", "rope_scaling.factor", "", "llama3 RoPE scaling: factor")              \
  X(rope_low_freq_factor, double, 1, later, "", "rope_scaling.low_freq_factor", "low_freq_factor",           \
    "llama3 RoPE scaling: low_freq_factor")                                                                   \
  X(rope_high_freq_factor, double, 4, later, "", "rope_scaling.high_freq_factor", "high_freq_factor",        \
    "llama3 RoPE scaling: high_freq_factor")                                                                  \
  X(rope_original_context, int, 8192, later, "", "rope_scaling.original_max_position_embeddings",            \
    "original_max_position_embeddings", "llama3 RoPE scaling: original_max_position_embeddings (tokens)")    \
  X(norm_eps, double, 1e-5, later, "layer_norm_epsilon", "rms_norm_eps",                                      \
    "rms_norm_eps layer_norm_epsilon layer_norm_eps", "epsilon of LayerNorm (gpt2) or RMSNorm (llama)")      \
  X(tie_embeddings, std::string, "auto", later, "tie_word_embeddings", "tie_word_embeddings",                 \
    "tie_word_embeddings", "LM head tied to the token embedding: auto (gpt2 true, llama false) | true | false") \
  X(qkv_bias, bool, false, later, "", "attention_bias", "attention_bias",                                     \
    "llama: biases on the q, k and v projections (Qwen2)")

namespace kilter::io {

// One row of the table, less its type and default (what generic code reads by name).
struct ModelSettingInfo {
  const char* name;
  bool later;  // since = later (see above)
  const char* hf_gpt2;
  const char* hf_llama;
  const char* aliases;
  const char* help;
};

// The fields of the table, declared in a struct that holds the model's settings:
//   struct S { KILTER_MODEL_SETTINGS(KILTER_MODEL_SETTING_FIELD) };
#define KILTER_MODEL_SETTING_FIELD(name, type, default_value, since, hf_gpt2, hf_llama, aliases, help) \
  type name = default_value;

namespace model_setting_since {
constexpr bool base = false, later = true;
}

// Calls f(info, settings.NAME) for every row, in the table's order (the config's key order, the
// checkpoint's attribute order); `settings` is any struct declared with KILTER_MODEL_SETTING_FIELD.
template <class Settings, class F>
void for_each_model_setting(Settings& settings, F&& f) {
#define KILTER_MODEL_SETTING_VISIT(name, type, default_value, since, hf_gpt2, hf_llama, aliases, help) \
  f(ModelSettingInfo{#name, model_setting_since::since, hf_gpt2, hf_llama, aliases, help}, settings.name);
  KILTER_MODEL_SETTINGS(KILTER_MODEL_SETTING_VISIT)
#undef KILTER_MODEL_SETTING_VISIT
}

// Copies every setting from one such struct to another (ModelSpec, CheckpointInfo, HfModelConfig).
template <class From, class To>
void copy_model_settings(const From& from, To& to) {
#define KILTER_MODEL_SETTING_COPY(name, type, default_value, since, hf_gpt2, hf_llama, aliases, help) \
  to.name = static_cast<type>(from.name);
  KILTER_MODEL_SETTINGS(KILTER_MODEL_SETTING_COPY)
#undef KILTER_MODEL_SETTING_COPY
}

// Whether two such structs hold the same value of every setting.
template <class A, class B>
bool same_model_settings(const A& a, const B& b) {
  bool same = true;
#define KILTER_MODEL_SETTING_SAME(name, type, default_value, since, hf_gpt2, hf_llama, aliases, help) \
  same = same && a.name == b.name;
  KILTER_MODEL_SETTINGS(KILTER_MODEL_SETTING_SAME)
#undef KILTER_MODEL_SETTING_SAME
  return same;
}

// The config.json field of a row for a model family, as messages name it: the first name of
// the column, without the "!" mark ("" where HF has none).
inline std::string hf_field_name(const ModelSettingInfo& info, bool llama_family) {
  std::string key = llama_family ? info.hf_llama : info.hf_gpt2;
  if (!key.empty() && key[0] == '!') key.erase(0, 1);
  return key.substr(0, key.find('|'));
}

}  // namespace kilter::io
