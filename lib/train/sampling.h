// Sampling text from a model: what `kilter sample` loads from a checkpoint (weights,
// shape, the recorded tokenizer), how a prompt becomes ids and ids become text, and the periodic
// samples `kilter train` prints every `output.sample_every` steps. Generation itself is
// lib/model/generate.h (CPU, KV cache).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "io/dataset.h"
#include "io/tokenizer/tokenizer.h"
#include "lib/core/config.h"
#include "lib/model/generate.h"
#include "lib/model/model.h"

namespace kilter::train {

class SampleFeed;

// The decoding side of a dataset or checkpoint: its tokenizer when the kind has text ("byte",
// "sentencepiece", "hf-bpe"), none for ids-only kinds ("imported" without a tokenizer file,
// "synthetic"), and the EOS id.
struct TextCodec {
  std::string kind;
  std::unique_ptr<io::Tokenizer> tokenizer;  // null: ids only
  int64_t eos_id = -1;
  // Builds it from a recorded kind and file bytes; `where` names the file for errors.
  static TextCodec from_record(const std::string& kind, const std::string& file_bytes, int64_t eos_id,
                               const std::string& where);
  // "<text>" when there is a tokenizer, else the ids as "[12 7 99]".
  std::string decode(const std::vector<int32_t>& ids) const;
  // The text `completion` adds after `prompt`: decode(prompt + completion) past decode(prompt),
  // since tokenizers such as SentencePiece drop a leading space when ids are decoded on their own.
  // Where decode(prompt) is no prefix of the whole (a prompt ending inside a character that its
  // continuation completes), the text past their longest common prefix, cut at a character
  // boundary. An empty prompt: decode(completion).
  std::string continuation(const std::vector<int32_t>& prompt, const std::vector<int32_t>& completion) const;
};

// A checkpoint loaded for sampling: weights (no optimizer state) and what decodes them.
struct SamplingModel {
  std::string checkpoint;  // file path
  int64_t step = 0;
  model::ModelSpec gpt;
  std::vector<float> params;
  TextCodec codec;
  model::DocumentStarts starts;  // what an unprompted sample starts from (empty in older checkpoints)
  std::string note;  // e.g. why an older checkpoint decodes as bytes ("" when nothing to say)
};

// `source`: a checkpoint file, a run directory (its newest checkpoint) or a checkpoints folder.
// Throws kilter::Error naming the file and what is wrong.
SamplingModel load_sampling_model(const std::string& source);

// The prompt's ids: text through the tokenizer (refused, naming `where`, when the kind has none),
// or given ids. Empty for an empty prompt: see unprompted_start().
std::vector<int32_t> prompt_ids(const TextCodec& codec, const std::string& text, const std::vector<int32_t>& ids,
                                bool ids_given, const std::string& where);

// How many of `docs` (global ids; every document when empty) start with each id, (id, count) by
// id: the first tokens of at most `max_docs` of them, evenly spaced, read from the dataset in
// `dir`. Documents of length 0 start with nothing.
std::vector<std::pair<uint32_t, uint64_t>> count_document_starts(const io::DatasetIndex& index, const std::string& dir,
                                                                 const std::vector<uint64_t>& docs,
                                                                 size_t max_docs = 65536);
model::DocumentStarts to_document_starts(const std::vector<std::pair<uint32_t, uint64_t>>& counts);

// What a sample with an empty prompt feeds first: nothing when there are document starts (the
// first token is drawn from them, see model::DocumentStarts); else (a checkpoint written before
// they were recorded) the EOS id, which the model never saw as an input, so its first tokens are
// poor: `note` then says so.
std::vector<int32_t> unprompted_start(const TextCodec& codec, const model::DocumentStarts& starts,
                                      const std::string& where, std::string& note);

// `output.sample_every`: rank 0 prints a short sample every N optimizer steps (off when 0).
class TrainingSampler {
 public:
  // `starts`: the training documents' first tokens (count_document_starts), for an empty prompt.
  TrainingSampler(const Config& cfg, const io::DatasetIndex& index, int rank, model::DocumentStarts starts);
  // Sharded parameters (train.shard = parameters): rank 0 generates from the units its shard
  // group sends it one at a time (sample_feed.h), never the whole model; every rank of that group
  // holds the feed, the others none.
  void set_sample_feed(SampleFeed* feed) { feed_ = feed; }
  // Called after each optimizer step (`step` = steps completed) on every rank; prints when due.
  void maybe_sample(model::Model& model, int64_t step);

 private:
  model::Generation generate_sample(model::Model& model, const model::SamplingOptions& options);

  SampleFeed* feed_ = nullptr;
  int64_t every_ = 0;
  int tokens_ = 0;
  double temperature_ = 0;
  uint64_t seed_ = 0;
  std::string prompt_;
  std::vector<int32_t> prompt_ids_;
  TextCodec codec_;
  model::DocumentStarts starts_;
  bool active_ = false;
};

}  // namespace kilter::train
