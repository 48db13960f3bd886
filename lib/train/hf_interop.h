// Models in and out (issue 26): `kilter export --format hf` (a kilter checkpoint as a Hugging
// Face GPT-2 directory) and `train.init_from` (weights from an HF GPT-2 directory or a kilter
// checkpoint; the optimizer state and the data position start fresh). The file formats live in
// io/export/ (safetensors, the HF directory); this layer maps them onto the model's ParamLayout
// and the run's config keys.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "io/dataset.h"
#include "io/export/hf_gpt2.h"
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
  std::vector<std::string> files;  // written into the output directory
};

// `source`: a checkpoint file, a run directory (its newest checkpoint) or a checkpoints folder.
// Throws kilter::Error naming the file and what is wrong.
HfExportResult export_hf(const std::string& source, const std::string& out, const io::HfExportOptions& options);

// Writes `params` (laid out by `layout`) of a model of shape `gpt` as an HF GPT-2 directory with
// the tokenizer of `info` (what export_hf does once a checkpoint is read).
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

// The weights of train.init_from = `source` in `layout` order, for a model of shape `gpt`.
// `init` (layout.num_params floats) is the model's own initialization: rows a resized vocabulary
// adds keep it. Refused, naming `source`: a source that is neither an HF GPT-2 directory nor a
// kilter checkpoint; a tensor whose shape differs (the tensor, both shapes and the config key to
// change); a different n_head or n_layer (the key); a vocabulary other than the dataset's
// (its size, or its tokenizer where both record one) unless `init_vocab` is "resize". `note`
// says what was loaded (one line for the log).
std::vector<float> read_initial_weights(const std::string& source, const model::ModelSpec& gpt,
                                        const model::ParamLayout& layout, const RunVocabulary& vocab,
                                        const std::string& init_vocab, const std::vector<float>& init,
                                        std::string& note);

// Collective: rank 0 reads cfg.train.init_from (read_initial_weights) and every rank sets the
// model's parameters, or every rank throws the same error. Returns the note (rank 0).
std::string load_initial_weights(MPI_Comm world, const Config& cfg, const io::DatasetIndex& index, model::Model& model);

}  // namespace kilter::train
