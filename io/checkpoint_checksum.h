// The checksum that every dataset of a checkpoint carries in its `checksum` attribute (internal
// to io/checkpoint_*.cpp; checkpoint_checksum() of float data is public, in checkpoint.h): a hash
// of the dataset's bytes, so a file damaged after it was written is refused instead of resumed.
#pragma once
#include <cstddef>
#include <cstdint>

namespace kilter::io {

// Word-wise multiply-rotate mix (murmur-style constants) of a byte stream, seeded with `count`
// (the number of floats, or of bytes for /tokenizer_data), fed in pieces of any size: the result
// does not depend on how the stream was cut (finish_checkpoint_file hashes tensors piece by piece).
class StreamHash {
 public:
  explicit StreamHash(uint64_t count);
  void update(const void* data, size_t n_bytes);
  uint64_t finish();

 private:
  void mix(const unsigned char* word);
  uint64_t h_;
  unsigned char carry_[8] = {};
  size_t carried_ = 0;
};

// The checksum of a dataset of bytes or integers (/tokenizer_data, /document_starts).
uint64_t checkpoint_checksum_bytes(const void* data, size_t n_bytes);

}  // namespace kilter::io
