// HF export and train.init_from (see hf_interop.h).
#include "lib/train/hf_interop.h"
#include "lib/train/checkpoint_model.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "io/checkpoint.h"
#include "io/error.h"
#include "io/text_format.h"
#include "kilter/build_info.h"
#include "lib/train/checkpointer.h"
#include "lib/train/root_broadcast.h"

namespace kilter::train {

namespace {

std::vector<io::CheckpointTensor> io_tensors(const model::ParamLayout& layout) {
  std::vector<io::CheckpointTensor> tensors;
  for (const auto& t : layout.tensors) tensors.push_back({t.name, t.shape, t.offset, t.size});
  return tensors;
}


// A source's weights by nanoGPT name, its shape and what it says about its vocabulary.
struct SourceWeights {
  std::string kind;  // "Hugging Face GPT-2 directory" | "kilter checkpoint"
  io::HfModelShape shape;
  std::map<std::string, std::vector<int64_t>> shapes;
  std::map<std::string, std::vector<float>> values;
  std::string tokenizer;       // kind ("" unknown)
  std::string tokenizer_data;  // file bytes ("" unknown or none)
  std::string detail;          // e.g. "step 200 of runs/x/checkpoints/step-00000200.h5"
};

SourceWeights read_source(const std::string& source) {
  SourceWeights w;
  if (io::is_hf_model_dir(source)) {
    io::HfGpt2 hf = io::read_hf_gpt2(source);
    w.kind = "Hugging Face GPT-2 directory";
    w.shape = hf.shape;
    w.shapes = std::move(hf.shapes);
    w.values = std::move(hf.values);
    if (!hf.tokenizer_json.empty()) {
      w.tokenizer = "hf-bpe";
      w.tokenizer_data = std::move(hf.tokenizer_json);
    }
    w.detail = source;
    return w;
  }
  KILTER_USER_CHECK(!Checkpointer::latest(source).empty(),
               "train.init_from = " << source << ": neither a Hugging Face GPT-2 directory (config.json + "
               "model.safetensors) nor a kilter checkpoint (a step-*.h5 file, or a run directory holding "
               "checkpoints): give one of those");
  const CheckpointWeights c = read_checkpoint_weights(source);
  const io::CheckpointInfo& info = c.info;
  const model::ParamLayout& layout = c.layout;
  const std::vector<float>& params = c.params;
  const std::string& path = c.path;
  w.kind = "kilter checkpoint";
  w.shape = {info.n_layer, info.n_head, info.n_embd, info.block_size, info.vocab_size};
  for (const auto& t : layout.tensors) {
    w.shapes[t.name] = t.shape;
    w.values[t.name].assign(params.begin() + long(t.offset), params.begin() + long(t.offset + t.size));
  }
  w.tokenizer = info.tokenizer;
  w.tokenizer_data = info.tokenizer_data;
  w.detail = "step " + std::to_string(info.step) + " of " + path;
  return w;
}

// The config key that sets dimension `dim` of tensor `name`.
std::string key_of_dimension(const std::string& name, size_t dim) {
  if (name == "transformer.wte.weight" && dim == 0) return "model.vocab_size";
  if (name == "transformer.wpe.weight" && dim == 0) return "model.block_size";
  return "model.n_embd";
}

int64_t source_value_of(const io::HfModelShape& s, const std::string& key) {
  if (key == "model.vocab_size") return s.vocab_size;
  if (key == "model.block_size") return s.block_size;
  if (key == "model.n_layer") return s.n_layer;
  if (key == "model.n_head") return s.n_head;
  return s.n_embd;
}

}  // namespace

std::vector<std::string> write_hf_model(const std::string& out, const io::CheckpointInfo& info,
                                        const model::ParamLayout& layout, const float* params,
                                        const io::HfExportOptions& options) {
  return io::write_hf_gpt2(out, info, io_tensors(layout), params, options);
}

CheckpointWeights read_checkpoint_weights(const std::string& source) {
  CheckpointWeights c;
  c.path = Checkpointer::latest(source);
  KILTER_CHECK(!c.path.empty(), source << ": no checkpoint found (give a checkpoint file, or a run directory "
                                          "holding checkpoints/step-*.h5)");
  c.info = io::read_checkpoint_info(c.path);
  c.gpt = spec_of(c.info);
  c.layout = model::ParamLayout::build(c.gpt);
  c.params.resize(c.layout.num_params);
  io::read_checkpoint_params(c.path, io_tensors(c.layout), c.params.data());
  return c;
}

HfExportResult export_hf(const std::string& source, const std::string& out, const io::HfExportOptions& options) {
  const CheckpointWeights c = read_checkpoint_weights(source);
  const io::CheckpointInfo& info = c.info;
  HfExportResult result;
  result.checkpoint = c.path;
  result.step = info.step;
  io::HfExportOptions opts = options;
  opts.metadata["kilter_version"] = KILTER_VERSION;
  opts.metadata["kilter_step"] = std::to_string(info.step);
  opts.metadata["kilter_tokenizer"] = info.tokenizer;
  result.files = write_hf_model(out, info, c.layout, c.params.data(), opts);
  return result;
}

std::vector<float> read_initial_weights(const std::string& source, const model::ModelSpec& gpt,
                                        const model::ParamLayout& layout, const RunVocabulary& vocab,
                                        const std::string& init_vocab, const std::vector<float>& init,
                                        std::string& note) {
  KILTER_CHECK(init_vocab == "strict" || init_vocab == "resize",
               "config key train.init_vocab = '" << init_vocab << "': expected strict | resize");
  SourceWeights w = read_source(source);
  const std::string where = "train.init_from = " + source + " (" + w.kind + ")";
  const io::HfModelShape model_shape{gpt.n_layer, gpt.n_head, gpt.n_embd, gpt.block_size, gpt.vocab_size};
  // Shape keys that no tensor shape shows (heads) or that show as missing tensors (layers).
  for (const char* key : {"model.n_layer", "model.n_head"}) {
    const int64_t theirs = source_value_of(w.shape, key), ours = source_value_of(model_shape, key);
    KILTER_CHECK(theirs == ours, where << " has " << key + 6 << " = " << theirs << ", the model " << ours << ": set "
                                       << key << " = " << theirs);
  }

  // The vocabulary: its size, and the tokenizer where both sides record one.
  const auto wte_shape = w.shapes.find("transformer.wte.weight");
  KILTER_CHECK(wte_shape != w.shapes.end() && wte_shape->second.size() == 2,
               where << ": no 2-D tensor transformer.wte.weight (the token embedding)");
  const int64_t source_vocab = wte_shape->second[0];
  std::string vocab_problem;
  if (source_vocab != vocab.vocab_size) {
    vocab_problem = "its vocabulary has " + std::to_string(source_vocab) + " ids, the model's " +
                    std::to_string(vocab.vocab_size) + " (model.vocab_size; the dataset " + vocab.dataset_dir +
                    ", tokenizer " + vocab.tokenizer + ")";
  } else if (!w.tokenizer.empty() && !vocab.tokenizer.empty() &&
             (w.tokenizer != vocab.tokenizer || w.tokenizer_data != vocab.tokenizer_data)) {
    vocab_problem = "its tokenizer (" + w.tokenizer + ") is not the tokenizer of the dataset " + vocab.dataset_dir +
                    " (" + vocab.tokenizer + "), though both have " + std::to_string(source_vocab) + " ids";
  }
  const bool resize = !vocab_problem.empty() && init_vocab == "resize";
  KILTER_CHECK(vocab_problem.empty() || resize,
               where << ": " << vocab_problem << ". Prepare the dataset with the model's tokenizer"
                     << (w.tokenizer == "hf-bpe" ? " (kilter prep --tokenizer " + source + "/tokenizer.json)" : "")
                     << ", or set train.init_vocab = resize to keep the token embedding's first rows and "
                        "initialize the rest");

  std::vector<float> params = init;
  params.resize(layout.num_params);
  for (const model::ParamTensor& t : layout.tensors) {
    const auto found = w.values.find(t.name);
    KILTER_CHECK(found != w.values.end(), where << ": no tensor " << t.name << " (the model has " << gpt.n_layer
                                                << " blocks; set model.n_layer = " << w.shape.n_layer << ")");
    const std::vector<int64_t>& theirs = w.shapes.at(t.name);
    const bool is_wte = t.name == "transformer.wte.weight";
    bool same = theirs.size() == t.shape.size();
    for (size_t d = 0; same && d < theirs.size(); ++d) same = theirs[d] == t.shape[d] || (is_wte && d == 0 && resize);
    if (!same) {
      size_t dim = 0;
      while (dim < theirs.size() && dim < t.shape.size() && theirs[dim] == t.shape[dim]) ++dim;
      const std::string key = key_of_dimension(t.name, std::min(dim, t.shape.size() - 1));
      KILTER_FAIL(where << ": tensor " << t.name << " is " << io::shape_text(theirs) << " there and " << io::shape_text(t.shape)
                        << " in the model: set " << key << " = " << source_value_of(w.shape, key)
                        << " to load it (or train.init_from a model of this shape)");
    }
    if (is_wte && resize) {
      const size_t rows = size_t(std::min<int64_t>(source_vocab, t.shape[0])), cols = size_t(t.shape[1]);
      std::copy(found->second.begin(), found->second.begin() + long(rows * cols), params.begin() + long(t.offset));
    } else {
      std::copy(found->second.begin(), found->second.end(), params.begin() + long(t.offset));
    }
    w.values.erase(found);
  }
  // Tensors the model has no place for: more blocks than model.n_layer.
  KILTER_CHECK(w.values.empty(), where << ": tensor " << w.values.begin()->first << " has no place in the model (set "
                                       << "model.n_layer = " << w.shape.n_layer << "?)");
  note = "weights from " + w.kind + " " + w.detail + "; optimizer state and data position start fresh";
  if (resize)
    note += "; vocabulary resized (" + vocab_problem + "): " +
            std::to_string(std::min<int64_t>(source_vocab, vocab.vocab_size)) + " embedding rows kept";
  return params;
}

std::string load_initial_weights(MPI_Comm world, const Config& cfg, const io::DatasetIndex& index, model::Model& model) {
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  const model::ParamLayout& layout = model.layout();
  std::vector<float> params;
  std::string problem, note;
  if (rank == 0) {
    try {
      std::vector<float> init(layout.num_params);
      model.get_params(init.data());
      const RunVocabulary vocab{index.dir, index.tokenizer, index.tokenizer_data, cfg.model.vocab_size};
      params = read_initial_weights(cfg.train.init_from, model.config(), layout, vocab, cfg.train.init_vocab, init, note);
    } catch (const Error& e) {
      problem = e.message();
    }
  }
  share_outcome(world, 0, problem, "loading train.init_from = " + cfg.train.init_from, ErrorKind::user);
  broadcast_floats(world, params, 0);
  model.set_params(params.data());
  return note;
}

}  // namespace kilter::train
