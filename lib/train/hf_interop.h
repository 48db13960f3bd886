// Models in and out (issues 26 and 38): `kilter export --format hf` (a kilter checkpoint as a
// Hugging Face directory: GPT2LMHeadModel for gpt2, LlamaForCausalLM for llama, Qwen2ForCausalLM
// for llama with q/k/v biases) and `train.init_from` (weights from an HF GPT-2, Llama, Qwen2 or
// Mistral directory or a kilter checkpoint; the optimizer state and the data position start
// fresh). The file formats live in io/export/ (safetensors, config.json, the HF directory); this
// layer maps them onto the model description (ModelSpec), its ParamLayout and the run's keys.
// Implementation: hf_interop.cpp (export, the ModelSpec <-> config mapping, the collective load),
// init_from.cpp (reading a source into a run's layout, with its checks).
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "io/dataset.h"
#include "io/export/hf_directory.h"
#include "lib/core/config.h"
#include "lib/model/model.h"

namespace kilter::train {

// A checkpoint's weights and attributes: what `kilter export`, `kilter sample` and
// train.init_from read from a checkpoint file, a run directory (its newest) or a checkpoints folder.
struct CheckpointWeights {
  std::string path;            // the checkpoint file
  io::CheckpointInfo info;
  model::ModelSpec gpt;
  model::ParamLayout layout;
  std::vector<float> params;   // layout order
};
// Throws kilter::Error naming `source` when it holds no checkpoint, or the file and the problem.
CheckpointWeights read_checkpoint_weights(const std::string& source);

struct HfExportResult {
  std::string checkpoint;          // the checkpoint file exported
  int64_t step = 0;
  std::string architecture;        // the transformers class that loads it (LlamaForCausalLM, ...)
  std::vector<std::string> files;  // written into the output directory
};

// The HF description of `spec`: model_type gpt2 for gpt2; for llama, llama, or qwen2 when it has
// q/k/v biases (HF's Llama would put a bias on o_proj too). `eos_id` -1: unknown.
io::HfModelConfig hf_config_of(const model::ModelSpec& spec, int64_t eos_id);
// The model an HF config describes, as a run's model.* keys set it (block_size: the config's
// context, max_position_embeddings or n_positions).
model::ModelSpec spec_of_hf(const io::HfModelConfig& config);

// `source`: a checkpoint file, a run directory (its newest checkpoint) or a checkpoints folder.
// Throws kilter::Error naming the file and what is wrong.
HfExportResult export_hf(const std::string& source, const std::string& out, const io::HfExportOptions& options);

// Writes `params` (laid out by `layout`) of the model `info` records as an HF directory with the
// tokenizer of `info` (what export_hf does once a checkpoint is read).
std::vector<std::string> write_hf_model(const std::string& out, const io::CheckpointInfo& info,
                                        const model::ParamLayout& layout, const float* params,
                                        const io::HfExportOptions& options);

// The vocabulary a run trains with: the dataset's tokenizer (kind and file bytes) and the model's
// vocab_size.
struct RunVocabulary {
  std::string dataset_dir;
  std::string tokenizer;
  std::string tokenizer_data;
  int64_t vocab_size = 0;
};

// Reads train.init_from = `source` into `params` (layout.num_params floats in `layout` order,
// holding the model's own initialization on entry: rows a resized vocabulary adds keep it), one
// tensor at a time straight into its place: nothing else holds the model (a kilter checkpoint
// whose vocabulary is resized is read whole first). Refused (user errors), naming `source`: a
// source that is neither an HF model directory nor a kilter checkpoint; an architecture key of
// the source that differs from the run's (the source's field, both values and the model.* key
// to set, e.g. "num_key_value_heads = 8 in DIR/config.json, model.n_kv_head = 4 in the run: set
// model.n_kv_head = 8"); a sliding window shorter than model.block_size; a tensor whose shape
// differs (the tensor, both shapes and the key); a tensor the model has no place for (an o_proj
// bias is accepted when it is zero); a vocabulary other than the dataset's (its size, or its
// tokenizer where both record one) unless `init_vocab` is "resize". `note` says what was loaded
// (one line for the log).
void read_initial_weights(const std::string& source, const model::ModelSpec& spec, const model::ParamLayout& layout,
                          const RunVocabulary& vocab, const std::string& init_vocab, float* params, std::string& note);
// The same into a copy of `init`, returned.
std::vector<float> read_initial_weights(const std::string& source, const model::ModelSpec& spec,
                                        const model::ParamLayout& layout, const RunVocabulary& vocab,
                                        const std::string& init_vocab, const std::vector<float>& init,
                                        std::string& note);

// Collective: rank 0 reads cfg.train.init_from (read_initial_weights) and every rank sets the
// model's parameters, or every rank throws the same error. Returns the note (rank 0).
std::string load_initial_weights(MPI_Comm world, const Config& cfg, const io::DatasetIndex& index, model::Model& model);

}  // namespace kilter::train
