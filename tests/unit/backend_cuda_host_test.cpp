// The CUDA backend's host side, which needs no device (built only with CUDA; the CPU machine
// runs it): kilter does not link cuBLASLt, and the table of its functions loads on first use
// (lib/backend/cublaslt_loader.h); the device-memory query answers false without a device; the
// memory plan's figures of the bf16-storage datapath, with the groups' attention and with cuDNN SDPA.
#include <gtest/gtest.h>

#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "lib/backend/cublaslt_loader.h"
#include "lib/backend/cuda_memory.h"
#include "lib/model/layout.h"
#include "lib/model/model.h"

namespace {

TEST(CublasLtLoader, NotLoadedUntilAskedThenEveryFunction) {
  // Nothing before the first call: the process did not map the library at start-up.
  const std::string soname = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
  EXPECT_EQ(dlopen(soname.c_str(), RTLD_NOW | RTLD_NOLOAD), nullptr) << soname << " was mapped before first use";
  const kilter::backend::CublasLt& lt = kilter::backend::cublaslt();
  for (const void* fn : {reinterpret_cast<const void*>(lt.Create), reinterpret_cast<const void*>(lt.Destroy),
                         reinterpret_cast<const void*>(lt.Matmul), reinterpret_cast<const void*>(lt.MatmulAlgoGetHeuristic),
                         reinterpret_cast<const void*>(lt.MatmulDescCreate), reinterpret_cast<const void*>(lt.MatmulDescDestroy),
                         reinterpret_cast<const void*>(lt.MatmulDescSetAttribute),
                         reinterpret_cast<const void*>(lt.MatmulPreferenceCreate),
                         reinterpret_cast<const void*>(lt.MatmulPreferenceDestroy),
                         reinterpret_cast<const void*>(lt.MatmulPreferenceSetAttribute),
                         reinterpret_cast<const void*>(lt.MatrixLayoutCreate),
                         reinterpret_cast<const void*>(lt.MatrixLayoutDestroy),
                         reinterpret_cast<const void*>(lt.MatrixLayoutSetAttribute)})
    EXPECT_NE(fn, nullptr);
  // Descriptors need no device: one round trip through the loaded library.
  cublasLtMatrixLayout_t layout = nullptr;
  ASSERT_EQ(lt.MatrixLayoutCreate(&layout, CUDA_R_32F, 4, 3, 4), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(lt.MatrixLayoutDestroy(layout), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(&kilter::backend::cublaslt(), &lt) << "loaded once";
}

TEST(CudaDeviceMemory, FalseWithoutADevice) {
  if (kilter::model::cuda_available()) GTEST_SKIP() << "a CUDA device is present";
  uint64_t free_bytes = 1, total_bytes = 1;
  EXPECT_FALSE(kilter::model::cuda_device_memory(&free_bytes, &total_bytes));
  EXPECT_EQ(free_bytes, 1u);
}

}  // namespace

// The memory plan of the bf16-storage datapath (lib/backend/cuda_memory.h): GPT-2 124M, 16 x 1024
// tokens, recompute none, at most half of the 24.94 GiB the fp32-activation datapath took on the
// H200 (issue 37's target), and less than half of its own fp32-activation figure; a Llama shape's
// bf16 figure counts the SwiGLU gradient and the weights' bf16 copy (more than the fp32 weights
// alone).
TEST(CudaMemoryPlan, Bf16StorageAtMostHalfOfTheFp32Datapath) {
  kilter::model::ModelSpec gpt2;
  gpt2.n_layer = 12, gpt2.n_head = 12, gpt2.n_embd = 768, gpt2.block_size = 1024, gpt2.vocab_size = 50257;
  const kilter::model::ParamLayout layout = kilter::model::ParamLayout::build(gpt2, 64);
  const auto fp32 = kilter::backend::cuda_device_bytes(gpt2, layout.padded_size, layout.num_params, 16384, "none",
                                                       false, false);
  const auto bf16 = kilter::backend::cuda_device_bytes(gpt2, layout.padded_size, layout.num_params, 16384, "none",
                                                       false, true);
  const double gib = 1024.0 * 1024.0 * 1024.0;
  EXPECT_NEAR(fp32.total() / gib, 24.94, 0.05) << "the fp32-activation figure measured on the H200";
  EXPECT_LE(bf16.total() / gib, 24.94 / 2) << "bf16 storage: " << bf16.total() / gib << " GiB";
  EXPECT_LT(bf16.activations, fp32.activations / 2);
  EXPECT_GT(bf16.parameters, fp32.parameters) << "the bf16 working copy";
  kilter::model::ModelSpec llama = gpt2;
  llama.arch = "llama";
  llama.n_kv_head = 4;
  const kilter::model::ParamLayout llama_layout = kilter::model::ParamLayout::build(llama, 64);
  const auto llama_bf16 = kilter::backend::cuda_device_bytes(llama, llama_layout.padded_size, llama_layout.num_params,
                                                             16384, "none", false, true);
  const auto llama_fp32 = kilter::backend::cuda_device_bytes(llama, llama_layout.padded_size, llama_layout.num_params,
                                                             16384, "none", false, false);
  EXPECT_LT(llama_bf16.activations, llama_fp32.activations / 2);
  EXPECT_GT(llama_bf16.engine, fp32.engine) << "RoPE's table";
}

// The memory plan with cuDNN SDPA on the bf16-storage datapath (issue 37): GPT-2 124M, 16 x 1024,
// recompute none. The groups' saved softmax (12 layers of 16 x 12 x 1024^2 bf16: 4.5 GiB), their
// padded rows and workspace go; cuDNN's Stats (16384 x 12 floats per layer) and its workspace
// (sdpa_workspace_bound: dP of 16 x 12 x 1024^2 bf16 and the softmax sums) come.
TEST(CudaMemoryPlan, SdpaDropsTheSavedSoftmax) {
  kilter::model::ModelSpec gpt2;
  gpt2.n_layer = 12, gpt2.n_head = 12, gpt2.n_embd = 768, gpt2.block_size = 1024, gpt2.vocab_size = 50257;
  const kilter::model::ParamLayout layout = kilter::model::ParamLayout::build(gpt2, 64);
  auto plan = [&](bool sdpa, const char* recompute = "none") {
    return kilter::backend::cuda_device_bytes(gpt2, layout.padded_size, layout.num_params, 16384, recompute, false,
                                              true, sdpa);
  };
  const auto groups = plan(false), sdpa = plan(true);
  const double gib = 1024.0 * 1024.0 * 1024.0, mib = 1024.0 * 1024.0;
  const double softmax = 12.0 * 16 * 12 * 1024 * 1024 * 2, stats = 12.0 * 16384 * 12 * 4;
  const double workspace = 16.0 * 12 * 1024 * 1024 * 2 + 16384.0 * 12 * 4;
  std::printf("GPT-2 124M 16 x 1024 bf16 storage: groups %.3f GiB, SDPA %.3f GiB\n", groups.total() / gib,
              sdpa.total() / gib);
  // The activations lose the softmax and the groups' padded rows and workspace (~0.5 GiB), keep the Stats.
  const double dropped = double(groups.activations) - double(sdpa.activations);
  EXPECT_GT(dropped, softmax - stats);
  EXPECT_LT(dropped, softmax - stats + 0.6 * gib);
  // cuDNN's workspace is counted apart from the GEMMs' (the plan's "cuDNN SDPA workspace" row).
  EXPECT_NEAR(double(sdpa.cudnn), workspace, 1.0);
  EXPECT_EQ(sdpa.engine, groups.engine);
  EXPECT_EQ(groups.cudnn, 0u);
  EXPECT_EQ(sdpa.parameters, groups.parameters);
  EXPECT_LT(sdpa.total() / gib, 8.0) << "about 7.6 GiB expected";
  // Recompute attention shares one layer's Stats, as it shares the softmax.
  EXPECT_NEAR(double(plan(true).activations) - double(plan(true, "attention").activations), 11 * stats / 12, mib);
  // The fp32-activation datapath keeps the groups and adds SDPA's bf16 rows, Stats and workspace.
  const auto fp32 = kilter::backend::cuda_device_bytes(gpt2, layout.padded_size, layout.num_params, 16384, "none",
                                                       false, false, false);
  const auto fp32_sdpa = kilter::backend::cuda_device_bytes(gpt2, layout.padded_size, layout.num_params, 16384,
                                                            "none", false, false, true);
  EXPECT_EQ(fp32_sdpa.activations, fp32.activations);
  EXPECT_EQ(fp32_sdpa.engine, fp32.engine);
  EXPECT_GT(fp32_sdpa.cudnn, workspace + stats);
}

// Which configs the plan counts SDPA for: the engine the config asks for (sdpa, or auto in bf16),
// where the build has it and the shape is one it takes.
TEST(CudaMemoryPlan, CountsSdpaWhereTheConfigAsksAndTheBuildHasIt) {
  kilter::model::ModelSpec gpt2;
  gpt2.n_layer = 2, gpt2.n_head = 12, gpt2.n_embd = 768, gpt2.block_size = 1024, gpt2.vocab_size = 50257;
  kilter::model::ModelSpec odd = gpt2;
  odd.n_embd = 72;  // head_dim 6
  using kilter::backend::cuda_plan_counts_sdpa;
#ifdef KILTER_WITH_SDPA
  const bool built = true;
#else
  const bool built = false;
#endif
  EXPECT_EQ(cuda_plan_counts_sdpa(gpt2, "auto", "bf16"), built);
  EXPECT_EQ(cuda_plan_counts_sdpa(gpt2, "sdpa", "fp32"), built);
  EXPECT_EQ(cuda_plan_counts_sdpa(gpt2, "sdpa", "bf16"), built);
  EXPECT_FALSE(cuda_plan_counts_sdpa(gpt2, "auto", "fp32"));
  EXPECT_FALSE(cuda_plan_counts_sdpa(gpt2, "cublaslt", "bf16"));
  EXPECT_FALSE(cuda_plan_counts_sdpa(gpt2, "cudnn", "bf16"));
  EXPECT_FALSE(cuda_plan_counts_sdpa(odd, "sdpa", "bf16"));
}
