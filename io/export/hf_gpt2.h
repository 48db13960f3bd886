// A Hugging Face GPT-2 model directory (issue 26), as `transformers`' GPT2LMHeadModel reads and
// writes it: config.json (GPT2Config), model.safetensors (or shards listed by
// model.safetensors.index.json), generation_config.json and the tokenizer files. kilter's
// tensors carry nanoGPT names and torch.nn.Linear shapes [out, in]; HF's GPT-2 stores the four
// block projections (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) as Conv1D weights [in, out],
// so those are transposed both ways. The LM head is tied to transformer.wte.weight and not stored.
// What `kilter export --format hf` writes and `train.init_from` reads; knows nothing of lib/.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "io/checkpoint.h"

namespace kilter::io {

// The model shape and the tokenizer a checkpoint records (CheckpointInfo's fields).
struct HfModelShape {
  int64_t n_layer = 0, n_head = 0, n_embd = 0, block_size = 0, vocab_size = 0;
};

struct HfExportOptions {
  std::string dtype = "fp32";  // fp32 | bf16
  bool force = false;          // replace an existing non-empty output directory
  std::map<std::string, std::string> metadata;  // model.safetensors' __metadata__ (strings)
};

// True for the weights HF's GPT-2 keeps as Conv1D ([in, out], the transpose of kilter's).
bool hf_is_conv1d(const std::string& name);

// Writes the directory `out` atomically (built under a temporary sibling, fsync'ed, renamed):
// config.json, generation_config.json, model.safetensors from `tensors` (nanoGPT names, torch
// shapes, offsets into `params`), and the tokenizer files of `info.tokenizer` (hf-bpe:
// tokenizer.json + tokenizer_config.json; sentencepiece: tokenizer.model; byte and ids-only
// kinds: none). Returns the names of the files written.
std::vector<std::string> write_hf_gpt2(const std::string& out, const CheckpointInfo& info,
                                       const std::vector<CheckpointTensor>& tensors, const float* params,
                                       const HfExportOptions& options);

// An HF GPT-2 directory read back: the shape config.json gives, each tensor under its nanoGPT
// name in torch layout (Conv1D weights transposed to [out, in]), the tokenizer.json bytes when
// the directory has one, and config.json's eos_token_id (-1 when absent).
struct HfGpt2 {
  std::string dir;
  HfModelShape shape;
  int64_t eos_id = -1;
  std::string tokenizer_json;
  std::map<std::string, std::vector<int64_t>> shapes;      // nanoGPT name -> torch shape
  std::map<std::string, std::vector<float>> values;       // nanoGPT name -> values
};

// True when `dir` looks like an HF model directory (config.json next to model.safetensors or
// model.safetensors.index.json).
bool is_hf_model_dir(const std::string& dir);

// Reads `dir`. Refused, naming the file and the field: a config that is not GPT-2 as kilter
// builds it (model_type, activation, untied embeddings, n_inner other than 4 x n_embd, attention
// scaled by layer index), no model.safetensors, an lm_head.weight that differs from the token
// embedding. Tensors the model does not have (attn.bias / masked_bias buffers) are skipped.
HfGpt2 read_hf_gpt2(const std::string& dir);

}  // namespace kilter::io
