// A Hugging Face model directory (issues 26 and 38), as transformers' save_pretrained writes it
// and from_pretrained reads it: config.json (hf_config.h), model.safetensors (or the shards that
// model.safetensors.index.json lists), generation_config.json and the tokenizer files. Read and
// written one tensor at a time: neither side holds a second copy of the model.
// Tensor names: kilter's parameter table uses HF's own names for the Llama family
// (model.layers.{i}.self_attn.q_proj.weight, ...) and nanoGPT's for GPT-2, which are HF's with the
// `transformer.` prefix; HF's GPT-2 stores the four block projections as Conv1D weights [in, out]
// (hf_gpt2.h), the transpose of kilter's [out, in], so those are transposed both ways.
// What `kilter export --format hf` writes and `train.init_from` reads; knows nothing of lib/.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/export/hf_config.h"
#include "io/export/safetensors.h"

namespace kilter::io {

struct HfExportOptions {
  std::string dtype = "fp32";  // fp32 | bf16
  bool force = false;          // replace an existing non-empty output directory
  std::map<std::string, std::string> metadata;  // model.safetensors' __metadata__ (strings)
};

// True when `dir` looks like an HF model directory (config.json next to model.safetensors or
// model.safetensors.index.json).
bool is_hf_model_dir(const std::string& dir);

// Writes the directory `out` atomically (built under a temporary sibling, fsync'ed, renamed):
// config.json of `config`, generation_config.json, model.safetensors from `tensors` (kilter's
// names and torch shapes, offsets into `params`; GPT-2's Conv1D weights transposed one at a time
// as they are written), and the tokenizer files of `tokenizer` (kind) and `tokenizer_data` (its
// file bytes: hf-bpe: tokenizer.json + tokenizer_config.json; sentencepiece: tokenizer.model;
// byte and ids-only kinds: none). Returns the names of the files written.
std::vector<std::string> write_hf_directory(const std::string& out, const HfModelConfig& config,
                                            const std::string& tokenizer, const std::string& tokenizer_data,
                                            const std::vector<CheckpointTensor>& tensors, const float* params,
                                            const HfExportOptions& options);

// An HF model directory opened for reading: its config (read_hf_config's refusals) and every
// weight tensor under kilter's name, in torch layout. Nothing but the headers is read until
// read() asks for one tensor. Refused, naming the directory: no model.safetensors (nor an index
// of shards), a tensor that appears twice, untied embeddings without an lm_head.weight.
// Skipped: buffers that are not weights (GPT-2's attn.bias / attn.masked_bias, rotary_emb.inv_freq).
class HfModelDir {
 public:
  explicit HfModelDir(const std::string& dir);

  const std::string& dir() const { return dir_; }
  std::string config_path() const;
  const HfModelConfig& config() const { return config_; }
  // kilter name -> torch shape ([out, in] for Linear weights).
  const std::map<std::string, std::vector<int64_t>>& shapes() const { return shapes_; }
  // Tensor `name` (a key of shapes()) as float32 into out[0, elements) (Conv1D weights transposed
  // through a buffer of that one tensor).
  void read(const std::string& name, float* out) const;
  // The stored dtype of tensor `name` ("F32", "BF16", "F16").
  const std::string& dtype(const std::string& name) const;
  // The directory's tokenizer.json, "" when it has none.
  std::string tokenizer_json() const;

 private:
  struct Place {
    size_t file = 0;
    std::string stored;  // the name in the file
    bool transposed = false;
  };
  std::string dir_;
  HfModelConfig config_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Place> places_;
  std::map<std::string, std::vector<int64_t>> shapes_;
};

}  // namespace kilter::io
