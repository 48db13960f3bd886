// AdamW against hand-computed steps, the decay mask, the sharded (ZeRO-1) CPU optimizer, the
// learning-rate schedule and the clipping factor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "io/base/error.h"
#include "lib/backend/cpu_model.h"
#include "lib/optim/adamw.h"
#include "lib/optim/schedule.h"
#include "tests/unit/model_testing.h"

namespace kilter::optim {
namespace {

// One AdamW step of one element, straight from the paper's formula, in double.
struct Reference {
  double param, m, v;
  void step(double grad, double lr, double b1, double b2, double eps, double wd, double grad_scale, int t) {
    const double g = grad * grad_scale;
    param -= lr * wd * param;
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    const double m_hat = m / (1 - std::pow(b1, t));
    const double v_hat = v / (1 - std::pow(b2, t));
    param -= lr * m_hat / (std::sqrt(v_hat) + eps);
  }
};

TEST(AdamW, StepsMatchTheHandComputedFormula) {
  std::vector<float> params = {0.5f, -1.25f, 3.0f, 0.0f, 1e-3f};
  std::vector<float> m(5, 0.0f), v(5, 0.0f);
  std::vector<Reference> ref;
  for (float p : params) ref.push_back({p, 0.0, 0.0});
  const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, scale = 0.5;
  for (int t = 1; t <= 5; ++t) {
    const std::vector<float> grads = {0.1f * t, -2.0f, 0.0f, 1e-4f, static_cast<float>(t % 2 ? 3.0 : -3.0)};
    adamw_update(params.data(), grads.data(), m.data(), v.data(), params.size(), lr, b1, b2, eps, wd, scale, t);
    for (size_t i = 0; i < params.size(); ++i) ref[i].step(grads[i], lr, b1, b2, eps, wd, scale, t);
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_NEAR(params[i], ref[i].param, 2e-6 * (1.0 + std::fabs(ref[i].param))) << "t=" << t << " i=" << i;
      EXPECT_NEAR(m[i], ref[i].m, 1e-6 * (1.0 + std::fabs(ref[i].m)));
      EXPECT_NEAR(v[i], ref[i].v, 1e-6 * (1.0 + std::fabs(ref[i].v)));
    }
  }
  // First step of a fresh element moves it by about lr * sign(g) (Adam's normalized step).
  std::vector<float> p = {1.0f}, g = {0.3f}, m1 = {0.0f}, v1 = {0.0f};
  adamw_update(p.data(), g.data(), m1.data(), v1.data(), 1, 0.01f, 0.9f, 0.95f, 1e-8f, 0.0f, 1.0f, 1);
  EXPECT_NEAR(p[0], 0.99f, 1e-6);
}

TEST(AdamW, ModelDecaysTwoDimensionalWeightsOnly) {
  model::ModelSpec cfg = model::testing::tiny_config();
  backend::CpuModel model(cfg, 1);
  model.init_params(3);
  std::vector<float> before(model.layout().num_params);
  model.get_params(before.data());
  model.zero_grads();  // zero gradients: only the decay moves anything
  model::AdamWParams p;
  p.lr = 0.1f;
  p.weight_decay = 0.5f;
  model.adamw_step(p);
  for (const model::ParamTensor& tensor : model.layout().tensors) {
    const size_t i = tensor.offset + tensor.size / 2;
    const float expected = tensor.decay ? before[i] * (1.0f - 0.05f) : before[i];
    EXPECT_FLOAT_EQ(model.params()[i], expected) << tensor.name;
  }
}

// ZeRO-1 on one process: the owned ranges of several "ranks" (cutting through tensors, in an
// order that is not the buffer's) each step exactly as the unsharded model does there, hold the
// same moments, and their squared norms add up to the whole one.
TEST(AdamW, ShardedModelStepsItsRangesAsTheWholeModel) {
  model::ModelSpec cfg = model::testing::tiny_config();
  backend::CpuModel whole(cfg, 64);
  whole.init_params(5);
  const size_t padded = whole.layout().padded_size, num = whole.layout().num_params;
  ASSERT_EQ(padded % 4, 0u);
  const size_t half = padded / 2, quarter = padded / 4;
  // Two "ranks", each with two ranges of different buckets (as the reducer hands them out).
  const std::vector<std::vector<model::ParamRange>> shards = {{{quarter, quarter}, {half + quarter, quarter}},
                                                              {{0, quarter}, {half, quarter}}};
  std::vector<float> grads(padded);
  for (size_t i = 0; i < num; ++i) grads[i] = std::sin(0.37f * float(i)) * 1e-2f;
  std::vector<float> start(num);
  whole.get_params(start.data());
  model::AdamWParams p;
  p.lr = 1e-2f;
  p.grad_scale = 0.7f;
  double norm_parts = 0;
  std::vector<float> sharded_params(num);
  for (const auto& owned : shards) {
    backend::CpuModel part(cfg, 64);
    part.shard_optimizer(owned);
    part.set_params(start.data());
    std::copy(grads.begin(), grads.end(), part.grads());
    norm_parts += part.grad_norm_squared();
    for (int t = 1; t <= 2; ++t) {
      p.t = t;
      part.adamw_step(p);
    }
    for (const model::ParamRange& r : owned)
      for (size_t i = r.offset; i < std::min(r.offset + r.count, num); ++i) sharded_params[i] = part.params()[i];
    // The moments of its ranges, range after range, are the whole model's there (after its steps).
    size_t total = 0;
    for (const model::ParamRange& r : owned) total += r.count;
    std::vector<float> m(total), v(total);
    part.get_optimizer_shard(m.data(), v.data(), 0, total);
    EXPECT_EQ(part.optimizer_ranges().size(), owned.size());
    EXPECT_THROW(part.get_optimizer_state(m.data(), v.data()), Error);
  }
  std::copy(grads.begin(), grads.end(), whole.grads());
  const double norm_whole = whole.grad_norm_squared();
  EXPECT_NEAR(norm_parts, norm_whole, 1e-12 * norm_whole);
  for (int t = 1; t <= 2; ++t) {
    p.t = t;
    whole.adamw_step(p);
  }
  long differ = 0;
  for (size_t i = 0; i < num; ++i) differ += sharded_params[i] != whole.params()[i];
  EXPECT_EQ(differ, 0);
  // And the moments: a shard taken from the whole model's state holds exactly its ranges.
  std::vector<float> m(num), v(num);
  whole.get_optimizer_state(m.data(), v.data());
  backend::CpuModel resumed(cfg, 64);
  resumed.shard_optimizer(shards[0]);
  resumed.set_optimizer_state(m.data(), v.data());
  std::vector<float> sm(half), sv(half);
  resumed.get_optimizer_shard(sm.data(), sv.data(), 0, half);
  size_t k = 0;
  for (const model::ParamRange& r : shards[0])
    for (size_t i = r.offset; i < r.offset + r.count; ++i, ++k)
      if (i < num) {
        differ += sm[k] != m[i] || sv[k] != v[i];
      } else {
        differ += sm[k] != 0.0f || sv[k] != 0.0f;  // padding
      }
  EXPECT_EQ(differ, 0);
}

// The sharded step's gather arriving while the next forward runs (Model::params_arriving): the
// forward asks for the embeddings, then each layer's range, in increasing order and before it
// reads them; the loss and gradients equal those of a model given the parameters whole, in fp32
// and bf16 (whose GEMM copy is rounded range by range); get_params waits for everything.
TEST(ArrivingParams, ForwardWaitsLayerByLayerAndComputesAsWhole) {
  model::ModelSpec cfg = model::testing::tiny_config();
  cfg.n_layer = 3;
  for (const char* precision : {"fp32", "bf16"}) {
    backend::CpuModel whole(cfg, 64, precision), arriving(cfg, 64, precision);
    whole.init_params(11);
    const size_t padded = whole.layout().padded_size, num = whole.layout().num_params;
    std::vector<float> truth(num);
    whole.get_params(truth.data());
    arriving.init_params(3);  // other values: what the gather overwrites
    float* target = arriving.params();
    std::vector<size_t> asked;
    size_t delivered = 0;
    arriving.params_arriving([&](size_t end) {
      asked.push_back(end);
      // The "gather" delivers exactly what was asked for, so a read past it would see old values.
      for (; delivered < end; ++delivered) target[delivered] = delivered < num ? truth[delivered] : 0.0f;
    });
    const model::Batch batch = model::testing::make_batch({5, 8, 3}, cfg.vocab_size, 21);
    const float scale = 1.0f / float(batch.num_targets);
    whole.zero_grads();
    arriving.zero_grads();
    const double want = whole.forward_backward(batch, scale, {});
    const double got = arriving.forward_backward(batch, scale, {});
    EXPECT_EQ(got, want) << precision;
    for (size_t i = 0; i < num; ++i) ASSERT_EQ(arriving.grads()[i], whole.grads()[i]) << precision << " grad " << i;
    // Embeddings, each of the 3 layers, then the rest: increasing, the first well short of all.
    ASSERT_EQ(asked.size(), size_t(cfg.n_layer) + 2) << precision;
    EXPECT_TRUE(std::is_sorted(asked.begin(), asked.end())) << precision;
    EXPECT_LT(asked.front(), padded / 2) << precision;
    EXPECT_EQ(asked.back(), padded) << precision;
    // Everything arrived: no more waits.
    asked.clear();
    std::vector<float> got_params(num);
    arriving.get_params(got_params.data());
    EXPECT_TRUE(asked.empty());
    EXPECT_EQ(got_params, truth);
  }
}

// A gather still in flight when something other than the forward reads the parameters
// (a checkpoint's get_params): it waits for all of them at once.
TEST(ArrivingParams, GetParamsWaitsForEverything) {
  model::ModelSpec cfg = model::testing::tiny_config();
  backend::CpuModel model(cfg, 64);
  model.init_params(1);
  const size_t padded = model.layout().padded_size;
  std::vector<size_t> asked;
  model.params_arriving([&](size_t end) { asked.push_back(end); });
  std::vector<float> host(model.layout().num_params);
  model.get_params(host.data());
  EXPECT_EQ(asked, std::vector<size_t>{padded});
}

// The distributed optimizer (bf16 storage with a sharded optimizer): the model keeps the fp32
// master of its owned range only (the rest reads zeros: its pages went back), gives the bf16
// working copy to gather, steps the owned master exactly as an unsharded model steps those
// floats, and writes the working copy of that range as their rounding. fp32 and bf16 GEMMs keep
// gathering the parameters (no working copy to gather).
uint16_t bf16_of(float x) {
  model::bf16 b = 0;
  model::to_bf16(&b, &x, 1);
  return b;
}

TEST(DistributedOptimizer, KeepsTheOwnedMasterAndGathersTheWorkingCopy) {
  model::ModelSpec cfg = model::testing::tiny_config();
  for (const char* precision : {"fp32", "bf16"}) {
    backend::CpuModel zero1(cfg, 64, precision);
    zero1.shard_optimizer({{0, zero1.layout().padded_size / 2}});
    EXPECT_EQ(zero1.gathered_working_copy(), nullptr) << precision;
  }
  backend::CpuModel whole(cfg, 64, "bf16", "none", true), sharded(cfg, 64, "bf16", "none", true);
  const size_t padded = whole.layout().padded_size, num = whole.layout().num_params, half = padded / 2;
  EXPECT_EQ(whole.gathered_working_copy(), nullptr);
  sharded.shard_optimizer({{0, half}});
  ASSERT_NE(sharded.gathered_working_copy(), nullptr);
  whole.init_params(5);
  sharded.init_params(5);
  std::vector<float> truth(num), seen(num);
  whole.get_params(truth.data());
  sharded.get_params(seen.data());  // the working copy, widened
  for (size_t i = 0; i < num; ++i) {
    ASSERT_EQ(seen[i], model::bf16_to_float(sharded.gathered_working_copy()[i])) << i;
    ASSERT_EQ(sharded.gathered_working_copy()[i], bf16_of(truth[i])) << i;
  }
  for (size_t i = 0; i < half; ++i) ASSERT_EQ(sharded.params()[i], truth[i]) << "owned master " << i;
  for (size_t i = half; i < padded; ++i) ASSERT_EQ(sharded.params()[i], 0.0f) << "unowned master " << i;
  // The same gradients into both: the owned floats step alike, bit for bit.
  for (size_t i = 0; i < padded; ++i) whole.grads()[i] = sharded.grads()[i] = 1e-3f * float(int(i % 17) - 8);
  model::AdamWParams p;
  p.lr = 1e-2f, p.weight_decay = 0.1f, p.t = 1;
  whole.adamw_step(p);
  sharded.adamw_step(p);
  for (size_t i = 0; i < std::min(half, num); ++i) {
    ASSERT_EQ(sharded.params()[i], whole.params()[i]) << "stepped master " << i;
    ASSERT_EQ(sharded.gathered_working_copy()[i], bf16_of(whole.params()[i])) << "working copy " << i;
  }
  // A forward computes from the working copy alone: finite, and close to the whole model's.
  const model::Batch batch = model::testing::make_batch({5, 8, 3}, cfg.vocab_size, 21);
  sharded.zero_grads();
  const double loss = sharded.forward_backward(batch, 1.0f / float(batch.num_targets), {});
  EXPECT_TRUE(std::isfinite(loss));
}

TEST(Schedule, WarmupThenCosine) {
  const double lr = 6e-4;
  EXPECT_DOUBLE_EQ(learning_rate(0, 10, 100, lr, 0.1), lr / 10);
  EXPECT_DOUBLE_EQ(learning_rate(4, 10, 100, lr, 0.1), lr * 5 / 10);
  EXPECT_DOUBLE_EQ(learning_rate(9, 10, 100, lr, 0.1), lr);
  EXPECT_DOUBLE_EQ(learning_rate(10, 10, 100, lr, 0.1), lr);
  EXPECT_NEAR(learning_rate(55, 10, 100, lr, 0.1), lr * 0.1 + 0.5 * (lr - lr * 0.1), 1e-15);  // halfway
  EXPECT_NEAR(learning_rate(100, 10, 100, lr, 0.1), lr * 0.1, 1e-15);
  EXPECT_NEAR(learning_rate(500, 10, 100, lr, 0.1), lr * 0.1, 1e-15);
  EXPECT_DOUBLE_EQ(learning_rate(0, 0, 100, lr, 0.0), lr);  // no warmup: cosine from the start
  for (int64_t s = 11; s < 100; ++s)
    EXPECT_LE(learning_rate(s, 10, 100, lr, 0.1), learning_rate(s - 1, 10, 100, lr, 0.1));
}

TEST(Schedule, ClipScaleFollowsTorch) {
  EXPECT_EQ(clip_scale(0.5, 1.0), 1.0f);
  EXPECT_NEAR(clip_scale(4.0, 1.0), 1.0 / (4.0 + 1e-6), 1e-7);
  EXPECT_EQ(clip_scale(100.0, 0.0), 1.0f);  // clipping off
  EXPECT_TRUE(std::isnan(clip_scale(NAN, 1.0)));
  EXPECT_EQ(clip_scale(INFINITY, 1.0), 0.0f);
}

}  // namespace
}  // namespace kilter::optim
