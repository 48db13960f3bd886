// The cuDNN SDPA engine's graphs without a device (label unit; built where the cudnn-frontend
// headers are, KILTER_WITH_SDPA): the forward and backward graphs that lib/model/attention_sdpa_cuda.cpp
// builds for whole pieces and for later parts of cut pieces (bottom-right causal over staged
// keys), multi-head and grouped-query, pass cudnn-frontend's validate() for sm_90 against the
// cuDNN library this build links. validate() needs no handle and no device; building plans does,
// and tests/gpu/gpu_sdpa_test.cpp does that on a device.
#include <cudnn.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lib/model/attention_sdpa.h"
#include "lib/model/sdpa_plan.h"

namespace kilter::model {
namespace {

SdpaPlan plan_for(const AttentionShape& shape, const std::vector<int32_t>& cu, const std::vector<int32_t>& offsets) {
  SdpaPlan plan;
  plan_sdpa(plan, cu.data(), static_cast<int>(cu.size()) - 1, offsets.empty() ? nullptr : offsets.data(), shape);
  return plan;
}

void expect_valid(const SdpaPlan& plan) {
  std::string why;
  for (const SdpaCall* call : plan.calls()) EXPECT_TRUE(cuda::sdpa_validate_graphs(*call, plan.shape, 90, &why)) << why;
}

TEST(SdpaGraphs, CudnnIsRecentEnough) {
  // The engine refuses cuDNN < 9.6 at run time; the build machines' must pass.
  EXPECT_GE(cudnnGetVersion(), 90600u);
}

TEST(SdpaGraphs, WholePiecesValidateForSm90) {
  // GPT-2 124M's attention: 12 heads of 64; packed pieces of mixed lengths.
  const SdpaPlan plan = plan_for(AttentionShape::mha(768, 12), {0, 1024, 1500, 1501, 2048}, {});
  ASSERT_EQ(plan.whole.size(), 1u);
  ASSERT_TRUE(plan.later.empty());
  expect_valid(plan);
}

TEST(SdpaGraphs, LaterPartsValidateForSm90) {
  // A batch holding whole pieces and later parts of cut pieces (s = 300 and s = 1).
  const SdpaPlan plan = plan_for(AttentionShape::mha(768, 12), {0, 200, 712, 720, 1000}, {0, 300, 0, 1});
  ASSERT_EQ(plan.later.size(), 1u);
  EXPECT_TRUE(plan.later[0].bucket.bottom_right);
  EXPECT_NE(plan.later[0].bucket.seq_q, plan.later[0].bucket.seq_kv);
  expect_valid(plan);
}

TEST(SdpaGraphs, CallsSplitWithinTheScoreBudgetValidateForSm90) {
  // One long piece among short ones, with the budget of the batch's size: several calls.
  const AttentionShape shape = AttentionShape::mha(768, 12);
  std::vector<int32_t> cu{0, 1000};
  for (int p = 0; p < 40; ++p) cu.push_back(cu.back() + 1 + (p * 37) % 60);
  SdpaPlan plan;
  plan_sdpa(plan, cu.data(), static_cast<int>(cu.size()) - 1, nullptr, shape, sdpa_score_budget(cu.back(), 1024));
  EXPECT_GT(plan.whole.size(), 1u);
  expect_valid(plan);
}

TEST(SdpaGraphs, GroupedQueryHeadsValidateForSm90) {
  // Llama 3.2 1B's attention: 32 query heads, 8 key/value heads of 64; and SmolLM's 9 over 3.
  expect_valid(plan_for({32, 8, 64}, {0, 100, 612, 800}, {0, 0, 40}));
  expect_valid(plan_for({9, 3, 64}, {0, 7, 300}, {5, 0}));
}

TEST(SdpaGraphs, ValidationRefusesWhatCudnnRefuses) {
  // head_dim 6 is no shape for the engine (sdpa_shape_supported says so first); the frontend
  // refuses it too, so a refusal is reported and not hidden.
  const SdpaPlan plan = plan_for(AttentionShape::mha(12, 2), {0, 10, 30}, {});
  std::string why;
  ASSERT_EQ(plan.whole.size(), 1u);
  EXPECT_FALSE(cuda::sdpa_validate_graphs(plan.whole[0], plan.shape, 90, &why));
  EXPECT_FALSE(why.empty());
}

}  // namespace
}  // namespace kilter::model
