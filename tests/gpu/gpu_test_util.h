// The device side of the GPU tests' harness (tests/gpu/*.cpp, GoogleTest): device buffers, the
// CUDA backend's options of a case, and the skip where no device is usable. The comparisons and
// random inputs are in compare.h (no CUDA). Every test of these binaries derives from DeviceTest,
// which skips it (GTEST_SKIP, "no CUDA device (<reason>)") where there is no usable device, and
// their main (gpu_test_main.cpp) then exits 77, which ctest (SKIP_RETURN_CODE 77) and
// tests/gpu/device-check.sh report as skipped.
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "lib/backend/cuda_common.h"
#include "lib/backend/cuda_model.h"
#include "tests/gpu/compare.h"

namespace kilter::gputest {

constexpr int kSkipCode = 77;

// Why no CUDA device is usable here (from cudaGetDeviceCount), "" when one is; asked once.
// The arguments GoogleTest left after its own flags (tests/gpu/gpu_test_main.cpp keeps them), and
// the value after `name` among them ("" when absent): e.g. kilter_gpu_sdpa_test --case TEXT.
inline std::vector<std::string>& test_arguments() {
  static std::vector<std::string> arguments;
  return arguments;
}
inline std::string test_option(const std::string& name) {
  const std::vector<std::string>& a = test_arguments();
  for (size_t i = 0; i + 1 < a.size(); ++i)
    if (a[i] == name) return a[i + 1];
  return "";
}

inline const std::string& device_absent_reason() {
  static const std::string reason = backend::cuda_device_absent_reason();
  return reason;
}

// The base of every device test: skipped where no device is usable.
class DeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!device_absent_reason().empty()) GTEST_SKIP() << "no CUDA device (" << device_absent_reason() << ")";
    backend::cuda_device_index();
  }
};

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
