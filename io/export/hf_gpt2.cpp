// Hugging Face GPT-2 directories, written and read (see hf_gpt2.h).
#include "io/export/hf_gpt2.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "io/dataset_output.h"
#include "io/error.h"
#include "io/export/safetensors.h"

namespace kilter::io {

namespace fs = std::filesystem;

namespace {

constexpr const char* kPrefix = "transformer.";

void write_json(const std::string& path, const nlohmann::json& value) {
  std::ofstream out(path);
  out << value.dump(2) << "\n";
  KILTER_CHECK(out.good(), path << ": cannot write");
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  KILTER_CHECK(out.good(), path << ": cannot write");
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  KILTER_CHECK(in, path.string() << ": cannot open");
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

nlohmann::json read_json(const fs::path& path) {
  try {
    return nlohmann::json::parse(read_text(path));
  } catch (const nlohmann::json::exception& e) {
    KILTER_FAIL(path.string() << ": not valid JSON (" << e.what() << ")");
  }
}

// [rows, cols] row-major -> [cols, rows].
std::vector<float> transposed(const float* data, int64_t rows, int64_t cols) {
  std::vector<float> out(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[size_t(c * rows + r)] = data[size_t(r * cols + c)];
  return out;
}

nlohmann::json gpt2_config(const CheckpointInfo& info, const std::string& dtype) {
  nlohmann::json eos = info.eos_id >= 0 ? nlohmann::json(info.eos_id) : nlohmann::json(nullptr);
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", info.vocab_size},
          {"n_positions", info.block_size},
          {"n_ctx", info.block_size},
          {"n_embd", info.n_embd},
          {"n_layer", info.n_layer},
          {"n_head", info.n_head},
          {"n_inner", nullptr},  // 4 x n_embd
          {"activation_function", "gelu_new"},  // the tanh approximation kilter uses
          {"layer_norm_epsilon", 1e-5},
          {"resid_pdrop", 0.0},  // kilter trains without dropout
          {"embd_pdrop", 0.0},
          {"attn_pdrop", 0.0},
          {"initializer_range", 0.02},
          {"scale_attn_weights", true},
          {"scale_attn_by_inverse_layer_idx", false},
          {"reorder_and_upcast_attn", false},
          {"tie_word_embeddings", true},
          {"use_cache", true},
          {"bos_token_id", eos},
          {"eos_token_id", eos},
          {"torch_dtype", dtype == "bf16" ? "bfloat16" : "float32"}};
}

// Refuses a config.json field whose value kilter's GPT-2 does not compute.
template <typename T>
void require_field(const nlohmann::json& config, const std::string& path, const char* key, const T& expected,
                   const std::string& why) {
  if (!config.contains(key) || config[key].is_null()) return;
  bool same = false;
  try {
    same = config[key].get<T>() == expected;
  } catch (const nlohmann::json::exception&) {
  }
  KILTER_CHECK(same, path << ": " << key << " = " << config[key].dump() << " is not supported: " << why);
}

int64_t get_int(const nlohmann::json& config, const std::string& path, const char* key, const char* alt = nullptr) {
  const char* found = config.contains(key) ? key : (alt && config.contains(alt) ? alt : nullptr);
  KILTER_CHECK(found && config[found].is_number_integer(), path << ": no integer field " << key);
  return config[found].get<int64_t>();
}

}  // namespace

bool hf_is_conv1d(const std::string& name) {
  for (const char* suffix : {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"}) {
    const std::string s = suffix;
    if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) return true;
  }
  return false;
}

std::vector<std::string> write_hf_gpt2(const std::string& out, const CheckpointInfo& info,
                                       const std::vector<CheckpointTensor>& tensors, const float* params,
                                       const HfExportOptions& options) {
  KILTER_CHECK(options.dtype == "fp32" || options.dtype == "bf16",
               "--dtype " << options.dtype << ": expected fp32 | bf16");
  AtomicDirectory dir(out, options.force);
  std::vector<std::string> written;

  // Conv1D weights get a transposed copy; the others are written from `params` as they are.
  std::vector<std::vector<float>> copies;
  copies.reserve(tensors.size());
  std::vector<SafetensorsTensor> entries;
  for (const CheckpointTensor& t : tensors) {
    SafetensorsTensor e{t.name, t.shape, params + t.offset};
    if (hf_is_conv1d(t.name)) {
      KILTER_CHECK(t.shape.size() == 2, "tensor " << t.name << " is not 2-D");
      copies.push_back(transposed(params + t.offset, t.shape[0], t.shape[1]));
      e.shape = {t.shape[1], t.shape[0]};
      e.data = copies.back().data();
    }
    entries.push_back(e);
  }
  std::map<std::string, std::string> metadata = options.metadata;
  metadata["format"] = "pt";  // what transformers expects of a torch model file
  write_safetensors(dir.file("model.safetensors"), entries, options.dtype == "bf16" ? "BF16" : "F32", metadata);
  written.push_back("model.safetensors");

  write_json(dir.file("config.json"), gpt2_config(info, options.dtype));
  written.push_back("config.json");
  nlohmann::json generation = {{"_from_model_config", true}};
  if (info.eos_id >= 0) generation["bos_token_id"] = generation["eos_token_id"] = info.eos_id;
  write_json(dir.file("generation_config.json"), generation);
  written.push_back("generation_config.json");

  if (info.tokenizer == "hf-bpe" && !info.tokenizer_data.empty()) {
    write_bytes(dir.file("tokenizer.json"), info.tokenizer_data);
    write_json(dir.file("tokenizer_config.json"), {{"tokenizer_class", "PreTrainedTokenizerFast"},
                                                   {"model_max_length", info.block_size},
                                                   {"clean_up_tokenization_spaces", false}});
    written.push_back("tokenizer.json");
    written.push_back("tokenizer_config.json");
  } else if (info.tokenizer == "sentencepiece" && !info.tokenizer_data.empty()) {
    write_bytes(dir.file("tokenizer.model"), info.tokenizer_data);
    written.push_back("tokenizer.model");
  }
  dir.commit();
  return written;
}

bool is_hf_model_dir(const std::string& dir) {
  std::error_code ec;
  const fs::path d(dir);
  return fs::is_directory(d, ec) && fs::exists(d / "config.json", ec) &&
         (fs::exists(d / "model.safetensors", ec) || fs::exists(d / "model.safetensors.index.json", ec));
}

HfGpt2 read_hf_gpt2(const std::string& dir) {
  HfGpt2 model;
  model.dir = dir;
  const fs::path root(dir);
  const std::string config_path = (root / "config.json").string();
  KILTER_CHECK(fs::exists(config_path), dir << ": no config.json (expected a Hugging Face GPT-2 directory: config.json "
                                               "+ model.safetensors)");
  const nlohmann::json config = read_json(config_path);
  KILTER_CHECK(config.is_object(), config_path << ": not a JSON object");
  require_field<std::string>(config, config_path, "model_type", "gpt2", "kilter trains GPT-2 models");
  if (config.contains("activation_function") && !config["activation_function"].is_null()) {
    const std::string act = config["activation_function"].is_string() ? config["activation_function"].get<std::string>() : "";
    KILTER_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh",
                 config_path << ": activation_function = " << config["activation_function"].dump()
                             << " is not supported: kilter's GELU is the tanh approximation (gelu_new)");
  }
  require_field<bool>(config, config_path, "tie_word_embeddings", true, "kilter's LM head is the token embedding");
  require_field<bool>(config, config_path, "scale_attn_weights", true, "kilter scales attention by 1/sqrt(head_dim)");
  require_field<bool>(config, config_path, "scale_attn_by_inverse_layer_idx", false,
                      "kilter does not scale attention by the layer index");
  if (config.contains("layer_norm_epsilon") && config["layer_norm_epsilon"].is_number()) {
    const double eps = config["layer_norm_epsilon"].get<double>();
    KILTER_CHECK(std::abs(eps - 1e-5) <= 1e-12, config_path << ": layer_norm_epsilon = " << eps
                                                            << " is not supported: kilter's LayerNorm eps is 1e-5");
  }
  model.shape.n_layer = get_int(config, config_path, "n_layer", "num_hidden_layers");
  model.shape.n_head = get_int(config, config_path, "n_head", "num_attention_heads");
  model.shape.n_embd = get_int(config, config_path, "n_embd", "hidden_size");
  model.shape.block_size = get_int(config, config_path, "n_positions", "max_position_embeddings");
  model.shape.vocab_size = get_int(config, config_path, "vocab_size");
  if (config.contains("n_inner") && !config["n_inner"].is_null()) {
    KILTER_CHECK(config["n_inner"].is_number_integer() && config["n_inner"].get<int64_t>() == 4 * model.shape.n_embd,
                 config_path << ": n_inner = " << config["n_inner"].dump() << " is not supported: kilter's MLP is 4 x n_embd = "
                             << 4 * model.shape.n_embd);
  }
  if (config.contains("eos_token_id") && config["eos_token_id"].is_number_integer())
    model.eos_id = config["eos_token_id"].get<int64_t>();

