// A tiny harness for the GPU tests (tests/gpu/*.cpp): device buffers, fresh random inputs, the
// padded (B,T) rows the attention engines take and the packed rows their CPU twins take, and
// comparisons against the CPU twin with a stated tolerance. No GoogleTest on purpose: these
// binaries must build and run on a GPU machine that has only the CUDA toolkit. A binary exits 0
// when every check passes, 1 on a failure, and 77 (ctest SKIP_RETURN_CODE) with
// "SKIPPED: no CUDA device (<reason>)" when there is no usable device.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "io/base/cuda_common.h"
#include "lib/backend/cuda_model.h"

namespace kilter::gputest {

constexpr int kSkipCode = 77;

// Exits with the skip code when no device is usable (the reason from cudaGetDeviceCount).
inline void skip_without_device() {
  const std::string reason = backend::cuda_device_absent_reason();
  if (!reason.empty()) {
    std::printf("SKIPPED: no CUDA device (%s)\n", reason.c_str());
    std::fflush(stdout);
    std::exit(kSkipCode);
  }
}

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

// A device copy of a host vector that frees itself.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const std::vector<T>& host) : size_(host.size()) {
    KILTER_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr_), sizeof(T) * std::max<size_t>(size_, 1)));
    if (size_ > 0) KILTER_CUDA_CHECK(cudaMemcpy(ptr_, host.data(), sizeof(T) * size_, cudaMemcpyHostToDevice));
    // Kernels run on a non-blocking stream, which does not wait for the legacy stream's copy.
    KILTER_CUDA_CHECK(cudaDeviceSynchronize());
  }
  explicit DeviceBuffer(size_t n) : DeviceBuffer(std::vector<T>(n)) {}
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() { return ptr_; }
  std::vector<T> download() const {
    std::vector<T> host(size_);
    KILTER_CUDA_CHECK(cudaDeviceSynchronize());
    if (size_ > 0) KILTER_CUDA_CHECK(cudaMemcpy(host.data(), ptr_, sizeof(T) * size_, cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  T* ptr_ = nullptr;
  size_t size_;
};

// Counts checks and failures; prints one line per comparison.
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
    if (!ok) ++failures_;
    std::printf("  %-4s %-48s %.4f of the elements bit for bit (at least %.2f)\n", ok ? "ok" : "FAIL", name.c_str(),
                fraction, min_same);
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
    if (!condition) ++failures_;
    std::printf("  %-4s %s%s%s\n", condition ? "ok" : "FAIL", name.c_str(), detail.empty() ? "" : ": ", detail.c_str());
    return condition;
  }
  int finish(const char* binary) const {
    std::printf("%s: %d checks, %d failed\n", binary, checks_, failures_);
    return failures_ == 0 ? 0 : 1;
  }

 private:
  void report(const std::string& name, bool ok, double error, double tolerance, const char* note) {
    if (!ok) ++failures_;
    std::printf("  %-4s %-48s rel.err %.3e (tol %.1e)%s\n", ok ? "ok" : "FAIL", name.c_str(), error, tolerance, note);
  }
  int checks_ = 0;
  int failures_ = 0;
};

// A model's gradient (num_params floats) on the host, once its stream has drained.
inline std::vector<float> device_grads(model::Model& m) {
  m.synchronize();
  std::vector<float> host(m.layout().num_params);
  KILTER_CUDA_CHECK(cudaMemcpy(host.data(), m.grads(), sizeof(float) * host.size(), cudaMemcpyDeviceToHost));
  return host;
}

// The CUDA backend's options of a test case. bf16 storage is off unless asked for: the cases
// written before it compare the fp32-activation datapath with the fp32 CPU model.
inline model::BackendOptions with(const std::string& precision, const std::string& attention, bool graphs = false,
                                  const std::string& recompute = "none", const std::string& bf16_storage = "off") {
  model::BackendOptions options;
  options.precision = precision;
  options.attention = attention;
  options.cuda_graphs = graphs;
  options.recompute = recompute;
  options.bf16_storage = bf16_storage;
  return options;
}

// The bf16-storage datapath's options (train.bf16_storage = on).
inline model::BackendOptions bf16_storage(const std::string& recompute = "none", bool graphs = false) {
  return with("bf16", "cublaslt", graphs, recompute, "on");
}

// The bf16-storage datapath with cuDNN SDPA attention insisted on (train.attention = sdpa).
inline model::BackendOptions bf16_storage_sdpa(const std::string& recompute = "none") {
  return with("bf16", "sdpa", false, recompute, "on");
}

// Why cuDNN SDPA cannot run here, "" when it can: this kilter was built without cudnn-frontend, or
// cuDNN refuses on this machine (older than 9.6, say). The SDPA cases are then reported, not failed.
inline std::string sdpa_absent_reason(const model::ModelSpec& cfg) {
  try {
    backend::make_cuda_model(cfg, 1, bf16_storage_sdpa());
    return "";
  } catch (const Error& e) {
    const std::string what = e.what();
    if (what.find("built without cuDNN SDPA") != std::string::npos ||
        what.find("cannot be used on device") != std::string::npos)
      return what;
    throw;
  }
}

// Whether a CUDA model runs the bf16-storage datapath (its describe() says so).
inline bool runs_bf16_storage(const model::Model& m) {
  return m.describe().find("activations bf16") != std::string::npos;
}

}  // namespace kilter::gputest
