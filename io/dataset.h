// The dataset format (docs/design.md, "Dataset format"): index.h5 + shard-NNNNN.h5, and the index
// every rank plans from. Owner: io.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kilter::io {

constexpr int kFormatVersion = 1;
constexpr const char* kShardFormat = "kilter-shard";   // root attribute `format` of a shard
constexpr const char* kIndexFormat = "kilter-index";   // root attribute `format` of index.h5
constexpr const char* kIndexFileName = "index.h5";
constexpr const char* kHashAlgorithm = "fnv1a64";      // see io/content_hash.h

// "shard-00007.h5" for shard 7.
std::string shard_file_name(uint32_t shard);
// Bytes per stored token: 2 (uint16) up to vocab 65535, 4 (uint32) above.
uint32_t token_bytes_for_vocab(uint32_t vocab_size);

struct ShardInfo {
  std::string file;        // file name inside the dataset directory, e.g. "shard-00000.h5"
  uint64_t num_docs = 0;
  uint64_t num_tokens = 0;
  uint64_t first_doc = 0;  // global id of the shard's first document
  std::string hash;        // content hash (hex) of the shard's /tokens and /offsets
  // Set in a mixture's merged index (io/mixture_index.h) only: the shard file's path, and its
  // number and the shard count in its own dataset (what its attributes say). Empty path: the
  // shard is DIR/shard_file_name(its position in this index).
  std::string path;
  uint32_t own_index = 0, own_count = 0;
};

// Everything a rank needs to plan: loaded from index.h5 alone (shards are not opened).
struct DatasetIndex {
  std::string dir;
  uint32_t vocab_size = 0;
  uint32_t eos_id = 0;
  std::string tokenizer;               // "byte" | "sentencepiece" | "hf-bpe" | "imported" | "synthetic"
  std::string tokenizer_data;          // the tokenizer file's bytes (empty for "byte"): see io/tokenizer/tokenizer.h
  std::vector<ShardInfo> shards;
  std::vector<uint32_t> doc_lengths;   // every document's token count, by global id
  uint64_t total_tokens() const;
  uint64_t num_docs() const { return doc_lengths.size(); }
  // Shard holding global document `doc` (binary search over first_doc).
  uint32_t shard_of(uint64_t doc) const;
};

// What a job that wrote a dataset reports of it (prep, prep synth, the imports).
struct DatasetReport {
  std::string out;
  std::string tokenizer;  // the kind recorded in index.h5
  uint32_t vocab_size = 0;
  uint32_t eos_id = 0;
  uint64_t documents = 0;
  uint64_t tokens = 0;
  uint64_t input_bytes = 0;  // read from the files (compressed bytes for .gz/.zst)
  uint32_t shards = 0;
  double seconds = 0;
  // out, and the figures the index of the dataset written there holds.
  void describe(const DatasetIndex& index, const std::string& dir);
};

// Reads and checks index.h5 in `dir`; throws kilter::Error naming the file and the problem.
// Cheap checks only: index attributes and counts, then every shard's header (attributes agree
// with the index, /tokens dtype, length, contiguous layout, file not truncated). Token contents
// and hashes are checked by validate_dataset().
DatasetIndex load_index(const std::string& dir);

// Reads index.h5 without judging it: throws only when the file or one of its datasets cannot be
// read at all. index_problems() then lists what is inconsistent.
DatasetIndex read_index_file(const std::string& dir);
std::vector<std::string> index_problems(const DatasetIndex& index);

// Writes index.h5 at `path` (the caller renames it into place).
void write_index(const std::string& path, const DatasetIndex& index);

// Where a shard's tokens lie in its file: what the reader and the header checks need.
struct ShardLayout {
  std::string path;
  uint64_t tokens_file_offset = 0;  // H5Dget_offset of /tokens
  uint32_t token_bytes = 2;         // 2: uint16, 4: uint32
  uint64_t num_tokens = 0;
  uint64_t num_docs = 0;
  uint64_t file_size = 0;
};

// Header checks of shard `shard` in `dir` against the index (no token data is read). Returns
// the problems found, each naming the file; fills `layout` when it is not null.
std::vector<std::string> check_shard_header(const DatasetIndex& index, const std::string& dir,
                                            uint32_t shard, ShardLayout* layout = nullptr);
// Full content checks: /offsets invariants and agreement with the index's document lengths,
// every token < vocab_size, and the content hash. Streams the shard in bounded chunks.
std::vector<std::string> check_shard_content(const DatasetIndex& index, const std::string& dir,
                                             uint32_t shard);
// The content hash (hex) of the shard file at `path`, computed from its datasets.
std::string shard_content_hash(const std::string& path);

// Everything `kilter prep validate` checks; an empty result means the dataset is sound.
std::vector<std::string> validate_dataset(const std::string& dir);

}  // namespace kilter::io
