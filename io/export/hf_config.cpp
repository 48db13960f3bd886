// Hugging Face config.json read and written (see hf_config.h).
#include "io/export/hf_config.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <type_traits>

#include "io/base/error.h"

namespace kilter::io {

namespace fs = std::filesystem;

namespace {

// One config.json being read: its path (for messages) and its fields.
struct ConfigReader {
  std::string path;
  nlohmann::json json;

  bool has(const char* key) const { return json.contains(key) && !json[key].is_null(); }

  [[noreturn]] void refuse(const std::string& field, const std::string& why) const {
    const std::string value = json.contains(field) ? json[field].dump() : "(absent)";
    KILTER_USER_FAIL(field << " = " << value << " in " << path << " is not supported: " << why);
  }

  int64_t integer_or(const char* key, int64_t fallback) const {
    if (!has(key)) return fallback;
    KILTER_USER_CHECK(json[key].is_number_integer(), path << ": " << key << " = " << json[key].dump() << " is not an integer");
    return json[key].get<int64_t>();
  }
  double number_or(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    KILTER_USER_CHECK(json[key].is_number(), path << ": " << key << " = " << json[key].dump() << " is not a number");
    return json[key].get<double>();
  }
  bool boolean_or(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    KILTER_USER_CHECK(json[key].is_boolean(), path << ": " << key << " = " << json[key].dump() << " is not true or false");
    return json[key].get<bool>();
  }
  std::string text_or(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    return json[key].is_string() ? json[key].get<std::string>() : json[key].dump();
  }
  // A token id: an integer, or the first of a list (Llama 3.1 lists several EOS ids).
  int64_t token_id(const char* key) const {
    if (!has(key)) return -1;
    const nlohmann::json& v = json[key];
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_array() && !v.empty() && v[0].is_number_integer()) return v[0].get<int64_t>();
    return -1;
  }
};

// The numeric settings whose config.json field the table names for this family (io/model_settings.h;
// those in rope_scaling are read_rope_scaling's): an absent field keeps the value `c` holds (the
// family's default), or is refused where the table marks it required.
void read_numeric_settings(const ConfigReader& r, HfModelConfig& c) {
  for_each_model_setting(c, [&](const ModelSettingInfo& key, auto& value) {
    using T = std::decay_t<decltype(value)>;
    if constexpr (std::is_same_v<T, int> || std::is_same_v<T, double>) {
      std::string column = c.llama_family() ? key.hf_llama : key.hf_gpt2;
      if (column.empty() || column.find('.') != std::string::npos) return;
      const bool required = column[0] == '!';
      if (required) column.erase(0, 1);
      std::string found;
      std::istringstream names(column);
      for (std::string name; std::getline(names, name, '|');)
        if (found.empty() && r.has(name.c_str())) found = name;
      const std::string first = column.substr(0, column.find('|'));
      if constexpr (std::is_same_v<T, int>) {
        if (required)
          KILTER_USER_CHECK(!found.empty() && r.json[found].is_number_integer(),
                            r.path << ": no integer field " << first << " (is this a Hugging Face model's config.json?)");
        if (!found.empty()) value = int(r.integer_or(found.c_str(), value));
      } else {
        KILTER_USER_CHECK(!required || !found.empty(), r.path << ": no number field " << first);
        if (!found.empty()) value = r.number_or(found.c_str(), value);
      }
    }
  });
}

// The numeric settings into config.json (the fields read_numeric_settings reads; one already
// written is kept, one in an object that is null is left out).
void write_numeric_settings(const HfModelConfig& c, nlohmann::json& j) {
  for_each_model_setting(c, [&](const ModelSettingInfo& key, const auto& value) {
    using T = std::decay_t<decltype(value)>;
    if constexpr (std::is_same_v<T, int> || std::is_same_v<T, double>) {
      const std::string name = hf_field_name(key, c.llama_family());
      const size_t dot = name.find('.');
      if (name.empty() || (dot == std::string::npos && j.contains(name))) return;
      if (dot == std::string::npos) {
        j[name] = value;
      } else if (j.contains(name.substr(0, dot)) && j[name.substr(0, dot)].is_object()) {
        j[name.substr(0, dot)][name.substr(dot + 1)] = value;
      }
    }
  });
}

// GPT2Config: the fields kilter's GPT-2 reads, and the refusals of what it does not compute.
void read_gpt2_fields(const ConfigReader& r, HfModelConfig& c) {
  if (r.has("activation_function")) {
    const std::string act = r.text_or("activation_function", "");
    if (act != "gelu_new" && act != "gelu_pytorch_tanh")
      r.refuse("activation_function", "kilter's GELU is the tanh approximation (gelu_new)");
  }
  if (!r.boolean_or("scale_attn_weights", true)) r.refuse("scale_attn_weights", "kilter scales attention by 1/sqrt(head_dim)");
  if (r.boolean_or("scale_attn_by_inverse_layer_idx", false))
    r.refuse("scale_attn_by_inverse_layer_idx", "kilter does not scale attention by the layer index");
  read_numeric_settings(r, c);
  c.arch = "gpt2";
  if (c.ffn_hidden == 0) c.ffn_hidden = 4 * c.n_embd;  // n_inner absent or null
  c.tie_embeddings = r.boolean_or("tie_word_embeddings", true) ? "true" : "false";
}

// rope_scaling: null (or rope_type "default") is plain RoPE; llama3 is read with its four fields.
void read_rope_scaling(const ConfigReader& r, HfModelConfig& c) {
  if (!r.has("rope_scaling")) return;
  const nlohmann::json& s = r.json["rope_scaling"];
  KILTER_USER_CHECK(s.is_object(), r.path << ": rope_scaling = " << s.dump() << " is not an object or null");
  const char* type_key = s.contains("rope_type") ? "rope_type" : "type";  // "type": transformers < 4.43
  const std::string type = s.contains(type_key) && s[type_key].is_string() ? s[type_key].get<std::string>() : "";
  if (type == "default") return;
  KILTER_USER_CHECK(type == "llama3", "rope_scaling." << type_key << " = " << (s.contains(type_key) ? s[type_key].dump() : "(absent)")
                                                      << " in " << r.path
                                                      << " is not supported: kilter's RoPE scalings are none (null) and "
                                                         "llama3 (model.rope_scaling)");
  c.rope_scaling = "llama3";
  // Its numbers: the settings whose config.json field lies in rope_scaling (io/model_settings.h).
  for_each_model_setting(c, [&](const ModelSettingInfo& key, auto& value) {
    using T = std::decay_t<decltype(value)>;
    const std::string column = key.hf_llama, prefix = "rope_scaling.";
    if constexpr (std::is_same_v<T, int> || std::is_same_v<T, double>) {
      if (column.compare(0, prefix.size(), prefix) != 0) return;
      const std::string field = column.substr(prefix.size());
      KILTER_USER_CHECK(s.contains(field) && s[field].is_number(),
                        r.path << ": rope_scaling (llama3) has no number " << field);
      if constexpr (std::is_same_v<T, int>) {
        KILTER_USER_CHECK(s[field].is_number_integer(), r.path << ": rope_scaling." << field << " is not an integer");
        value = int(s[field].get<int64_t>());
      } else {
        value = s[field].get<double>();
      }
    }
  });
}

// LlamaConfig, Qwen2Config, MistralConfig: what kilter's llama arch reads, and the refusals.
void read_llama_fields(const ConfigReader& r, HfModelConfig& c) {
  const std::string act = r.text_or("hidden_act", "silu");
  if (act != "silu" && act != "swish") r.refuse("hidden_act", "kilter's llama MLP is SwiGLU (silu)");
  if (r.boolean_or("mlp_bias", false)) r.refuse("mlp_bias", "kilter's llama MLP has no biases");
  const std::map<std::string, int> default_context = {{"llama", 2048}, {"qwen2", 32768}, {"mistral", 131072}};
  c.block_size = default_context.at(c.model_type);  // HF's defaults where the field is absent
  c.norm_eps = 1e-6;
  read_numeric_settings(r, c);
  c.arch = "llama";
  if (c.n_kv_head == 0) c.n_kv_head = c.n_head;  // num_key_value_heads absent: multi-head
  KILTER_USER_CHECK(c.n_head > 0 && c.n_embd % c.n_head == 0,
                    r.path << ": hidden_size = " << c.n_embd << " is not a multiple of num_attention_heads = " << c.n_head);
  if (r.integer_or("head_dim", c.n_embd / c.n_head) != c.n_embd / c.n_head)
    r.refuse("head_dim", "kilter's head size is hidden_size / num_attention_heads = " + std::to_string(c.n_embd / c.n_head));
  read_rope_scaling(r, c);
  c.tie_embeddings = r.boolean_or("tie_word_embeddings", false) ? "true" : "false";
  if (c.model_type == "llama") {
    // Llama's attention_bias puts biases on q, k, v and o: kilter has the first three.
    c.qkv_bias = c.o_proj_bias = r.boolean_or("attention_bias", false);
  } else if (c.model_type == "qwen2") {
    c.qkv_bias = true;  // Qwen2's q/k/v projections always have biases (the config has no key)
    if (r.boolean_or("use_sliding_window", false)) c.sliding_window = r.integer_or("sliding_window", 0);
  } else {
    c.sliding_window = r.integer_or("sliding_window", 0);
  }
}

}  // namespace

