// Text generation with the model (docs/design.md, "Model"; either architecture) on the CPU: a forward pass over new
// tokens only, with every layer's keys and values kept in a cache, so a generated token costs
// O(context) (one row through the dense layers, attention over the cached positions) rather than
// a full forward over the whole sequence. Used by `kilter sample` and by training's periodic
// samples (`output.sample_every`); the weights come from a checkpoint or a live model. Owner:
// sampling.
#pragma once
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "lib/model/attention.h"
#include "lib/model/block_ops_cpu.h"
#include "lib/model/block_schedule.h"
#include "lib/model/model.h"
#include "lib/model/rope.h"

namespace kilter::model {

class Generator {
 public:
  // `params`: num_params floats in ParamLayout order (host), as checkpoints and get_params() hold them.
  Generator(const ModelSpec& cfg, std::vector<float> params);
  // Reads the weights where they are, num_params floats in layout order, and asks `units` (when
  // not null) for each parameter unit before it is read and lets it go after: the weights of
  // sharded parameters arrive one unit at a time (need, forward_done; pass_done ends each feed).
  Generator(const ModelSpec& cfg, float* params, ParamUnitHooks* units);
  Generator(const Generator&) = delete;  // its op table holds this generator's memory
  Generator& operator=(const Generator&) = delete;

  const ModelSpec& config() const { return cfg_; }
  // Tokens in the cache: the position the next fed token takes.
  int position() const { return position_; }
  // Empties the cache (a new sequence starts at position 0).
  void reset() { position_ = 0; }
  // Runs `count` tokens at positions position() .. position()+count-1 through the model, adds
  // their keys and values to the cache, and returns the logits (vocab_size floats) that follow
  // the last of them. Throws kilter::Error when an id is outside the vocabulary or the tokens
  // would not fit the context (block_size).
  const float* feed(const int32_t* tokens, int count);

 private:
  void attend(int layer, int n);  // the new rows' K/V into the cache, their attention into atty_

  ModelSpec cfg_;
  std::vector<float> own_params_;  // the first constructor's copy
  float* params_ = nullptr;
  ParamUnitHooks* units_ = nullptr;
  LayoutOffsets offsets_;
  AttentionShape shape_;
  RopeTable rope_;  // llama
  int position_ = 0;
  // Per layer: (block_size, kv_width / 2), the key (value) heads side by side.
  std::vector<float> key_cache_, value_cache_;
  // Activations of the tokens being fed (n rows): every layer's in the same buffers, the residual
  // stream updated in place.
  std::vector<float> x_, ln_, mean_, rstd_, qkv_, atty_, fch_, fch_gelu_, scores_, logits_;
  std::vector<int32_t> positions_;
  // The blocks run through training's block schedule on the CPU op table, its attention over the
  // cache (attend) in place of the table's.
  BlockMemory memory_;
  std::unique_ptr<BlockOps> ops_;
  BlockSchedule schedule_;
};

// How the next token is chosen from the logits.
struct SamplingOptions {
  int max_new_tokens = 64;
  double temperature = 1.0;  // 0: greedy (argmax; the lowest id wins a tie)
  int top_k = 0;             // > 0: sample among the k most likely ids only
  uint64_t seed = 1337;      // same seed, same logits -> same tokens
  int64_t eos_id = -1;       // generation stops when this id is picked (-1: never)
};

// Picks tokens from logits, deterministic from the seed (its own uniform draw from a
// std::mt19937_64, so the stream does not depend on the standard library's distributions).
class TokenPicker {
 public:
  TokenPicker(double temperature, int top_k, uint64_t seed);
  int32_t pick(const float* logits, int vocab_size);

 private:
  double temperature_;
  int top_k_;
  std::mt19937_64 rng_;
  std::vector<int32_t> order_;
  std::vector<double> weights_;
};

// Where a sample without a prompt begins. Training never predicts a document's first token (it
// is the input at position 0 and no target), and never feeds the EOS id as an input, so the
// model has no distribution to start a document from; an unprompted sample draws its first token
// from how often the training documents start with each id (`ids[i]` starts `counts[i]` of
// them), with the options' temperature and top-k, and the model writes the rest.
struct DocumentStarts {
  std::vector<int32_t> ids;
  std::vector<uint64_t> counts;
  bool empty() const { return ids.empty(); }
};

struct Generation {
  std::vector<int32_t> tokens;  // the new tokens (the EOS that stopped it excluded); an
                                // unprompted sample's first token (drawn from the starts) included
  std::string stop_reason;      // "eos" | "max_new_tokens" | "context"
  double prefill_seconds = 0;   // feeding the prompt
  double decode_seconds = 0;    // generating the new tokens
};

// Resets `generator`, feeds `prompt` (1 .. block_size tokens) and generates up to
// options.max_new_tokens tokens, stopping at EOS or when the context is full. An empty `prompt`
// needs `starts` (non-empty): the first new token is drawn from them, by the same seeded picker.
Generation generate(Generator& generator, const std::vector<int32_t>& prompt, const SamplingOptions& options,
                    const DocumentStarts* starts = nullptr);

}  // namespace kilter::model
