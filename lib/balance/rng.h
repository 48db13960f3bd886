// The plan's portable random numbers: splitmix64 to seed, xoshiro256** to draw, Lemire's
// unbiased bounded integers and Fisher-Yates. Every rank of every machine must draw the same
// numbers from the same (seed, epoch, stream), so nothing here uses std:: distributions or
// std::shuffle, whose output is implementation-defined.
#pragma once
#include <cstddef>
#include <cstdint>
#include <utility>

namespace kilter::balance {

// One step of splitmix64: advances `state` and returns a well-mixed 64-bit value.
inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Stateless hash of one value (splitmix64's finalizer), for per-document decisions.
inline uint64_t mix64(uint64_t x) {
  uint64_t state = x;
  return splitmix64(state);
}

// Independent random streams of one plan; the numbers name what each stream shuffles.
enum class RngStream : uint64_t {
  kPieceOrder = 1,       // order of pieces inside a length bucket
  kMicroBatchOrder = 2,  // order of micro-batches across the epoch
  kNaiveOrder = 3,       // naive sampler: order of all sequences
  kEvalSplit = 4,        // held-out documents
  kSynthetic = 5,        // synthetic document lengths (benchmarks)
};

class Xoshiro256 {
 public:
  explicit Xoshiro256(uint64_t seed) {
    uint64_t sm = seed;
    for (uint64_t& word : s_) word = splitmix64(sm);
  }
  // A stream derived from (seed, epoch, stream): different for every triple.
  Xoshiro256(uint64_t seed, uint64_t epoch, RngStream stream)
      : Xoshiro256(mix64(mix64(seed) ^ mix64(epoch + 0x632BE59BD9B4E019ull) ^
                         mix64(static_cast<uint64_t>(stream) * 0x85EBCA77C2B2AE63ull))) {}

  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  // Uniform integer in [0, n), n >= 1, without modulo bias (Lemire 2019).
  uint64_t below(uint64_t n) {
    unsigned __int128 m = static_cast<unsigned __int128>(next()) * n;
    uint64_t low = static_cast<uint64_t>(m);
    if (low < n) {
      const uint64_t threshold = (0 - n) % n;
      while (low < threshold) {
        m = static_cast<unsigned __int128>(next()) * n;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }

  // Uniform double in (0, 1]: 53 random bits, never 0 (safe for log()).
  double uniform_open0() { return (static_cast<double>(next() >> 11) + 1.0) * 0x1.0p-53; }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

// Fisher-Yates shuffle of [first, first + n).
template <class T>
void fisher_yates(T* first, size_t n, Xoshiro256& rng) {
  for (size_t i = n; i > 1; --i) {
    const size_t j = static_cast<size_t>(rng.below(i));
    std::swap(first[i - 1], first[j]);
  }
}

}  // namespace kilter::balance