  // The weight files: one model.safetensors, or the shards an index lists.
  std::vector<fs::path> files;
  if (fs::exists(root / "model.safetensors")) {
    files.push_back(root / "model.safetensors");
  } else {
    const fs::path index_path = root / "model.safetensors.index.json";
    KILTER_CHECK(fs::exists(index_path), dir << ": no model.safetensors (kilter reads safetensors weights; convert a "
                                                "pytorch_model.bin with transformers' save_pretrained(safe_serialization=True))");
    const nlohmann::json index = read_json(index_path);
    KILTER_CHECK(index.contains("weight_map") && index["weight_map"].is_object(), index_path.string() << ": no weight_map");
    std::set<std::string> names;
    for (const auto& [tensor, file] : index["weight_map"].items()) {
      KILTER_CHECK(file.is_string(), index_path.string() << ": weight_map[" << tensor << "] is not a file name");
      names.insert(file.get<std::string>());
    }
    for (const std::string& name : names) {
      KILTER_CHECK(fs::path(name).filename() == name, index_path.string() << ": shard " << name << " is not a file name in " << dir);
      files.push_back(root / name);
    }
  }

  std::vector<float> lm_head;
  std::vector<int64_t> lm_head_shape;
  for (const fs::path& file : files) {
    for (auto& [stored, tensor] : read_safetensors(file.string())) {
      std::string name = stored.rfind(kPrefix, 0) == 0 ? stored : kPrefix + stored;
      if (stored == "lm_head.weight") {
        lm_head = std::move(tensor.values);
        lm_head_shape = tensor.shape;
        continue;
      }
      // The causal-mask buffers older transformers versions saved: not weights.
      const auto ends_with = [&](const std::string& s) {
        return name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
      };
      if (ends_with(".attn.bias") || ends_with(".attn.masked_bias")) continue;
      KILTER_CHECK(!model.values.count(name), file.string() << ": tensor " << stored << " appears twice");
      if (hf_is_conv1d(name)) {
        KILTER_CHECK(tensor.shape.size() == 2, file.string() << ": tensor " << stored << " is not 2-D");
        model.values[name] = transposed(tensor.values.data(), tensor.shape[0], tensor.shape[1]);
        model.shapes[name] = {tensor.shape[1], tensor.shape[0]};
      } else {
        model.values[name] = std::move(tensor.values);
        model.shapes[name] = tensor.shape;
      }
    }
  }
  if (!lm_head.empty()) {
    const auto wte = model.values.find("transformer.wte.weight");
    KILTER_CHECK(wte != model.values.end() && wte->second == lm_head,
                 dir << ": lm_head.weight differs from transformer.wte.weight: kilter's LM head is tied to the token "
                        "embedding, so an untied head cannot be loaded");
  }
  if (fs::exists(root / "tokenizer.json")) model.tokenizer_json = read_text(root / "tokenizer.json");
  return model;
}

}  // namespace kilter::io
