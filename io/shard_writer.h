// Writes one dataset shard (docs/design.md "Dataset format") in a single streaming pass: the
// document lengths are known in advance (prep's first pass), so /tokens is created contiguous at
// its final size and filled in order through a bounded buffer while the content hash is updated.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "io/content_hash.h"
#include "io/hdf5_util.h"

namespace kilter::io {

struct ShardHeader {
  uint32_t vocab_size = 0;
  uint32_t eos_id = 0;
  std::string tokenizer;  // "byte" for prep, "synthetic" for prep synth
  uint32_t shard_index = 0;
  uint32_t num_shards = 0;
};

class ShardWriter {
 public:
  // Creates `path` with /offsets (from doc_lengths) and an allocated, unfilled /tokens.
  ShardWriter(const std::string& path, const ShardHeader& header,
              const std::vector<uint32_t>& doc_lengths);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Appends tokens of the current document (any number of calls per document).
  void append(const uint32_t* tokens, size_t count);
  void append_bytes(const unsigned char* bytes, size_t count);  // byte tokenizer
  // Ends the current document; throws when its length differs from the announced one.
  void end_document();
  // Flushes, checks that every document was written, closes. Returns the content hash (hex).
  std::string finish();

 private:
  template <typename T> void append_as(const T* tokens, size_t count);
  void flush();

  std::string path_;
  ShardHeader header_;
  std::vector<uint32_t> doc_lengths_;
  uint32_t token_bytes_ = 2;
  uint64_t total_tokens_ = 0;
  uint64_t written_ = 0;        // tokens flushed to the file
  uint64_t doc_ = 0;            // documents completed
  uint64_t doc_tokens_ = 0;     // tokens of the current document so far
  std::vector<unsigned char> buffer_;  // pending tokens in their on-disk width
  size_t buffered_ = 0;                // tokens in buffer_
  Fnv1a64 hash_;
  h5::Handle file_;
  h5::Handle tokens_;
  bool finished_ = false;
};

}  // namespace kilter::io
