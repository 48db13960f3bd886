// The dataset format (DESIGN.md, "Dataset format"): index.h5 + shard-NNNNN.h5, and the index
// every rank plans from. Owner: io (issue 3).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kilter::io {

constexpr int kFormatVersion = 1;

struct ShardInfo {
  std::string file;        // file name inside the dataset directory, e.g. "shard-00000.h5"
  uint64_t num_docs = 0;
  uint64_t num_tokens = 0;
  uint64_t first_doc = 0;  // global id of the shard's first document
  std::string hash;        // content hash (hex) of the shard's /tokens and /offsets
};

// Everything a rank needs to plan: loaded from index.h5 alone (shards are not opened).
struct DatasetIndex {
  std::string dir;
  uint32_t vocab_size = 0;
  uint32_t eos_id = 0;
  std::string tokenizer;               // "byte"
  std::vector<ShardInfo> shards;
  std::vector<uint32_t> doc_lengths;   // every document's token count, by global id
  uint64_t total_tokens() const;
  uint64_t num_docs() const { return doc_lengths.size(); }
  // Shard holding global document `doc` (binary search over first_doc).
  uint32_t shard_of(uint64_t doc) const;
};

// Reads and checks index.h5 in `dir`; throws kilter::Error naming the file and the problem.
DatasetIndex load_index(const std::string& dir);

}  // namespace kilter::io
