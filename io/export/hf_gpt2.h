// Hugging Face GPT-2, as `transformers`' GPT2LMHeadModel stores it: kilter's tensors
// carry nanoGPT names (HF's, with the `transformer.` prefix) and torch.nn.Linear shapes [out, in];
// HF's GPT-2 stores the four block projections (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj)
// as Conv1D weights [in, out], so those are transposed both ways (hf_directory.h). The directory
// itself (config, weights, tokenizer) is hf_directory.h's; this file names what is GPT-2's own.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "io/export/hf_directory.h"

namespace kilter::io {

// True for the weights HF's GPT-2 keeps as Conv1D ([in, out], the transpose of kilter's).
bool hf_is_conv1d(const std::string& name);

// An HF GPT-2 directory read whole into memory (for tests and tools: train.init_from reads one
// tensor at a time through HfModelDir): the config, each tensor under its nanoGPT name in torch
// layout (Conv1D weights transposed to [out, in]), the tokenizer.json bytes when the directory
// has one, and config.json's eos_token_id (-1 when absent).
struct HfGpt2 {
  std::string dir;
  HfModelConfig shape;
  int64_t eos_id = -1;
  std::string tokenizer_json;
  std::map<std::string, std::vector<int64_t>> shapes;      // nanoGPT name -> torch shape
  std::map<std::string, std::vector<float>> values;       // nanoGPT name -> values
};

// Reads `dir` (HfModelDir's refusals). Also refused: a model_type other than gpt2, an
// lm_head.weight that differs from the token embedding in a tied model.
HfGpt2 read_hf_gpt2(const std::string& dir);

}  // namespace kilter::io
