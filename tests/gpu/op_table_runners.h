// The runners of the op table's families (op_table.h) on the CUDA backend: one function per
// family that runs a case's kernels, forward and backward, on fresh random inputs and compares
// each output with the CPU twin within the case's tolerances. gpu_op_table_test.cpp drives them.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "lib/backend/cuda_ops.h"
#include "lib/model/bf16_ops.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/op_table.h"

namespace kilter::optable {

namespace kc = kilter::model::cuda;

// What a runner gets: the case, the checks' reporter, and the GEMM engine of the case's math on
// the compute stream.
struct CaseContext {
  const OpCase& c;
  gputest::Checker& check;
  kc::Gemm& gemm;
  cudaStream_t stream() const { return gemm.stream(); }
  std::string tag(const std::string& what) const { return c.name() + ": " + what; }
};

using Runner = void (*)(CaseContext&);
using RunnerMap = std::map<std::string, Runner>;

void add_fp32_runners(RunnerMap& runners);       // op_table_fp32.cpp
void add_attention_runners(RunnerMap& runners);  // op_table_attention.cpp
void add_bf16_runners(RunnerMap& runners);       // op_table_bf16.cpp
// RoPE on fp32 or bf16 q|k|v rows (op_table_fp32.cpp; the rope and rope_bf16 rows).
void run_rope_rows(CaseContext& x, bool bf16_rows);

// bf16-valued floats (the bf16 datapath's activations, held in floats on the host).
inline std::vector<float> bf16_values(size_t n, float scale = 1.0f) {
  std::vector<float> v = gputest::random_floats(n, scale);
  model::round_bf16_inplace(v.data(), v.size());
  return v;
}

inline std::vector<model::bf16> host_bf16(const std::vector<float>& values) {
  std::vector<model::bf16> out(values.size());
  model::to_bf16(out.data(), values.data(), values.size());
  return out;
}

// bf16 rows on the device, filled from and read back as floats (through to_bf16 / to_float,
// which the convert_bf16 rows check bit for bit against model::round_bf16).
class Bf16Device {
 public:
  Bf16Device(size_t n, cudaStream_t stream) : data_(n), staging_(n), n_(n), stream_(stream) {}
  Bf16Device(const std::vector<float>& host, cudaStream_t stream) : Bf16Device(host.size(), stream) { upload(host); }
  void upload(const std::vector<float>& host) {
    KILTER_CUDA_CHECK(cudaMemcpy(staging_.get(), host.data(), sizeof(float) * n_, cudaMemcpyHostToDevice));
    KILTER_CUDA_CHECK(cudaDeviceSynchronize());
    kc::to_bf16(data_.get(), staging_.get(), n_, stream_);
  }
  std::vector<float> download() {
    kc::to_float(staging_.get(), data_.get(), n_, stream_);
    return staging_.download();
  }
  kc::bf16* get() { return data_.get(); }

 private:
  gputest::DeviceBuffer<kc::bf16> data_;
  gputest::DeviceBuffer<float> staging_;
  size_t n_;
  cudaStream_t stream_;
};

}  // namespace kilter::optable
