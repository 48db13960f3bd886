// A Hugging Face model's config.json, both ways (issues 26 and 38): GPT-2 (`GPT2LMHeadModel`) and
// the Llama family (`LlamaForCausalLM`, `Qwen2ForCausalLM`, `MistralForCausalLM`), read into one
// description in kilter's terms (HfModelConfig) and written from it. Reading refuses, naming the
// field, what no kilter model computes (another activation, a RoPE scaling other than llama3, a
// head_dim other than hidden_size / num_attention_heads, MLP biases, ...); whether the
// description matches a run's model.* keys is lib/train's question (hf_interop). Knows JSON only.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "io/model_settings.h"

namespace kilter::io {

// What a config.json describes, in kilter's terms: the model's settings (io/model_settings.h;
// n_kv_head, ffn_hidden and tie_embeddings resolved: never 0 or "auto" once read) and what only HF
// records.
struct HfModelConfig {
  KILTER_MODEL_SETTINGS(KILTER_MODEL_SETTING_FIELD)
  std::string model_type = "gpt2";  // gpt2 | llama | qwen2 | mistral
  bool o_proj_bias = false;  // llama's attention_bias also puts a bias on o_proj (kilter loads zeros only)
  int64_t sliding_window = 0;  // attention window in tokens (mistral, qwen2 with use_sliding_window); 0: none
  int64_t bos_id = -1, eos_id = -1;  // -1: unknown

  bool llama_family() const { return model_type != "gpt2"; }
  bool tied() const { return tie_embeddings == "true"; }  // tie_word_embeddings
};

// Reads DIR/config.json. Refused, naming the file and the field: a model_type other than gpt2,
// llama, qwen2, mistral; a missing or non-integer size; what kilter does not compute (see the top).
HfModelConfig read_hf_config(const std::string& dir);
// A file of a Hugging Face directory (config.json, an index) as text; a user error naming it when
// it cannot be opened.
std::string read_hf_text(const std::string& path);

// The config.json of `config` (model_type gpt2, llama or qwen2), its tensors stored as `dtype`
// (fp32 | bf16).
nlohmann::json hf_config_json(const HfModelConfig& config, const std::string& dtype);

// The transformers class that loads `model_type`: GPT2LMHeadModel, LlamaForCausalLM, ...
std::string hf_architecture(const std::string& model_type);

// The config.json field that gives kilter's `key` (e.g. "model.n_kv_head" -> "num_key_value_heads")
// for `config`'s model_type, as messages name it.
std::string hf_config_field(const HfModelConfig& config, const std::string& key);

}  // namespace kilter::io