std::string read_hf_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  KILTER_USER_CHECK(in, path << ": cannot open");
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

HfModelConfig read_hf_config(const std::string& dir) {
  ConfigReader r;
  r.path = (fs::path(dir) / "config.json").string();
  KILTER_USER_CHECK(fs::exists(r.path), dir << ": no config.json (expected a Hugging Face model directory: config.json "
                                               "+ model.safetensors)");
  try {
    r.json = nlohmann::json::parse(read_hf_text(r.path));
  } catch (const nlohmann::json::exception& e) {
    KILTER_USER_FAIL(r.path << ": not valid JSON (" << e.what() << ")");
  }
  KILTER_USER_CHECK(r.json.is_object(), r.path << ": not a JSON object");
  HfModelConfig c;
  c.model_type = r.text_or("model_type", "gpt2");  // GPT-2 configs of old transformers versions have none
  if (c.model_type != "gpt2" && c.model_type != "llama" && c.model_type != "qwen2" && c.model_type != "mistral")
    r.refuse("model_type", "kilter reads gpt2 (GPT2LMHeadModel) and the Llama family: llama, qwen2, mistral");
  if (c.llama_family()) read_llama_fields(r, c);
  else read_gpt2_fields(r, c);
  c.bos_id = r.token_id("bos_token_id");
  c.eos_id = r.token_id("eos_token_id");
  return c;
}

