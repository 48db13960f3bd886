// What the device tests and the op table's CPU part share, without CUDA: fresh random inputs (the
// seed printed, KILTER_TEST_SEED=<n> to repeat a run), the padded (B,T) rows the attention engines
// take and the packed rows their CPU twins take, and comparisons against the CPU twin with a stated
// tolerance, each printed as one line and reported to GoogleTest as a failure when out of bounds.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace kilter::gputest {

// Fresh inputs every run; KILTER_TEST_SEED=<n> reproduces a failing run (the seed is printed).
inline uint64_t test_seed() {
  const char* fixed = std::getenv("KILTER_TEST_SEED");
  const uint64_t seed = fixed ? std::strtoull(fixed, nullptr, 10)
                              : static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  std::printf("seed %llu (rerun with KILTER_TEST_SEED=%llu)\n", static_cast<unsigned long long>(seed),
              static_cast<unsigned long long>(seed));
  return seed;
}

inline std::mt19937_64& rng() {
  static std::mt19937_64 generator(test_seed());
  return generator;
}

inline std::vector<float> random_floats(size_t n, float scale = 1.0f) {
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng());
  return v;
}

inline int random_int(int lo, int hi) {  // inclusive
  return std::uniform_int_distribution<int>(lo, hi)(rng());
}

// Row lengths of a padded (B,T) attention group: one full row, the others ragged.
inline std::vector<int32_t> random_lengths(int B, int T) {
  std::vector<int32_t> lengths(B);
  for (int b = 0; b < B; ++b) lengths[b] = b == 0 ? T : random_int(1, T);
  return lengths;
}

// cu_seqlens of pieces of these lengths: 0, then the running sums.
inline std::vector<int32_t> offsets_of(const std::vector<int32_t>& lengths) {
  std::vector<int32_t> cu = {0};
  for (int32_t len : lengths) cu.push_back(cu.back() + len);
  return cu;
}

// The CPU twins are packed-only (model.h); the padded engines' (B,T,lengths) problems are
// compared by packing their real rows: padded (B,T,W) rows <-> packed (sum lengths, W).
inline std::vector<float> pack_rows(const std::vector<float>& padded, const std::vector<int32_t>& lengths, int T,
                                    int W) {
  std::vector<float> packed;
  for (size_t b = 0; b < lengths.size(); ++b)
    packed.insert(packed.end(), padded.begin() + b * T * W, padded.begin() + (b * T + lengths[b]) * W);
  return packed;
}
// Writes the packed rows back over the real rows of `padded`; padded rows keep their values.
inline void unpack_rows(std::vector<float>& padded, const std::vector<float>& packed,
                        const std::vector<int32_t>& lengths, int T, int W) {
  size_t row = 0;
  for (size_t b = 0; b < lengths.size(); ++b)
    for (int t = 0; t < lengths[b]; ++t, ++row)
      std::copy(packed.begin() + row * W, packed.begin() + (row + 1) * W, padded.begin() + (b * T + t) * W);
}

// Prints one line per comparison and reports each one out of bounds to GoogleTest (ADD_FAILURE:
// the test goes on, so one run shows every check of a case).
class Checker {
 public:
  // max |gpu - cpu| / max(max |cpu|, 1e-12) <= tolerance (error relative to the tensor's scale,
  // the measure the PyTorch parity test uses too). Non-finite values always fail.
  bool near(const std::string& name, const std::vector<float>& gpu, const std::vector<float>& cpu, double tolerance) {
    ++checks_;
    double max_diff = 0.0, scale = 0.0;
    bool finite = gpu.size() == cpu.size();
    for (size_t i = 0; i < gpu.size() && i < cpu.size(); ++i) {
      if (!std::isfinite(gpu[i]) || !std::isfinite(cpu[i])) finite = false;
      max_diff = std::max(max_diff, std::fabs(static_cast<double>(gpu[i]) - cpu[i]));
      scale = std::max(scale, std::fabs(static_cast<double>(cpu[i])));
    }
    const double error = max_diff / std::max(scale, 1e-12);
    const bool ok = finite && error <= tolerance;
    report(name, ok, error, tolerance, finite ? "" : " (size mismatch or non-finite values)");
    return ok;
  }
  // A bf16 output against its twin, which rounds at the same points: within `tolerance` of the
  // tensor's scale, AND at least `min_same` of the elements bit for bit (summation orders differ
  // in fp32, so a value within an fp32 rounding of a bf16 boundary may round the other way; a
  // kernel that rounds at other points differs in about half of them).
  bool near_bf16(const std::string& name, const std::vector<float>& gpu, const std::vector<float>& cpu,
                 double tolerance, double min_same) {
    size_t same = 0;
    for (size_t i = 0; i < gpu.size() && i < cpu.size(); ++i) same += gpu[i] == cpu[i];
    const double fraction = cpu.empty() ? 1.0 : static_cast<double>(same) / cpu.size();
    const bool close = near(name, gpu, cpu, tolerance);
    ++checks_;
    const bool ok = fraction >= min_same;
    std::printf("  %-4s %-48s %.4f of the elements bit for bit (at least %.2f)\n", ok ? "ok" : "FAIL", name.c_str(),
                fraction, min_same);
    if (!ok) fail(name, std::to_string(fraction) + " of the elements bit for bit, at least " + std::to_string(min_same));
    return close && ok;
  }
  bool near_scalar(const std::string& name, double gpu, double cpu, double tolerance) {
    ++checks_;
    const double error = std::fabs(gpu - cpu) / std::max(std::fabs(cpu), 1e-12);
    const bool ok = std::isfinite(gpu) && error <= tolerance;
    report(name, ok, error, tolerance, "");
    return ok;
  }
  bool expect(const std::string& name, bool condition, const std::string& detail = "") {
    ++checks_;
    std::printf("  %-4s %s%s%s\n", condition ? "ok" : "FAIL", name.c_str(), detail.empty() ? "" : ": ", detail.c_str());
    if (!condition) fail(name, detail);
    return condition;
  }
  int checks() const { return checks_; }
  int failures() const { return failures_; }

 private:
  void report(const std::string& name, bool ok, double error, double tolerance, const char* note) {
    std::printf("  %-4s %-48s rel.err %.3e (tol %.1e)%s\n", ok ? "ok" : "FAIL", name.c_str(), error, tolerance, note);
    if (!ok) fail(name, "relative error " + std::to_string(error) + " above " + std::to_string(tolerance) + note);
  }
  void fail(const std::string& name, const std::string& detail) {
    ++failures_;
    ADD_FAILURE() << name << (detail.empty() ? "" : ": ") << detail;
  }
  int checks_ = 0;
  int failures_ = 0;
};

}  // namespace kilter::gputest
