// train.recompute (issue 24): every recompute mode (gelu, attention, block) gives the loss and
// gradients of "none" BIT FOR BIT on the CPU backend, fp32 and bf16, for a packed batch of whole
// pieces, over two steps (AdamW in between, so the bf16 weight copy is refreshed), for the ranks
// of a cut piece (issue 23: the prefix K/V a later part's attention recompute reads from the
// exchange), and in forward_loss. An unknown mode is refused naming the key.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "io/base/error.h"
#include "lib/backend/cpu_model.h"
#include "lib/model/gemm.h"
#include "lib/model/model.h"
#include "tests/unit/model_testing.h"
#include "tests/unit/thread_kv_exchange.h"

namespace kilter::model {
namespace {

using backend::CpuModel;
using testing::cut_batches;
using testing::CutBatches;
using testing::make_batch;
using testing::random_vector;
using testing::forward_backward_ranks;
using testing::ScopedGemmThreads;

const std::vector<std::string> kModes = {"gelu", "attention", "block"};

ModelSpec recompute_config() {
  ModelSpec cfg;
  cfg.n_layer = 3;
  cfg.n_head = 4;
  cfg.n_embd = 32;
  cfg.block_size = 160;
  cfg.vocab_size = 37;
  return cfg;
}

std::vector<std::string> precisions() {
  std::vector<std::string> out = {"fp32"};
  if (gemm_has_bf16()) out.push_back("bf16");
  return out;
}

class ModelRecompute : public ::testing::Test {
 protected:
  ScopedGemmThreads one_gemm_thread_{1};
};

struct Step {
  std::vector<double> losses;              // per step (per rank in a cut run)
  std::vector<std::vector<float>> grads;   // per step (per rank), num_params
  double eval_loss = 0;
};

void expect_bitwise(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t differing = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && differing++ == 0) first = i;
  EXPECT_EQ(differing, 0u) << what << ": " << differing << " gradients differ, the first at " << first << ": "
                           << got[first] << " vs " << want[first];
}

// Two forward_backward steps with an AdamW step between, then forward_loss, on one model.
Step run_steps(const ModelSpec& cfg, const std::vector<float>& params, const Batch& batch, const std::string& precision,
               const std::string& recompute) {
  CpuModel model(cfg, 1, precision, recompute);
  model.set_params(params.data());
  const float scale = 1.0f / batch.num_targets;
  Step out;
  for (int step = 0; step < 2; ++step) {
    model.zero_grads();
    out.losses.push_back(model.forward_backward(batch, scale, {}));
    out.grads.emplace_back(model.grads(), model.grads() + model.layout().num_params);
    AdamWParams p;
    p.lr = 1e-2f;
    p.t = step + 1;
    model.adamw_step(p);
  }
  out.eval_loss = model.forward_loss(batch);
  return out;
}

TEST_F(ModelRecompute, EveryModeGivesTheGradientsOfNoneBitForBit) {
  const ModelSpec cfg = recompute_config();
  const std::vector<float> params = random_vector(ParamLayout::build(cfg).num_params, 7, 0.2);
  const Batch batch = make_batch({90, 17, 40, 1}, cfg.vocab_size, 8, {{0, 89}, {2, 11}});
  for (const std::string& precision : precisions()) {
    const Step none = run_steps(cfg, params, batch, precision, "none");
    for (const std::string& mode : kModes) {
      SCOPED_TRACE(precision + ", recompute=" + mode);
      const Step got = run_steps(cfg, params, batch, precision, mode);
      for (size_t s = 0; s < none.losses.size(); ++s) {
        EXPECT_EQ(got.losses[s], none.losses[s]) << "step " << s;
        expect_bitwise(got.grads[s], none.grads[s], "step " + std::to_string(s));
      }
      EXPECT_EQ(got.eval_loss, none.eval_loss) << "forward_loss";
    }
  }
}

// A micro-batch whose capacity grows after the first (the scratch buffers grow too).
TEST_F(ModelRecompute, LargerSecondMicroBatchStaysBitIdentical) {
  const ModelSpec cfg = recompute_config();
  const std::vector<float> params = random_vector(ParamLayout::build(cfg).num_params, 11, 0.2);
  const Batch small = make_batch({20, 9}, cfg.vocab_size, 12);
  const Batch large = make_batch({150, 60}, cfg.vocab_size, 13);
  for (const std::string& mode : kModes) {
    SCOPED_TRACE("recompute=" + mode);
    CpuModel none(cfg, 1, "fp32", "none"), got(cfg, 1, "fp32", mode);
    none.set_params(params.data());
    got.set_params(params.data());
    for (const Batch* batch : {&small, &large}) {
      none.zero_grads();
      got.zero_grads();
      EXPECT_EQ(got.forward_backward(*batch, 0.5f, {}), none.forward_backward(*batch, 0.5f, {}));
      const size_t n = none.layout().num_params;
      expect_bitwise(std::vector<float>(got.grads(), got.grads() + n), std::vector<float>(none.grads(), none.grads() + n),
                     "N = " + std::to_string(batch->N));
    }
  }
}

// Ranks in threads joined by the test exchange; each rank's loss and gradient.
Step run_cut(const ModelSpec& cfg, const std::vector<float>& params, const CutBatches& setup,
             const std::string& precision, const std::string& recompute) {
  const int ranks = static_cast<int>(setup.batches.size());
  std::vector<std::unique_ptr<CpuModel>> models;
  for (int r = 0; r < ranks; ++r) {
    models.push_back(std::make_unique<CpuModel>(cfg, 1, precision, recompute));
    models.back()->set_params(params.data());
    models.back()->zero_grads();
  }
  Step out;
  std::vector<std::string> problems;
  out.losses = forward_backward_ranks(models, setup, 1.0f / 64, problems);
  for (const std::string& problem : problems) ADD_FAILURE() << problem;
  for (int r = 0; r < ranks; ++r)
    out.grads.emplace_back(models[r]->grads(), models[r]->grads() + models[r]->layout().num_params);
  return out;
}

TEST_F(ModelRecompute, CutPiecesGiveTheGradientsOfNoneBitForBit) {
  const ModelSpec cfg = recompute_config();
  const std::vector<float> params = random_vector(ParamLayout::build(cfg).num_params, 21, 0.2);
  const Batch whole = make_batch({150, 100, 30}, cfg.vocab_size, 22);
  // Three ranks: a piece cut in three (a middle part that receives and sends), one cut in two.
  const CutBatches setup = cut_batches(whole, {{{0, 0, 50}, {2}}, {{1, 0, 60}, {0, 50, 110}}, {{0, 110, -1}, {1, 60, -1}}});
  ASSERT_EQ(setup.cuts.size(), 2u);
  for (const std::string& precision : precisions()) {
    const Step none = run_cut(cfg, params, setup, precision, "none");
    for (const std::string& mode : kModes) {
      SCOPED_TRACE(precision + ", recompute=" + mode);
      const Step got = run_cut(cfg, params, setup, precision, mode);
      for (size_t r = 0; r < none.losses.size(); ++r) {
        EXPECT_EQ(got.losses[r], none.losses[r]) << "rank " << r;
        expect_bitwise(got.grads[r], none.grads[r], "rank " + std::to_string(r));
      }
    }
  }
}

TEST_F(ModelRecompute, UnknownModeIsRefusedNamingTheKey) {
  try {
    CpuModel model(recompute_config(), 1, "fp32", "layers");
    FAIL() << "recompute=layers was accepted";
  } catch (const kilter::Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.recompute=layers"), std::string::npos) << e.what();
  }
  BackendOptions options;
  options.recompute = "block";
  EXPECT_NO_THROW(make_model("cpu", recompute_config(), 1, options));
}

}  // namespace
}  // namespace kilter::model
