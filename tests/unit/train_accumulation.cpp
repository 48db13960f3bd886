// Gradient accumulation as the trainer does it: k micro-batches with loss_scale = 1/(targets of
// the whole step) accumulate the same gradients, loss sum and AdamW update as one micro-batch
// holding all k micro-batches' pieces (issue 5: "accumulation of k micro-batches equals one
// k-times-larger step").
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "lib/model/model.h"

using namespace kilter;

namespace {

// A packed micro-batch of pieces of the given lengths.
model::Batch make_pieces(int vocab, uint64_t seed, const std::vector<int>& lengths) {
  model::Batch b;
  b.clear();
  uint64_t x = seed;
  auto next = [&]() {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return int((x >> 33) % uint64_t(vocab));
  };
  for (int len : lengths) {
    std::vector<int32_t> inputs(len), targets(len);
    for (int t = 0; t < len; ++t) {
      inputs[t] = next();
      targets[t] = next();
    }
    b.append_piece(inputs.data(), targets.data(), len);
  }
  return b;
}

model::Batch concat(const std::vector<model::Batch>& parts) {
  model::Batch all;
  all.clear();
  for (const auto& p : parts)
    for (int i = 0; i < p.num_pieces(); ++i) {
      const int begin = p.cu_seqlens[i];
      all.append_piece(p.inputs.data() + begin, p.targets.data() + begin, p.piece_len(i));
    }
  return all;
}

}  // namespace

TEST(Accumulation, KMicroBatchesEqualOneLargerBatch) {
  model::ModelSpec cfg{2, 2, 32, 16, 61};
  const int k = 3;
  std::vector<model::Batch> parts = {make_pieces(61, 1, {16, 9}), make_pieces(61, 2, {5, 12, 3}),
                                     make_pieces(61, 3, {16, 1})};
  const model::Batch big = concat(parts);
  int64_t targets = 0;
  for (const auto& p : parts) targets += p.num_targets;
  ASSERT_EQ(targets, big.num_targets);

  auto acc = model::make_model("cpu", cfg, 1, "fp32");
  auto one = model::make_model("cpu", cfg, 1, "fp32");
  acc->init_params(42);
  one->init_params(42);
  acc->zero_grads();
  one->zero_grads();
  double loss_acc = 0;
  for (int i = 0; i < k; ++i) loss_acc += acc->forward_backward(parts[i], 1.0f / float(targets), {});
  const double loss_one = one->forward_backward(big, 1.0f / float(targets), {});
  EXPECT_NEAR(loss_acc, loss_one, 1e-5 * std::abs(loss_one));

  const size_t n = acc->layout().num_params;
  double max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < n; ++i) {
    max_diff = std::max(max_diff, double(std::abs(acc->grads()[i] - one->grads()[i])));
    max_abs = std::max(max_abs, double(std::abs(one->grads()[i])));
  }
  EXPECT_LT(max_diff, 1e-5 * max_abs) << "accumulated gradients differ";

  model::AdamWParams ap;
  ap.lr = 1e-3f;
  // Adam turns a gradient of rounding-noise size into a full step of either sign; a larger eps
  // keeps the comparison about accumulation, not about the sign of noise.
  ap.eps = 1e-4f;
  acc->adamw_step(ap);
  one->adamw_step(ap);
  std::vector<float> pa(n), po(n);
  acc->get_params(pa.data());
  one->get_params(po.data());
  double pdiff = 0;
  for (size_t i = 0; i < n; ++i) pdiff = std::max(pdiff, double(std::abs(pa[i] - po[i])));
  EXPECT_LT(pdiff, 1e-5) << "parameters after one AdamW step differ";
}
