// The Llama family on the CPU backend (issue 38): every parameter tensor of RMSNorm, RoPE, SwiGLU
// and grouped-query attention against finite differences, with tied and untied heads, q/k/v
// biases and llama3 RoPE scaling; the ops' own properties; cut pieces (RoPE continuing at the
// part's offset, the K/V of fewer heads crossing) against the uncut piece; recompute bit for bit;
// the KV-cache generator against the training forward. The parity with Hugging Face's
// LlamaForCausalLM is tests/e2e/llama_parity.sh's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "io/base/error.h"
#include "lib/backend/cpu_model.h"
#include "lib/model/generate.h"
#include "lib/model/rmsnorm.h"
#include "lib/model/rope.h"
#include "lib/model/swiglu.h"
#include "tests/unit/model_testing.h"
#include "tests/unit/thread_kv_exchange.h"

namespace kilter::model {
namespace {

using backend::CpuModel;
using testing::central_difference;
using testing::make_batch;
using testing::max_abs;
using testing::model_gradient_mismatches;
using testing::random_vector;
using testing::randomize_params;

// A small Llama (model_testing.h) of a 12-token context.
ModelSpec llama_config() {
  ModelSpec cfg = testing::tiny_llama_config(12, 13);
  cfg.rope_theta = 500;  // turns visibly within 12 positions
  return cfg;
}

// Gradients of every tensor against five-point differences, as the GPT-2 check does.
void expect_gradients_match(const ModelSpec& cfg, uint64_t seed) {
  CpuModel model(cfg, 1);
  randomize_params(model, seed);
  const Batch batch = make_batch({cfg.block_size, 5, 1, 3}, cfg.vocab_size, seed + 1, {{1, 4}});
  for (const std::string& mismatch : model_gradient_mismatches(model, batch, 0.5f, seed + 2)) ADD_FAILURE() << mismatch;
}

TEST(ModelLlama, GroupedQueryUntiedMatchesFiniteDifferences) { expect_gradients_match(llama_config(), 11); }

TEST(ModelLlama, TiedHeadWithQkvBiasesMatchesFiniteDifferences) {
  ModelSpec cfg = llama_config();
  cfg.n_kv_head = 0;  // multi-head
  cfg.tie_embeddings = "true";
  cfg.qkv_bias = true;
  expect_gradients_match(cfg, 21);
}

TEST(ModelLlama, Llama3RopeScalingMatchesFiniteDifferences) {
  ModelSpec cfg = llama_config();
  cfg.n_kv_head = 1;  // one K/V head for all
  cfg.rope_scaling = "llama3";
  cfg.rope_original_context = 8;  // frequency 0 in the blended band, frequency 1 divided by the factor
  cfg.rope_factor = 4;
  expect_gradients_match(cfg, 31);
}

TEST(ModelLlama, GptWithUntiedHeadMatchesFiniteDifferences) {
  ModelSpec cfg = testing::tiny_config();
  cfg.tie_embeddings = "false";
  expect_gradients_match(cfg, 41);
}

TEST(ModelLlama, LayoutFollowsHuggingFaceNamesAndFusesProjections) {
  ModelSpec cfg = llama_config();
  cfg.qkv_bias = true;
  const ParamLayout layout = ParamLayout::build(cfg);
  const ParamTensor& q = layout.find("model.layers.1.self_attn.q_proj.weight");
  const ParamTensor& k = layout.find("model.layers.1.self_attn.k_proj.weight");
  const ParamTensor& v = layout.find("model.layers.1.self_attn.v_proj.weight");
  EXPECT_EQ(q.shape, (std::vector<int64_t>{16, 16}));
  EXPECT_EQ(k.shape, (std::vector<int64_t>{8, 16}));
  EXPECT_EQ(k.offset, q.offset + q.size);  // one fused [q; k; v] weight
  EXPECT_EQ(v.offset, k.offset + k.size);
  EXPECT_EQ(layout.find("model.layers.1.mlp.up_proj.weight").offset,
            layout.find("model.layers.1.mlp.gate_proj.weight").offset + 24 * 16);
  EXPECT_EQ(layout.tensors.back().name, "lm_head.weight");
  EXPECT_THROW(layout.find("transformer.wpe.weight"), Error);
  EXPECT_FALSE(layout.find("model.layers.0.input_layernorm.weight").decay);
  EXPECT_TRUE(layout.find("model.embed_tokens.weight").decay);
  cfg.tie_embeddings = "auto";
  EXPECT_FALSE(cfg.tied());
  cfg.n_embd = 4096, cfg.n_head = 32, cfg.ffn_hidden = 0;
  EXPECT_EQ(cfg.ffn_width(), 11008);  // 8/3 x 4096 up to a multiple of 256, as Llama 2 7B
}

TEST(ModelLlama, RmsNormBackwardMatchesFiniteDifferences) {
  const int N = 3, C = 10;
  std::vector<float> x = random_vector(N * C, 1), w = random_vector(C, 2), dy = random_vector(N * C, 3);
  std::vector<float> y(N * C), rstd(N), dx(N * C, 0.0f), dw(C, 0.0f);
  rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
  for (int c = 0; c < C; ++c) {  // y = w x / rms(x)
    double ss = 0;
    for (int i = 0; i < C; ++i) ss += double(x[i]) * x[i];
    EXPECT_NEAR(y[c], w[c] * x[c] / std::sqrt(ss / C + 1e-5), 1e-5);
  }
  rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, C);
  auto objective = [&] {
    std::vector<float> out(N * C), r(N);
    rmsnorm_forward(out.data(), r.data(), x.data(), w.data(), N, C, 1e-5f);
    double sum = 0;
    for (int i = 0; i < N * C; ++i) sum += double(out[i]) * dy[i];
    return sum;
  };
  for (int i = 0; i < N * C; i += 7) EXPECT_NEAR(dx[i], central_difference(objective, &x[i], 1e-2), 2e-3);
  for (int c = 0; c < C; ++c) EXPECT_NEAR(dw[c], central_difference(objective, &w[c], 1e-2), 2e-3);
}

TEST(ModelLlama, RopeTurnsPairsAndItsBackwardIsTheTranspose) {
  const ModelSpec cfg = llama_config();
  const AttentionShape shape{cfg.n_head, cfg.kv_heads(), cfg.head_dim()};
  const RopeTable table = RopeTable::build(cfg, cfg.block_size);
  const int N = 3;
  const std::vector<int32_t> positions = {0, 5, 11};
  const std::vector<float> x = random_vector(size_t(N) * shape.row_width(), 4);
  std::vector<float> y = x;
  rope_forward(y.data(), positions.data(), N, shape, table);
  const int half = cfg.head_dim() / 2, heads = shape.n_head + shape.n_kv_head;
  for (int t = 0; t < N; ++t) {
    const float* a = x.data() + size_t(t) * shape.row_width();
    const float* b = y.data() + size_t(t) * shape.row_width();
    for (int h = 0; h < heads; ++h)  // each pair keeps its length; position 0 does not turn
      for (int i = 0; i < half; ++i) {
        const int c = h * cfg.head_dim() + i;
        EXPECT_NEAR(std::hypot(a[c], a[c + half]), std::hypot(b[c], b[c + half]), 1e-5);
        if (t == 0) EXPECT_EQ(a[c], b[c]);
      }
    for (int c = heads * cfg.head_dim(); c < shape.row_width(); ++c) EXPECT_EQ(a[c], b[c]) << "value head turned";
  }
  // <rope(x), g> = <x, rope_backward(g)>
  const std::vector<float> g = random_vector(x.size(), 5);
  std::vector<float> back = g;
  rope_backward(back.data(), positions.data(), N, shape, table);
  double left = 0, right = 0;
  for (size_t i = 0; i < x.size(); ++i) left += double(y[i]) * g[i], right += double(x[i]) * back[i];
  EXPECT_NEAR(left, right, 1e-4 * std::fabs(left));
  // HF's frequencies: theta^(-2i/d); llama3 leaves the high frequencies and divides the low ones.
  ModelSpec scaled = cfg;
  scaled.rope_scaling = "llama3";
  scaled.rope_original_context = 32;
  const std::vector<double> plain = rope_inverse_frequencies(cfg), low = rope_inverse_frequencies(scaled);
  EXPECT_NEAR(plain[1], std::pow(500.0, -2.0 / 4), 1e-7);
  EXPECT_EQ(low[0], plain[0]);  // wavelength 2 pi < 32 / 4: kept
  EXPECT_NEAR(low[1], plain[1] / scaled.rope_factor, 1e-9);  // wavelength 2 pi sqrt(500) > 32: divided
  scaled.rope_original_context = 8;  // wavelength 2 pi between 8 / 4 and 8: blended
  const double smooth = (8 / (2 * M_PI) - 1) / (4 - 1);
  EXPECT_NEAR(rope_inverse_frequencies(scaled)[0], (1 - smooth) / scaled.rope_factor + smooth, 1e-7);
}

TEST(ModelLlama, SwigluBackwardMatchesFiniteDifferences) {
  const int N = 2, F = 5;
  std::vector<float> x = random_vector(size_t(N) * 2 * F, 6), dy = random_vector(size_t(N) * F, 7);
  std::vector<float> y(size_t(N) * F), dx(x.size());
  swiglu_forward(y.data(), x.data(), N, F);
  EXPECT_NEAR(y[0], x[0] / (1 + std::exp(-x[0])) * x[F], 1e-6);
  swiglu_backward(dx.data(), dy.data(), x.data(), N, F);
  auto objective = [&] {
    std::vector<float> out(size_t(N) * F);
    swiglu_forward(out.data(), x.data(), N, F);
    double sum = 0;
    for (size_t i = 0; i < out.size(); ++i) sum += double(out[i]) * dy[i];
    return sum;
  };
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(dx[i], central_difference(objective, &x[i], 1e-2), 2e-3) << i;
}

// A piece cut over three ranks: the later parts' RoPE continues at their offsets and their queries
// read the earlier parts' two K/V heads (of four query heads).
TEST(ModelLlama, CutPieceMatchesTheUncutPiece) {
  testing::ScopedGemmThreads one_thread(1);
  ModelSpec cfg = llama_config();
  cfg.block_size = 150;
  const std::vector<float> params = random_vector(ParamLayout::build(cfg).num_params, 51, 0.3);
  const Batch whole = make_batch({150, 20}, cfg.vocab_size, 52, {{0, 149}});
  const float scale = 1.0f / whole.num_targets;
  const testing::CutBatches setup = testing::cut_batches(whole, {{{0, 0, 70}}, {{0, 70, 100}, {1, 0, -1}}, {{0, 100, -1}}});
  CpuModel reference(cfg, 1);
  reference.set_params(params.data());
  reference.zero_grads();
  const double loss = reference.forward_backward(whole, scale, {});
  std::vector<std::unique_ptr<CpuModel>> models;
  for (int r = 0; r < 3; ++r) {
    models.push_back(std::make_unique<CpuModel>(cfg, 1));
    models.back()->set_params(params.data());
    models.back()->zero_grads();
  }
  std::vector<std::string> problems;
  const std::vector<double> losses = testing::forward_backward_ranks(models, setup, scale, problems);
  for (const std::string& problem : problems) ADD_FAILURE() << problem;
  EXPECT_NEAR(losses[0] + losses[1] + losses[2], loss, 1e-6 * loss);
  for (const ParamTensor& tensor : reference.layout().tensors) {
    const double tensor_scale = max_abs(reference.grads() + tensor.offset, tensor.size);
    for (size_t i = tensor.offset; i < tensor.offset + tensor.size; ++i) {
      const double sum = double(models[0]->grads()[i]) + models[1]->grads()[i] + models[2]->grads()[i];
      ASSERT_NEAR(sum, reference.grads()[i], 1e-5 * tensor_scale) << tensor.name;
    }
  }
}

TEST(ModelLlama, EveryRecomputeModeGivesTheGradientsOfNoneBitForBit) {
  const ModelSpec cfg = llama_config();
  const std::vector<float> params = random_vector(ParamLayout::build(cfg).num_params, 61, 0.3);
  const Batch batch = make_batch({12, 7, 3}, cfg.vocab_size, 62);
  std::vector<float> none;
  for (const char* mode : {"none", "gelu", "attention", "block"}) {
    CpuModel model(cfg, 1, "fp32", mode);
    model.set_params(params.data());
    model.zero_grads();
    model.forward_backward(batch, 0.25f, {});
    std::vector<float> grads(model.grads(), model.grads() + model.layout().num_params);
    if (none.empty()) none = grads;
    EXPECT_EQ(0, std::memcmp(grads.data(), none.data(), sizeof(float) * grads.size())) << mode;
  }
}

// The KV cache's logits of each position equal the training forward's: the loss it gives to the
// next token is the loss the model trains on.
TEST(ModelLlama, GeneratorAgreesWithTheTrainingForward) {
  ModelSpec cfg = llama_config();
  cfg.qkv_bias = true;
  const std::vector<float> params = random_vector(ParamLayout::build(cfg).num_params, 71, 0.3);
  const Batch batch = make_batch({cfg.block_size}, cfg.vocab_size, 72);
  CpuModel model(cfg, 1);
  model.set_params(params.data());
  const double loss = model.forward_loss(batch);
  Generator generator(cfg, params);
  double cached = 0;
  for (int t = 0; t < cfg.block_size; ++t) {
    const float* logits = generator.feed(&batch.inputs[size_t(t)], 1);
    double top = logits[0], sum = 0;
    for (int v = 1; v < cfg.vocab_size; ++v) top = std::max(top, double(logits[v]));
    for (int v = 0; v < cfg.vocab_size; ++v) sum += std::exp(logits[v] - top);
    cached += std::log(sum) + top - logits[batch.targets[size_t(t)]];
  }
  EXPECT_NEAR(cached, loss, 1e-5 * loss);
}

}  // namespace
}  // namespace kilter::model
