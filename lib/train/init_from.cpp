// train.init_from: a source's weights read into a run's layout, one tensor at a time, after its
// architecture keys are checked against the run's (see hf_interop.h).
#include <algorithm>
#include <charconv>
#include <functional>
#include <map>
#include <memory>
#include <tuple>

#include "io/checkpoint.h"
#include "io/base/error.h"
#include "io/text_format.h"
#include "lib/train/checkpoint_model.h"
#include "lib/train/checkpointer.h"
#include "lib/train/hf_interop.h"

namespace kilter::train {

namespace {

// A source of weights described in kilter's terms, read tensor by tensor.
struct WeightSource {
  std::string kind;         // "Hugging Face Llama directory" | "kilter checkpoint" | ...
  std::string detail;       // what the note names: the directory, or "step N of FILE"
  std::string fields_file;  // where its architecture keys are written (config.json, the checkpoint)
  model::ModelSpec spec;
  std::function<std::string(const std::string& key)> field;  // the source's name for a model.* key
  std::map<std::string, std::vector<int64_t>> shapes;        // kilter name -> torch shape
  std::function<void(const std::string& name, float* out)> read;
  // A kilter checkpoint whose tensors are the run's: every tensor read at once, in place.
  std::function<void(const model::ParamLayout& layout, float* params)> read_whole;
  std::string tokenizer;       // kind ("" unknown)
  std::string tokenizer_data;  // file bytes ("" unknown or none)
  int64_t sliding_window = 0;  // HF: the attention window (0: none)
  std::string arch_value;      // what the source calls its architecture (model_type, or model.arch)
};

std::string hf_kind(const io::HfModelConfig& c) {
  if (c.model_type == "llama") return "Hugging Face Llama directory";
  if (c.model_type == "qwen2") return "Hugging Face Qwen2 directory";
  if (c.model_type == "mistral") return "Hugging Face Mistral directory";
  return "Hugging Face GPT-2 directory";
}

WeightSource hf_source(const std::string& dir) {
  auto hf = std::make_shared<io::HfModelDir>(dir);
  WeightSource w;
  const io::HfModelConfig config = hf->config();
  w.kind = hf_kind(config);
  w.detail = dir;
  w.fields_file = hf->config_path();
  w.spec = spec_of_hf(config);
  w.field = [config](const std::string& key) { return io::hf_config_field(config, key); };
  w.shapes = hf->shapes();
  w.read = [hf](const std::string& name, float* out) { hf->read(name, out); };
  w.tokenizer_data = hf->tokenizer_json();
  if (!w.tokenizer_data.empty()) w.tokenizer = "hf-bpe";
  w.sliding_window = config.sliding_window;
  w.arch_value = config.model_type;
  return w;
}

std::vector<io::CheckpointTensor> io_tensors(const model::ParamLayout& layout) {
  std::vector<io::CheckpointTensor> tensors;
  for (const auto& t : layout.tensors) tensors.push_back({t.name, t.shape, t.offset, t.size});
  return tensors;
}

WeightSource checkpoint_source(const std::string& source) {
  const std::string path = Checkpointer::latest(source);
  const io::CheckpointInfo info = io::read_checkpoint_info(path);
  WeightSource w;
  w.kind = "kilter checkpoint";
  w.detail = "step " + std::to_string(info.step) + " of " + path;
  w.fields_file = path;
  w.spec = spec_of(info);
  w.field = [](const std::string& key) { return key; };
  w.arch_value = w.spec.arch;
  const model::ParamLayout layout = model::ParamLayout::build(w.spec);
  for (const auto& t : layout.tensors) w.shapes[t.name] = t.shape;
  w.read_whole = [path](const model::ParamLayout& run_layout, float* params) {
    io::read_checkpoint_params(path, io_tensors(run_layout), params);
  };
  // Tensor by tensor (a resized vocabulary): the file's /params group is read whole, once.
  auto whole = std::make_shared<CheckpointWeights>();
  w.read = [whole, source](const std::string& name, float* out) {
    if (whole->path.empty()) *whole = read_checkpoint_weights(source);
    const model::ParamTensor& t = whole->layout.find(name);
    std::copy_n(whole->params.begin() + long(t.offset), t.size, out);
  };
  w.tokenizer = info.tokenizer;
  w.tokenizer_data = info.tokenizer_data;
  return w;
}

WeightSource read_source(const std::string& source) {
  if (io::is_hf_model_dir(source)) return hf_source(source);
  KILTER_USER_CHECK(!Checkpointer::latest(source).empty(),
                    "train.init_from = " << source << ": neither a Hugging Face GPT-2 directory nor a Llama, Qwen2 "
                    "or Mistral one (config.json + model.safetensors), nor a kilter checkpoint (a step-*.h5 file, "
                    "or a run directory holding checkpoints): give one of those");
  return checkpoint_source(source);
}

// A value as config.ini writes it: the shortest text that reads back exactly, in plain decimals
// when that stays short (500000, 0.000001), else the shortest form (1e-08).
std::string text_of(double value) {
  char text[400];
  const auto fixed = std::to_chars(text, text + sizeof text, value, std::chars_format::fixed);
  if (fixed.ec == std::errc() && fixed.ptr - text <= 8) return std::string(text, fixed.ptr);
  return std::string(text, std::to_chars(text, text + sizeof text, value).ptr);
}
std::string text_of(int value) { return std::to_string(value); }
std::string text_of(bool value) { return value ? "true" : "false"; }
std::string text_of(const std::string& value) { return value; }

// The architecture keys that differ between the source and the run, each as "FIELD = THEIRS in
// FILE, KEY = OURS in the run", and the settings that would load it.
struct KeyMismatches {
  std::vector<std::string> lines, settings;
  template <typename T>
  void compare(const WeightSource& w, const std::string& key, const T& theirs, const T& ours) {
    if (theirs == ours) return;
    lines.push_back(w.field(key) + " = " + text_of(theirs) + " in " + w.fields_file + ", " + key + " = " +
                    text_of(ours) + " in the run");
    settings.push_back(key + " = " + text_of(theirs));
  }
};

// Refuses a source whose architecture is not the run's, naming every key that differs. GPT-2's
// sizes that tensor shapes show (n_embd, block_size) are left to the shape check.
void check_architecture(const WeightSource& w, const model::ModelSpec& run, const std::string& where) {
  const model::ModelSpec& src = w.spec;
  KILTER_USER_CHECK(src.arch == run.arch, where << ": " << w.field("model.arch") << " = " << w.arch_value << " in "
                                                << w.fields_file << ", model.arch = " << run.arch
                                                << " in the run: set model.arch = " << src.arch);
  if (!run.llama()) {
    // Heads show in no tensor shape, layers as missing tensors: named first, as they always were.
    for (const auto& [key, theirs, ours] : {std::tuple("model.n_layer", src.n_layer, run.n_layer),
                                            std::tuple("model.n_head", src.n_head, run.n_head)}) {
      KILTER_USER_CHECK(theirs == ours, where << " has " << std::string(key).substr(6) << " = " << theirs << ", the model "
                                              << ours << ": set " << key << " = " << theirs);
    }
  }
  KeyMismatches m;
  if (run.llama()) {
    m.compare(w, "model.n_layer", src.n_layer, run.n_layer);
    m.compare(w, "model.n_head", src.n_head, run.n_head);
    m.compare(w, "model.n_kv_head", src.kv_heads(), run.kv_heads());
    m.compare(w, "model.n_embd", src.n_embd, run.n_embd);
  }
  // GPT-2's n_embd is named by the shape check, and its default MLP width follows it.
  if (run.llama() || src.n_embd == run.n_embd) m.compare(w, "model.ffn_hidden", src.ffn_width(), run.ffn_width());
  m.compare(w, "model.norm_eps", src.norm_eps, run.norm_eps);
  if (run.llama()) {
    m.compare(w, "model.rope_theta", src.rope_theta, run.rope_theta);
    m.compare(w, "model.rope_scaling", src.rope_scaling, run.rope_scaling);
    if (src.rope_scaling == "llama3") {  // its factors, also what a run without scaling must set
      m.compare(w, "model.rope_factor", src.rope_factor, run.rope_factor);
      m.compare(w, "model.rope_low_freq_factor", src.rope_low_freq_factor, run.rope_low_freq_factor);
      m.compare(w, "model.rope_high_freq_factor", src.rope_high_freq_factor, run.rope_high_freq_factor);
      m.compare(w, "model.rope_original_context", src.rope_original_context, run.rope_original_context);
    }
  }
  m.compare(w, "model.tie_embeddings", src.tied(), run.tied());
  if (run.llama()) m.compare(w, "model.qkv_bias", src.qkv_bias, run.qkv_bias);
  if (!m.lines.empty()) {
    std::string text = where + ": ";
    for (size_t i = 0; i < m.lines.size(); ++i) text += (i ? "; " : "") + m.lines[i];
    text += ": set ";
    for (size_t i = 0; i < m.settings.size(); ++i) text += (i ? ", " : "") + m.settings[i];
    KILTER_USER_FAIL(text);
  }
  KILTER_USER_CHECK(w.sliding_window == 0 || w.sliding_window >= run.block_size,
                    where << ": sliding_window = " << w.sliding_window << " in " << w.fields_file
                          << " is shorter than the context, model.block_size = " << run.block_size
                          << ": kilter's attention sees the whole context; set model.block_size = " << w.sliding_window
                          << " (or less)");
}

// The config key that sets dimension `dim` of tensor `t`.
std::string key_of_dimension(const model::ParamTensor& t, size_t dim) {
  using R = model::TensorRole;
  if ((t.role == R::token_embedding || t.role == R::lm_head) && dim == 0) return "model.vocab_size";
  if (t.role == R::position_embedding && dim == 0) return "model.block_size";
  return "model.n_embd";
}

int64_t source_value_of(const model::ModelSpec& s, const std::string& key) {
  if (key == "model.vocab_size") return s.vocab_size;
  if (key == "model.block_size") return s.block_size;
  return s.n_embd;
}

// The vocabulary the source brings, against the run's: "" when they agree, else what differs.
std::string vocabulary_problem(const WeightSource& w, int64_t source_vocab, const RunVocabulary& vocab) {
  if (source_vocab != vocab.vocab_size)
    return "its vocabulary has " + std::to_string(source_vocab) + " ids, the model's " + std::to_string(vocab.vocab_size) +
           " (model.vocab_size; the dataset " + vocab.dataset_dir + ", tokenizer " + vocab.tokenizer + ")";
  if (!w.tokenizer.empty() && !vocab.tokenizer.empty() &&
      (w.tokenizer != vocab.tokenizer || w.tokenizer_data != vocab.tokenizer_data))
    return "its tokenizer (" + w.tokenizer + ") is not the tokenizer of the dataset " + vocab.dataset_dir + " (" +
           vocab.tokenizer + "), though both have " + std::to_string(source_vocab) + " ids";
  return "";
}

size_t element_count(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= size_t(d);
  return n;
}

// Reads the source's tensors that the model has into their places in `params`; returns the names
// of those it has not placed.
std::map<std::string, std::vector<int64_t>> place_tensors(const WeightSource& w, const model::ModelSpec& run,
                                                          const model::ParamLayout& layout, bool resize,
                                                          const std::string& where, float* params) {
  std::map<std::string, std::vector<int64_t>> left = w.shapes;
  std::vector<float> rows;  // a resized tensor's source rows
  for (const model::ParamTensor& t : layout.tensors) {
    const auto found = left.find(t.name);
    KILTER_USER_CHECK(found != left.end(), where << ": no tensor " << t.name << " (the model has " << run.n_layer
                                                 << " blocks; set model.n_layer = " << w.spec.n_layer << ")");
    const std::vector<int64_t>& theirs = found->second;
    const bool vocab_rows = t.role == model::TensorRole::token_embedding || t.role == model::TensorRole::lm_head;
    bool same = theirs.size() == t.shape.size();
    for (size_t d = 0; same && d < theirs.size(); ++d) same = theirs[d] == t.shape[d] || (vocab_rows && d == 0 && resize);
    if (!same) {
      size_t dim = 0;
      while (dim < theirs.size() && dim < t.shape.size() && theirs[dim] == t.shape[dim]) ++dim;
      const std::string key = key_of_dimension(t, std::min(dim, t.shape.size() - 1));
      KILTER_USER_FAIL(where << ": tensor " << t.name << " is " << io::shape_text(theirs) << " there and "
                             << io::shape_text(t.shape) << " in the model: set " << key << " = "
                             << source_value_of(w.spec, key) << " to load it (or train.init_from a model of this shape)");
    }
    if (vocab_rows && theirs[0] != t.shape[0]) {
      rows.resize(element_count(theirs));
      w.read(t.name, rows.data());
      const size_t keep = size_t(std::min(theirs[0], t.shape[0])) * size_t(t.shape[1]);
      std::copy_n(rows.begin(), keep, params + t.offset);
    } else {
      w.read(t.name, params + t.offset);
    }
    left.erase(found);
  }
  return left;
}

// Tensors of the source the model has no place for: a copy of a tied head (equal to the token
// embedding), Llama's o_proj biases when zero; anything else is refused.
void check_unplaced(const WeightSource& w, const std::map<std::string, std::vector<int64_t>>& left,
                    const model::ParamLayout& layout, const std::string& where, const float* params) {
  std::vector<float> values;
  for (const auto& [name, shape] : left) {
    values.resize(element_count(shape));
    const auto ends_with = [&](const std::string& s) {
      return name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
    };
    if (name == "lm_head.weight" && w.spec.tied()) {
      const model::ParamTensor& embedding = layout.tensors.front();  // the token embedding leads every table
      w.read(name, values.data());
      const size_t n = std::min(values.size(), embedding.size);
      KILTER_USER_CHECK(std::equal(values.begin(), values.begin() + long(n), params + embedding.offset),
                        where << ": lm_head.weight differs from " << embedding.name
                              << " though the source ties them (tie_word_embeddings)");
    } else if (ends_with(".self_attn.o_proj.bias")) {
      w.read(name, values.data());
      KILTER_USER_CHECK(std::all_of(values.begin(), values.end(), [](float v) { return v == 0.0f; }),
                        where << ": tensor " << name << " is not zero: kilter's o_proj has no bias (model.qkv_bias "
                              << "covers q, k and v only), so this model cannot be loaded");
    } else {
      KILTER_USER_FAIL(where << ": tensor " << name << " has no place in the model (set model.n_layer = "
                             << w.spec.n_layer << "?)");
    }
  }
}

}  // namespace

void read_initial_weights(const std::string& source, const model::ModelSpec& spec, const model::ParamLayout& layout,
                          const RunVocabulary& vocab, const std::string& init_vocab, float* params, std::string& note) {
  KILTER_USER_CHECK(init_vocab == "strict" || init_vocab == "resize",
                    "config key train.init_vocab = '" << init_vocab << "': expected strict | resize");
  const WeightSource w = read_source(source);
  const std::string where = "train.init_from = " + source + " (" + w.kind + ")";
  check_architecture(w, spec, where);

  // The vocabulary: its size, and the tokenizer where both sides record one.
  const std::string embedding = layout.tensors.front().name;
  const auto embedding_shape = w.shapes.find(embedding);
  KILTER_USER_CHECK(embedding_shape != w.shapes.end() && embedding_shape->second.size() == 2,
                    where << ": no 2-D tensor " << embedding << " (the token embedding)");
  const int64_t source_vocab = embedding_shape->second[0];
  const std::string vocab_problem = vocabulary_problem(w, source_vocab, vocab);
  const bool resize = !vocab_problem.empty() && init_vocab == "resize";
  KILTER_USER_CHECK(vocab_problem.empty() || resize,
                    where << ": " << vocab_problem << ". Prepare the dataset with the model's tokenizer"
                          << (w.tokenizer == "hf-bpe" ? " (kilter prep --tokenizer " + source + "/tokenizer.json)" : "")
                          << ", or set train.init_vocab = resize to keep the token embedding's first rows and "
                             "initialize the rest");

  bool same_tensors = w.shapes.size() == layout.tensors.size();
  for (const model::ParamTensor& t : layout.tensors) {
    const auto found = w.shapes.find(t.name);
    same_tensors = same_tensors && found != w.shapes.end() && found->second == t.shape;
  }
  if (w.read_whole && same_tensors) {
    w.read_whole(layout, params);
  } else {
    const auto left = place_tensors(w, spec, layout, resize, where, params);
    check_unplaced(w, left, layout, where, params);
  }
  note = "weights from " + w.kind + " " + w.detail + "; optimizer state and data position start fresh";
  if (resize)
    note += "; vocabulary resized (" + vocab_problem + "): " +
            std::to_string(std::min<int64_t>(source_vocab, vocab.vocab_size)) + " embedding rows kept";
}

}  // namespace kilter::train
