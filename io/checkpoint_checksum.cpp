// The checkpoint datasets' checksum (see checkpoint_checksum.h). Fast enough to run over every
// checkpoint in the writer thread, and any flipped or zeroed region changes it.
#include "io/checkpoint_checksum.h"

#include <cstring>

#include "io/checkpoint.h"

namespace kilter::io {
namespace {

constexpr uint64_t k1 = 0x87c37b91114253d5ull, k2 = 0x4cf5ad432745937full;

uint64_t hash_bytes(const void* data, size_t n_bytes, uint64_t count) {
  StreamHash hash(count);
  hash.update(data, n_bytes);
  return hash.finish();
}

}  // namespace

StreamHash::StreamHash(uint64_t count) : h_(0x9e3779b97f4a7c15ull ^ (count * k2)) {}

void StreamHash::update(const void* data, size_t n_bytes) {
  const unsigned char* bytes = static_cast<const unsigned char*>(data);
  while (n_bytes > 0 && carried_ > 0 && carried_ < 8) {  // complete a word cut by the last piece
    carry_[carried_++] = *bytes++;
    --n_bytes;
    if (carried_ == 8) {
      mix(carry_);
      carried_ = 0;
    }
  }
  size_t i = 0;
  for (; i + 8 <= n_bytes; i += 8) mix(bytes + i);
  for (; i < n_bytes; ++i) carry_[carried_++] = bytes[i];
}

uint64_t StreamHash::finish() {
  uint64_t h = h_;
  if (carried_ > 0) {
    uint64_t w = 0;
    std::memcpy(&w, carry_, carried_);
    w *= k1;
    w = (w << 31) | (w >> 33);
    h ^= w * k2;
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

void StreamHash::mix(const unsigned char* word) {
  uint64_t w;
  std::memcpy(&w, word, 8);
  w *= k1;
  w = (w << 31) | (w >> 33);
  w *= k2;
  h_ ^= w;
  h_ = ((h_ << 27) | (h_ >> 37)) * 5 + 0x52dce729;
}

uint64_t checkpoint_checksum(const float* data, size_t count) {
  return hash_bytes(data, count * sizeof(float), count);
}

uint64_t checkpoint_checksum_bytes(const void* data, size_t n_bytes) { return hash_bytes(data, n_bytes, n_bytes); }

}  // namespace kilter::io