std::string hf_architecture(const std::string& model_type) {
  if (model_type == "llama") return "LlamaForCausalLM";
  if (model_type == "qwen2") return "Qwen2ForCausalLM";
  if (model_type == "mistral") return "MistralForCausalLM";
  return "GPT2LMHeadModel";
}

nlohmann::json hf_config_json(const HfModelConfig& c, const std::string& dtype) {
  const auto id_or_null = [](int64_t id) { return id >= 0 ? nlohmann::json(id) : nlohmann::json(nullptr); };
  const std::string torch_dtype = dtype == "bf16" ? "bfloat16" : "float32";
  // The fields no setting gives; the settings' own follow from the table (write_numeric_settings).
  if (!c.llama_family()) {
    const nlohmann::json eos = id_or_null(c.eos_id);
    nlohmann::json j = {{"architectures", {hf_architecture(c.model_type)}},
                        {"model_type", "gpt2"},
                        {"n_ctx", c.block_size},
                        {"n_inner", c.ffn_hidden == 4 * c.n_embd ? nlohmann::json(nullptr) : nlohmann::json(c.ffn_hidden)},
                        {"activation_function", "gelu_new"},  // the tanh approximation kilter uses
                        {"resid_pdrop", 0.0},  // kilter trains without dropout
                        {"embd_pdrop", 0.0},
                        {"attn_pdrop", 0.0},
                        {"initializer_range", 0.02},
                        {"scale_attn_weights", true},
                        {"scale_attn_by_inverse_layer_idx", false},
                        {"reorder_and_upcast_attn", false},
                        {"tie_word_embeddings", c.tied()},
                        {"use_cache", true},
                        {"bos_token_id", eos},
                        {"eos_token_id", eos},
                        {"torch_dtype", torch_dtype}};
    write_numeric_settings(c, j);
    return j;
  }
  KILTER_CHECK(c.model_type == "llama" || c.model_type == "qwen2", "hf_config_json: model_type " << c.model_type << " is not written");
  nlohmann::json rope_scaling = nullptr;
  if (c.rope_scaling == "llama3") rope_scaling = {{"rope_type", "llama3"}};  // its numbers: the table's
  nlohmann::json j = {{"architectures", {hf_architecture(c.model_type)}},
                      {"model_type", c.model_type},
                      {"head_dim", c.n_embd / c.n_head},
                      {"hidden_act", "silu"},
                      {"rope_scaling", rope_scaling},
                      {"tie_word_embeddings", c.tied()},
                      {"attention_dropout", 0.0},
                      {"initializer_range", 0.02},
                      {"use_cache", true},
                      {"bos_token_id", id_or_null(c.bos_id)},
                      {"eos_token_id", id_or_null(c.eos_id)},
                      {"torch_dtype", torch_dtype}};
  write_numeric_settings(c, j);
  if (c.model_type == "llama") {
    j["attention_bias"] = false;  // q/k/v biases are written as qwen2 (Llama's would add one to o_proj)
    j["mlp_bias"] = false;
    j["pretraining_tp"] = 1;
  } else {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.n_layer;
  }
  return j;
}

std::string hf_config_field(const HfModelConfig& c, const std::string& key) {
  if (key == "model.qkv_bias" && c.model_type != "llama") return "q/k/v biases (model_type " + c.model_type + ")";
  std::string field = key;
  for_each_model_setting(c, [&](const ModelSettingInfo& setting, const auto&) {
    const std::string name = hf_field_name(setting, c.llama_family());
    if (key == "model." + std::string(setting.name) && !name.empty()) field = name;
  });
  return field;
}

}  // namespace kilter::io
