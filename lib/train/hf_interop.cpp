// HF export, the ModelSpec <-> HF config mapping, and the collective train.init_from load (see
// hf_interop.h; reading a source into a layout is init_from.cpp).
#include "lib/train/hf_interop.h"

#include <cstdio>

#include "io/checkpoint.h"
#include "io/base/error.h"
#include "kilter/build_info.h"
#include "lib/model/init.h"
#include "lib/train/checkpoint_model.h"
#include "lib/train/checkpointer.h"
#include "lib/train/root_broadcast.h"

namespace kilter::train {

namespace {

std::vector<io::CheckpointTensor> io_tensors(const model::ParamLayout& layout) {
  std::vector<io::CheckpointTensor> tensors;
  for (const auto& t : layout.tensors) tensors.push_back({t.name, t.shape, t.offset, t.size});
  return tensors;
}

}  // namespace

io::HfModelConfig hf_config_of(const model::ModelSpec& spec, int64_t eos_id) {
  io::HfModelConfig c;
  io::copy_model_settings(spec.resolved(), c);
  c.model_type = !spec.llama() ? "gpt2" : spec.qkv_bias ? "qwen2" : "llama";
  c.qkv_bias = spec.llama() && spec.qkv_bias;
  c.eos_id = eos_id;
  // GPT-2 has no BOS of its own: HF's GPT-2 configs name <|endoftext|> as both. kilter records no
  // BOS for the Llama family.
  c.bos_id = spec.llama() ? -1 : eos_id;
  return c;
}

model::ModelSpec spec_of_hf(const io::HfModelConfig& c) {
  model::ModelSpec spec;
  io::copy_model_settings(c, spec);
  spec.arch = c.llama_family() ? "llama" : "gpt2";
  // GPT-2 has as many K/V heads as query heads (the reader gives n_head); a GPT-2 config sets none
  // of the RoPE and q/k/v bias settings, which keep their defaults.
  if (!c.llama_family()) spec.n_kv_head = 0;
  return spec;
}

std::vector<std::string> write_hf_model(const std::string& out, const io::CheckpointInfo& info,
                                        const model::ParamLayout& layout, const float* params,
                                        const io::HfExportOptions& options) {
  const io::HfModelConfig config = hf_config_of(spec_of(info), info.eos_id);
  return io::write_hf_directory(out, config, info.tokenizer, info.tokenizer_data, io_tensors(layout), params, options);
}

CheckpointWeights read_checkpoint_weights(const std::string& source) {
  CheckpointWeights c;
  c.path = Checkpointer::latest(source);
  KILTER_USER_CHECK(!c.path.empty(), source << ": no checkpoint found (give a checkpoint file, or a run directory "
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
  result.architecture = io::hf_architecture(hf_config_of(c.gpt, info.eos_id).model_type);
  io::HfExportOptions opts = options;
  opts.metadata["kilter_version"] = KILTER_VERSION;
  opts.metadata["kilter_step"] = std::to_string(info.step);
  opts.metadata["kilter_tokenizer"] = info.tokenizer;
  result.files = write_hf_model(out, info, c.layout, c.params.data(), opts);
  return result;
}

std::vector<float> read_initial_weights(const std::string& source, const model::ModelSpec& spec,
                                        const model::ParamLayout& layout, const RunVocabulary& vocab,
                                        const std::string& init_vocab, const std::vector<float>& init,
                                        std::string& note) {
  std::vector<float> params = init;
  params.resize(layout.num_params);
  read_initial_weights(source, spec, layout, vocab, init_vocab, params.data(), note);
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
      // The model's own initialization (train.seed's, as Model::init_params made it on every rank:
      // no rank reads the model whole, which a sharded one is not), overwritten in place tensor by
      // tensor.
      params.assign(layout.padded_size, 0.0f);
      model::init_params(params.data(), layout, model.config(), cfg.train.seed);
      params.resize(layout.num_params);
      const RunVocabulary vocab{index.dir, index.tokenizer, index.tokenizer_data, cfg.model.vocab_size};
      read_initial_weights(cfg.train.init_from, model.config(), layout, vocab, cfg.train.init_vocab, params.data(), note);
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
