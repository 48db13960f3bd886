// Each CPU op's backward against finite differences of its forward, plus the op-level
// properties the model relies on (padding is masked, fused variants equal the plain ones).
// Objective: a fixed random projection sum(w * out), evaluated in double, so one scalar
// derivative per perturbed input element checks the whole vector-Jacobian product.
// Tolerance: |fd - analytic| <= 2e-3 * max|analytic of that tensor| + 1e-5, five-point
// differences with h = 2^-7 (float forward passes; their rounding is about 1e-6 relative).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "lib/model/attention.h"
#include "lib/model/crossentropy.h"
#include "lib/model/encoder.h"
#include "lib/model/gelu.h"
#include "lib/model/layernorm.h"
#include "lib/model/matmul.h"
#include "lib/model/vecmath.h"
#include "tests/unit/model_testing.h"

namespace kilter::model {
namespace {

using testing::central_difference;
using testing::max_abs;
using testing::random_vector;

constexpr double kStep = 0.0078125;  // 2^-7
constexpr double kRelTol = 2e-3;
constexpr double kAbsTol = 1e-5;

double projection(const std::vector<float>& out, const std::vector<float>& w) {
  double s = 0.0;
  for (size_t i = 0; i < out.size(); ++i) s += static_cast<double>(out[i]) * w[i];
  return s;
}

// Checks `count` elements of `input` (spread over the tensor, always including the first and
// last) against the analytic gradient `grad`.
void expect_gradient_matches(const char* what, std::vector<float>& input, const std::vector<float>& grad,
                             const std::function<double()>& objective, int count = 24) {
  const double scale = max_abs(grad.data(), grad.size());
  ASSERT_GT(scale, 0.0) << what << ": analytic gradient is identically zero";
  const size_t n = input.size();
  for (int k = 0; k < count; ++k) {
    const size_t i = count == 1 ? 0 : (n - 1) * k / (count - 1);
    const double fd = central_difference(objective, &input[i], kStep);
    EXPECT_NEAR(grad[i], fd, kRelTol * scale + kAbsTol) << what << " element " << i;
  }
}

TEST(ModelOps, FastExpMatchesLibm) {
  double worst = 0.0;
  for (double x = -80.0; x <= 80.0; x += 0.01234) {
    const double rel = std::fabs(fast_expf(static_cast<float>(x)) / std::exp(static_cast<double>(static_cast<float>(x))) - 1.0);
    worst = std::max(worst, rel);
  }
  EXPECT_LT(worst, 5e-7);
  EXPECT_NEAR(fast_tanhf(0.5f), std::tanh(0.5), 1e-6);
  EXPECT_EQ(fast_tanhf(40.0f), 1.0f);
  EXPECT_EQ(fast_tanhf(-40.0f), -1.0f);
}

TEST(ModelOps, EncoderBackwardMatchesFiniteDifferences) {
  // Two packed pieces of 5 and 3 tokens: positions restart at 0 in the second.
  const int N = 8, C = 6, V = 7, maxT = 5;
  const std::vector<int32_t> inp = {1, 3, 3, 0, 6, 2, 5, 1};
  const std::vector<int32_t> cu_seqlens = {0, 5, 8};
  std::vector<float> wte = random_vector(V * C, 1), wpe = random_vector(maxT * C, 2);
  const std::vector<float> w = random_vector(N * C, 3);
  std::vector<float> out(N * C);
  auto objective = [&] {
    encoder_forward(out.data(), inp.data(), wte.data(), wpe.data(), cu_seqlens.data(), 2, C);
    return projection(out, w);
  };
  std::vector<float> dwte(V * C, 0.0f), dwpe(maxT * C, 0.0f);
  encoder_backward(dwte.data(), dwpe.data(), w.data(), inp.data(), cu_seqlens.data(), 2, C);
  expect_gradient_matches("dwte", wte, dwte, objective, 42);
  expect_gradient_matches("dwpe", wpe, dwpe, objective, 30);
  // Token 6 (the second piece's position 1) is wte[5] + wpe[1].
  objective();
  EXPECT_EQ(out[6 * C + 2], wte[5 * C + 2] + wpe[1 * C + 2]);
}

TEST(ModelOps, LayerNormBackwardMatchesFiniteDifferences) {
  const int N = 5, C = 24;  // C > 16 exercises the vectorized partial sums and their tail
  std::vector<float> inp = random_vector(N * C, 4, 2.0), weight = random_vector(C, 5), bias = random_vector(C, 6);
  const std::vector<float> w = random_vector(N * C, 7);
  std::vector<float> out(N * C), mean(N), rstd(N);
  auto objective = [&] {
    layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, C);
    return projection(out, w);
  };
  objective();
  std::vector<float> dinp(N * C, 0.0f), dweight(C, 0.0f), dbias(C, 0.0f);
  layernorm_backward(dinp.data(), dweight.data(), dbias.data(), w.data(), inp.data(), weight.data(), mean.data(),
                     rstd.data(), N, C);
  expect_gradient_matches("dinp", inp, dinp, objective);
  expect_gradient_matches("dweight", weight, dweight, objective);
  expect_gradient_matches("dbias", bias, dbias, objective);
  // Normalized rows: mean 0, variance 1 before the affine part.
  double m = 0.0;
  for (int c = 0; c < C; ++c) m += (inp[c] - mean[0]) * rstd[0];
  EXPECT_NEAR(m / C, 0.0, 1e-6);
}

TEST(ModelOps, MatmulBackwardMatchesFiniteDifferences) {
  const int N = 6, C = 5, OC = 7;
  std::vector<float> inp = random_vector(N * C, 8), weight = random_vector(OC * C, 9), bias = random_vector(OC, 10);
  const std::vector<float> w = random_vector(N * OC, 11);
  std::vector<float> out(N * OC);
  auto objective = [&] {
    matmul_forward(out.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
    return projection(out, w);
  };
  std::vector<float> dinp(N * C, 0.0f), dweight(OC * C, 0.0f), dbias(OC, 0.0f);
  matmul_backward(dinp.data(), dweight.data(), dbias.data(), w.data(), inp.data(), weight.data(), N, C, OC);
  expect_gradient_matches("dinp", inp, dinp, objective);
  expect_gradient_matches("dweight", weight, dweight, objective);
  expect_gradient_matches("dbias", bias, dbias, objective);
  // Backward accumulates: a second call doubles every gradient; the overwrite form replaces dinp.
  std::vector<float> dinp2 = dinp, dweight2 = dweight, dbias2 = dbias;
  matmul_backward(dinp2.data(), dweight2.data(), dbias2.data(), w.data(), inp.data(), weight.data(), N, C, OC);
  EXPECT_FLOAT_EQ(dweight2[3], 2 * dweight[3]);
  EXPECT_FLOAT_EQ(dbias2[2], 2 * dbias[2]);
  std::vector<float> dinp3(N * C, 123.0f);
  matmul_backward_overwrite_dinp(dinp3.data(), dweight2.data(), nullptr, w.data(), inp.data(), weight.data(), N, C, OC);
  EXPECT_FLOAT_EQ(dinp3[4], dinp[4]);
  // Fused residual form = residual + plain forward.
  const std::vector<float> residual = random_vector(N * OC, 12);
  std::vector<float> fused(N * OC);
  matmul_forward(out.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
  matmul_forward_residual(fused.data(), residual.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
  for (int i = 0; i < N * OC; ++i) EXPECT_NEAR(fused[i], residual[i] + out[i], 1e-5);
}

TEST(ModelOps, GeluBackwardMatchesFiniteDifferences) {
  const size_t N = 37;
  std::vector<float> inp = random_vector(N, 13, 2.0);
  const std::vector<float> w = random_vector(N, 14);
  std::vector<float> out(N);
  auto objective = [&] {
    gelu_forward(out.data(), inp.data(), N);
    return projection(out, w);
  };
  objective();
  for (size_t i = 0; i < N; ++i) {  // against the formula in double
    const double x = inp[i];
    const double ref = 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
    EXPECT_NEAR(out[i], ref, 1e-6 * (1.0 + std::fabs(ref)));
  }
  std::vector<float> dinp(N, 0.0f);
  gelu_backward(dinp.data(), inp.data(), w.data(), N);
  expect_gradient_matches("dinp", inp, dinp, objective, static_cast<int>(N));
  std::vector<float> inplace = w;
  gelu_backward_inplace(inplace.data(), inp.data(), N);
  for (size_t i = 0; i < N; ++i) EXPECT_FLOAT_EQ(inplace[i], dinp[i]);
}

TEST(ModelOps, AttentionBackwardMatchesFiniteDifferencesOverPackedPieces) {
  // Pieces of 6, 1 and 4 tokens packed into N = 11 rows.
  const int N = 11, C = 8, NH = 2, pieces = 3;
  const std::vector<int32_t> cu_seqlens = {0, 6, 7, 11};
  std::vector<float> qkv = random_vector(N * 3 * C, 15);
  const std::vector<float> w = random_vector(N * C, 16);
  ASSERT_EQ(attention_saved_floats(cu_seqlens.data(), pieces, NH), size_t(NH * (36 + 1 + 16)));
  std::vector<float> out(N * C), att(attention_saved_floats(cu_seqlens.data(), pieces, NH));
  auto objective = [&] {
    attention_forward(out.data(), att.data(), qkv.data(), cu_seqlens.data(), pieces, C, NH);
    return projection(out, w);
  };
  objective();
  std::vector<float> dqkv(N * 3 * C, 0.0f);
  attention_backward(dqkv.data(), w.data(), qkv.data(), att.data(), cu_seqlens.data(), pieces, C, NH);
  expect_gradient_matches("dqkv", qkv, dqkv, objective, 120);
  objective();  // the finite differences left `out` at a perturbed input
  // A piece of length 1 attends to itself only: its output is its own v.
  for (int c = 0; c < C; ++c) EXPECT_NEAR(out[6 * C + c], qkv[6 * 3 * C + 2 * C + c], 1e-6);
  // Attention never crosses pieces: changing the first piece leaves the others' outputs alone.
  const std::vector<float> before = out;
  for (int t = 0; t < 6; ++t)
    for (int c = 0; c < 3 * C; ++c) qkv[t * 3 * C + c] = 1e3f;
  objective();
  EXPECT_EQ(0, std::memcmp(before.data() + 6 * C, out.data() + 6 * C, sizeof(float) * 5 * C));
}

TEST(ModelOps, AttentionIsCausalAcrossQueryBlocks) {
  // A piece longer than the 64-row query block (after a short one): output row i must not
  // depend on positions after i.
  const int T = 150, C = 4, NH = 1;
  const std::vector<int32_t> cu_seqlens = {0, 3, 3 + T};
  std::vector<float> qkv = random_vector((3 + T) * 3 * C, 17);
  std::vector<float> out((3 + T) * C), out2((3 + T) * C), att(attention_saved_floats(cu_seqlens.data(), 2, NH));
  attention_forward(out.data(), att.data(), qkv.data(), cu_seqlens.data(), 2, C, NH);
  for (int c = 0; c < 3 * C; ++c) qkv[(3 + 100) * 3 * C + c] += 1.0f;
  attention_forward(out2.data(), att.data(), qkv.data(), cu_seqlens.data(), 2, C, NH);
  for (int i = 0; i < (3 + 100) * C; ++i) ASSERT_EQ(out[i], out2[i]) << "row " << i / C << " saw position 100";
  EXPECT_NE(out[(3 + 100) * C], out2[(3 + 100) * C]);
  // Each attention row of the long piece (saved after the short piece's 3x3) sums to 1.
  const float* att_long = att.data() + 9;
  for (int i : {0, 63, 64, 149}) {
    double s = 0.0;
    for (int j = 0; j <= i; ++j) s += att_long[i * T + j];
    EXPECT_NEAR(s, 1.0, 1e-5) << "row " << i;
  }
}

TEST(ModelOps, CrossEntropyBackwardMatchesFiniteDifferences) {
  const int N = 4, V = 37;
  std::vector<float> logits = random_vector(N * V, 18, 3.0);
  const std::vector<int32_t> targets = {3, -1, 36, 0};
  auto objective = [&] { return crossentropy_forward(logits.data(), targets.data(), N, V); };
  // Reference loss in double.
  double ref = 0.0;
  for (int n = 0; n < N; ++n) {
    if (targets[n] < 0) continue;
    double s = 0.0;
    for (int j = 0; j < V; ++j) s += std::exp(static_cast<double>(logits[n * V + j]));
    ref += std::log(s) - logits[n * V + targets[n]];
  }
  EXPECT_NEAR(objective(), ref, 1e-5 * std::fabs(ref));
  std::vector<float> dlogits(N * V, 0.5f);
  const double loss = crossentropy_forward_backward(dlogits.data(), logits.data(), targets.data(), N, V, 1.0f);
  EXPECT_NEAR(loss, ref, 1e-5 * std::fabs(ref));
  for (int j = 0; j < V; ++j) EXPECT_EQ(dlogits[1 * V + j], 0.5f) << "row without target was touched";
  for (float& d : dlogits) d -= 0.5f;
  expect_gradient_matches("dlogits", logits, dlogits, objective, 40);
  // In-place form: same loss, the gradient (times the scale) in place of the logits.
  std::vector<float> inplace = logits;
  const double loss2 = crossentropy_forward_backward_inplace(inplace.data(), targets.data(), N, V, 0.25f);
  EXPECT_NEAR(loss, loss2, 1e-6 * loss);  // same terms, summed in a different order
  for (int i = 0; i < N * V; ++i) EXPECT_NEAR(inplace[i], 0.25f * dlogits[i], 1e-7);
}

}  // namespace
}  // namespace kilter::model
