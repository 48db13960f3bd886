// The op table (op_table.h) on the CUDA backend: one GoogleTest case per row, its kernels against
// the CPU twin within the row's tolerances (as ggml's test-backend-ops runs its table on every
// backend). The CUDA backend is the only device backend this build compiles; a row runs on the
// compute stream with a GEMM engine of the row's math. Without a usable device every row is
// skipped (GTEST_SKIP) and the binary exits 77 (gpu_test_main.cpp). Filter rows by name with
// --gtest_filter='*attention*'; KILTER_TEST_SEED=<n> repeats a run's inputs.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>

#include "tests/gpu/op_table_runners.h"

namespace kilter::optable {
namespace {

const RunnerMap& runners() {
  static const RunnerMap map = [] {
    RunnerMap m;
    add_fp32_runners(m);
    add_attention_runners(m);
    add_bf16_runners(m);
    return m;
  }();
  return map;
}

// The GEMM engine of a row's math; bf16_inputs is read from the environment when it is made.
std::unique_ptr<kc::Gemm> gemm_for(Math math, cudaStream_t stream) {
  if (math == Math::fp32) return std::make_unique<kc::Gemm>(stream, kc::GemmMath::fp32);
  if (math == Math::bf16) return std::make_unique<kc::Gemm>(stream, kc::GemmMath::bf16);
  setenv("KILTER_CUDA_BF16_INPUTS", "1", 1);
  auto gemm = std::make_unique<kc::Gemm>(stream, kc::GemmMath::bf16);
  unsetenv("KILTER_CUDA_BF16_INPUTS");
  return gemm;
}

class CudaOpTable : public ::testing::TestWithParam<OpCase> {
 protected:
  void SetUp() override {
    const std::string& reason = gputest::device_absent_reason();
    if (!reason.empty()) GTEST_SKIP() << "no CUDA device (" << reason << ")";
    backend::cuda_device_index();
  }
};

TEST_P(CudaOpTable, MatchesCpuTwin) {
  const OpCase& c = GetParam();
  const auto runner = runners().find(c.family);
  ASSERT_NE(runner, runners().end()) << "op family " << c.family << " has no CUDA runner (op_table_runners.h)";
  std::printf("%s (twin: %s)\n", c.name().c_str(), find_family(c.family)->twin.c_str());
  try {
    const std::unique_ptr<kc::Gemm> gemm = gemm_for(c.math, backend::cuda_compute_stream());
    gputest::Checker check;
    CaseContext context{c, check, *gemm};
    runner->second(context);
    KILTER_CUDA_CHECK(cudaDeviceSynchronize());
  } catch (const std::exception& e) {
    FAIL() << c.name() << " threw: " << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaOpTable, ::testing::ValuesIn(op_cases()),
                         [](const ::testing::TestParamInfo<OpCase>& info) { return info.param.name(); });

// Every family of the table has a CUDA runner, and every runner a family (no device needed).
TEST(CudaOpTableRunners, OneRunnerPerFamily) {
  for (const OpFamily& family : op_families())
    EXPECT_TRUE(runners().count(family.name)) << "op family " << family.name << " has no CUDA runner";
  for (const auto& [name, runner] : runners())
    EXPECT_NE(find_family(name), nullptr) << "runner " << name << " has no family in op_table_cases.cpp";
}

}  // namespace
}  // namespace kilter::optable
