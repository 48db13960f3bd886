// The dataset content hash: 64-bit FNV-1a over a shard's /tokens bytes (little-endian, file
// order) followed by its /offsets bytes (uint64 little-endian). Streamed: it is updated while a
// shard is written and recomputed chunk by chunk by `prep validate` and staging, so no shard is
// ever held in memory. FNV-1a was chosen because anyone can recompute it in five lines of Python
// (docs/data.md shows how); it detects corruption, it is not a defence against forgery.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace kilter::io {

class Fnv1a64 {
 public:
  static constexpr uint64_t kOffsetBasis = 0xcbf29ce484222325ULL;
  static constexpr uint64_t kPrime = 0x100000001b3ULL;

  void update(const void* data, size_t size) {
    const auto* bytes = static_cast<const unsigned char*>(data);
    uint64_t h = state_;
    for (size_t i = 0; i < size; ++i) {
      h ^= bytes[i];
      h *= kPrime;
    }
    state_ = h;
  }
  uint64_t value() const { return state_; }
  // 16 lowercase hex digits, the form stored in DatasetIndex and printed by validate.
  std::string hex() const { return to_hex(state_); }
  static std::string to_hex(uint64_t value) {
    char text[17];
    std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
    return text;
  }

 private:
  uint64_t state_ = kOffsetBasis;
};

}  // namespace kilter::io
