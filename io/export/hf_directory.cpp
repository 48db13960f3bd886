// Hugging Face model directories, written and read tensor by tensor (see hf_directory.h).
#include "io/export/hf_directory.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "io/dataset_output.h"
#include "io/base/error.h"
#include "io/export/hf_gpt2.h"
#include "io/text_format.h"

namespace kilter::io {

namespace fs = std::filesystem;

namespace {

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

bool ends_with(const std::string& name, const std::string& suffix) {
  return name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// [rows, cols] row-major -> [cols, rows].
void transpose_into(float* out, const float* in, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[size_t(c * rows + r)] = in[size_t(r * cols + c)];
}

// The weight files: one model.safetensors, or the shards an index lists.
std::vector<fs::path> weight_files(const std::string& dir) {
  const fs::path root(dir);
  if (fs::exists(root / "model.safetensors")) return {root / "model.safetensors"};
  const fs::path index_path = root / "model.safetensors.index.json";
  KILTER_USER_CHECK(fs::exists(index_path), dir << ": no model.safetensors (kilter reads safetensors weights; convert a "
                                                   "pytorch_model.bin with transformers' save_pretrained(safe_serialization=True))");
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(read_hf_text(index_path));
  } catch (const nlohmann::json::exception& e) {
    KILTER_USER_FAIL(index_path.string() << ": not valid JSON (" << e.what() << ")");
  }
  KILTER_USER_CHECK(index.contains("weight_map") && index["weight_map"].is_object(), index_path.string() << ": no weight_map");
  std::set<std::string> names;
  for (const auto& [tensor, file] : index["weight_map"].items()) {
    KILTER_USER_CHECK(file.is_string(), index_path.string() << ": weight_map[" << tensor << "] is not a file name");
    names.insert(file.get<std::string>());
  }
  std::vector<fs::path> files;
  for (const std::string& name : names) {
    KILTER_USER_CHECK(fs::path(name).filename() == name,
                      index_path.string() << ": shard " << name << " is not a file name in " << dir);
    files.push_back(root / name);
  }
  return files;
}

// kilter's name for a tensor stored as `stored`, "" for a buffer that is not a weight.
std::string kilter_name_of(const HfModelConfig& config, const std::string& stored) {
  if (stored == "lm_head.weight") return stored;
  if (!config.llama_family()) {
    const std::string name = stored.rfind("transformer.", 0) == 0 ? stored : "transformer." + stored;
    // The causal-mask buffers older transformers versions saved.
    return ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias") ? "" : name;
  }
  if (ends_with(stored, ".rotary_emb.inv_freq")) return "";  // a buffer older versions saved
  // A base model's file (LlamaModel.save_pretrained) has no `model.` prefix.
  return stored.rfind("model.", 0) == 0 ? stored : "model." + stored;
}

void write_tokenizer_files(const AtomicDirectory& dir, const std::string& kind, const std::string& data,
                           int64_t context, std::vector<std::string>& written) {
  if (data.empty()) return;
  if (kind == "hf-bpe") {
    write_bytes(dir.file("tokenizer.json"), data);
    write_json(dir.file("tokenizer_config.json"), {{"tokenizer_class", "PreTrainedTokenizerFast"},
                                                   {"model_max_length", context},
                                                   {"clean_up_tokenization_spaces", false}});
    written.push_back("tokenizer.json");
    written.push_back("tokenizer_config.json");
  } else if (kind == "sentencepiece") {
    write_bytes(dir.file("tokenizer.model"), data);
    written.push_back("tokenizer.model");
  }
}

}  // namespace

bool is_hf_model_dir(const std::string& dir) {
  std::error_code ec;
  const fs::path d(dir);
  return fs::is_directory(d, ec) && fs::exists(d / "config.json", ec) &&
         (fs::exists(d / "model.safetensors", ec) || fs::exists(d / "model.safetensors.index.json", ec));
}

std::vector<std::string> write_hf_directory(const std::string& out, const HfModelConfig& config,
                                            const std::string& tokenizer, const std::string& tokenizer_data,
                                            const std::vector<CheckpointTensor>& tensors, const float* params,
                                            const HfExportOptions& options) {
  KILTER_USER_CHECK(options.dtype == "fp32" || options.dtype == "bf16",
                    "--dtype " << options.dtype << ": expected fp32 | bf16");
  AtomicDirectory dir(out, options.force);
  std::vector<std::string> written;

  std::vector<SafetensorsTensor> entries;
  for (const CheckpointTensor& t : tensors) {
    SafetensorsTensor e{t.name, t.shape, params + t.offset, {}};
    if (!config.llama_family() && hf_is_conv1d(t.name)) {
      KILTER_CHECK(t.shape.size() == 2, "tensor " << t.name << " is not 2-D");
      const float* source = params + t.offset;
      const int64_t rows = t.shape[0], cols = t.shape[1];
      e.shape = {cols, rows};
      e.data = nullptr;
      e.fill = [source, rows, cols](float* dst) { transpose_into(dst, source, rows, cols); };
    }
    entries.push_back(std::move(e));
  }
  std::map<std::string, std::string> metadata = options.metadata;
  metadata["format"] = "pt";  // what transformers expects of a torch model file
  write_safetensors(dir.file("model.safetensors"), entries, options.dtype == "bf16" ? "BF16" : "F32", metadata);
  written.push_back("model.safetensors");

  write_json(dir.file("config.json"), hf_config_json(config, options.dtype));
  written.push_back("config.json");
  nlohmann::json generation = {{"_from_model_config", true}};
  if (config.bos_id >= 0) generation["bos_token_id"] = config.bos_id;
  if (config.eos_id >= 0) generation["eos_token_id"] = config.eos_id;
  write_json(dir.file("generation_config.json"), generation);
  written.push_back("generation_config.json");

  write_tokenizer_files(dir, tokenizer, tokenizer_data, config.block_size, written);
  dir.commit();
  return written;
}

HfModelDir::HfModelDir(const std::string& dir) : dir_(dir), config_(read_hf_config(dir)) {
  for (const fs::path& path : weight_files(dir)) {
    files_.push_back(std::make_unique<SafetensorsFile>(path.string()));
    for (const auto& [stored, entry] : files_.back()->entries()) {
      const std::string name = kilter_name_of(config_, stored);
      if (name.empty()) continue;
      KILTER_USER_CHECK(!places_.count(name), path.string() << ": tensor " << stored << " appears twice in " << dir);
      Place place{files_.size() - 1, stored, !config_.llama_family() && hf_is_conv1d(name)};
      std::vector<int64_t> shape = entry.shape;
      if (place.transposed) {
        KILTER_USER_CHECK(shape.size() == 2, path.string() << ": tensor " << stored << " is not 2-D");
        shape = {shape[1], shape[0]};
      }
      places_.emplace(name, std::move(place));
      shapes_.emplace(name, std::move(shape));
    }
  }
  KILTER_USER_CHECK(config_.tied() || places_.count("lm_head.weight"),
                    dir << ": tie_word_embeddings = false in " << config_path()
                        << " but the weights have no lm_head.weight (an untied model stores its LM head)");
}

std::string HfModelDir::config_path() const { return (fs::path(dir_) / "config.json").string(); }

void HfModelDir::read(const std::string& name, float* out) const {
  const auto found = places_.find(name);
  KILTER_CHECK(found != places_.end(), dir_ << ": no tensor " << name);
  const Place& place = found->second;
  const SafetensorsFile& file = *files_[place.file];
  if (!place.transposed) {
    file.read(place.stored, out);
    return;
  }
  const std::vector<int64_t>& stored_shape = file.entries().at(place.stored).shape;
  std::vector<float> stored(size_t(stored_shape[0] * stored_shape[1]));
  file.read(place.stored, stored.data());
  transpose_into(out, stored.data(), stored_shape[0], stored_shape[1]);
}

const std::string& HfModelDir::dtype(const std::string& name) const {
  const Place& place = places_.at(name);
  return files_[place.file]->entries().at(place.stored).dtype;
}

std::string HfModelDir::tokenizer_json() const {
  const fs::path path = fs::path(dir_) / "tokenizer.json";
  return fs::exists(path) ? read_hf_text(path) : std::string();
}

}  // namespace kilter::io
