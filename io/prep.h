// `kilter prep` and `kilter prep synth` as library calls: corpus -> tokens -> N shards of
// roughly equal token count + index.h5, written into a temporary directory that is renamed into
// place only when complete. Memory holds the document lengths only: the byte tokenizer reads the
// input twice (lengths, then tokens); a real tokenizer (--tokenizer) encodes batches of documents
// on every core in one pass, spilling the tokens in order to a temporary file that the second
// pass copies into the shards.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/corpus.h"
#include "io/dataset.h"

namespace kilter::io {

// Byte-level tokenizer: token = byte value, EOS = 256 (never stored; see io/reader.h).
constexpr uint32_t kByteVocabSize = 257;
constexpr uint32_t kByteEosId = 256;

struct PrepOptions {
  std::vector<std::string> inputs;
  InputFormat format = InputFormat::text;
  uint32_t shards = 1;
  std::string out;
  bool force = false;     // replace an existing non-empty output directory
  bool progress = true;   // progress on stderr
  std::string tokenizer;  // a SentencePiece *.model or a tokenizer.json; empty: bytes
  unsigned threads = 0;   // tokenizer threads, and Parquet row groups decoded at once (0: every core)
  bool bos = false;       // --bos: the tokenizer's BOS id before every document (refused where it has none)
  CorpusOptions corpus;   // jsonl: --text-key, --max-bad-lines; parquet: --text-key
};

struct PrepReport : DatasetReport {
  int64_t bos_id = -1;  // put before every document (--bos); -1: none
  uint64_t empty_documents = 0;  // dropped (prep only)
  uint64_t bad_lines = 0;          // jsonl lines skipped under --max-bad-lines
  std::vector<std::string> bad_line_examples;  // "FILE:LINE: what" of the first few
  uint64_t null_cells = 0;        // parquet: null cells skipped
  uint64_t non_string_cells = 0;  // parquet: cells of a column that holds no strings, skipped
  uint64_t min_shard_tokens = 0;
  uint64_t max_shard_tokens = 0;
};

PrepReport prepare_dataset(const PrepOptions& options);

// Document lengths for `prep synth`: "lognormal:MU,SIGMA[,MAX]" (length = round(exp(N(MU,SIGMA))),
// clamped to [1, MAX]) or "uniform:MIN,MAX" (inclusive, MIN >= 1).
struct LengthDistribution {
  enum class Kind { lognormal, uniform } kind = Kind::lognormal;
  double mu = 0, sigma = 0;
  uint64_t min = 1, max = UINT32_MAX;
  static LengthDistribution parse(const std::string& spec);  // throws naming --lengths
};

struct SynthOptions {
  uint64_t docs = 1000;
  std::string lengths = "lognormal:5,1,4096";
  uint32_t vocab = 50257;   // tokens uniform in [0, vocab-1); eos_id = vocab-1
  uint32_t shards = 1;
  uint64_t seed = 1;
  std::string out;
  bool force = false;
  bool progress = true;
};

PrepReport synthesize_dataset(const SynthOptions& options);

// Splits documents (in order) into `num_shards` contiguous runs of roughly equal token count,
// each holding at least one document. Returns the first document of each shard, plus the end.
std::vector<uint64_t> assign_shards(const std::vector<uint32_t>& lengths, uint32_t num_shards);

}  // namespace kilter::io
