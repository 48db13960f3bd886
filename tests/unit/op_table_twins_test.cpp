// The op table's CPU part that needs no device: each bf16 twin (lib/model/bf16_ops.h,
// attention_bf16.h), which the bf16 rows hold the CUDA kernels to, against the fp32 op on the same
// bf16-valued inputs, within the row's bf16 tolerance (fwd for forward outputs, bwd for every
// gradient). A twin that rounds at a wrong point, or computes another function, is caught here.
// Rows whose twin is only the fp32 op rounded once (the encoder, RoPE, conversions, copies) have
// nothing to compare, and are not instantiated.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "lib/model/attention.h"
#include "lib/model/attention_bf16.h"
#include "lib/model/bf16_ops.h"
#include "lib/model/crossentropy.h"
#include "lib/model/gelu.h"
#include "lib/model/gemm.h"
#include "lib/model/layernorm.h"
#include "lib/model/matmul.h"
#include "lib/model/rmsnorm.h"
#include "lib/model/swiglu.h"
#include "tests/gpu/compare.h"
#include "tests/gpu/op_table.h"

namespace kilter::optable {
namespace {

namespace km = kilter::model;
using gputest::Checker;
using gputest::offsets_of;
using gputest::random_floats;
using gputest::random_int;
using gputest::random_lengths;

std::vector<float> bf16_values(size_t n, float scale = 1.0f) {
  std::vector<float> v = random_floats(n, scale);
  km::round_bf16_inplace(v.data(), v.size());
  return v;
}

std::vector<km::bf16> as_bf16(const std::vector<float>& values) {
  std::vector<km::bf16> out(values.size());
  km::to_bf16(out.data(), values.data(), values.size());
  return out;
}

void residual_norm(const OpCase& c, Checker& check) {
  const int N = c.shape.N, C = c.shape.C;
  const bool rms = c.shape.rms;
  const km::NormSpec norm{rms, 1e-5f};
  const auto a = bf16_values(size_t(N) * C, 2.0f), b = bf16_values(size_t(N) * C), dout = bf16_values(size_t(N) * C);
  const auto weight = random_floats(C), bias = random_floats(C);
  std::vector<float> residual(a.size()), out(a.size()), mean(N), rstd(N);
  km::residual_norm_forward_bf16(residual.data(), out.data(), mean.data(), rstd.data(), a.data(), b.data(),
                                 weight.data(), rms ? nullptr : bias.data(), N, C, norm);
  std::vector<float> sum(a.size()), out32(a.size()), mean32(N), rstd32(N);
  for (size_t i = 0; i < a.size(); ++i) sum[i] = a[i] + b[i];
  if (rms)
    km::rmsnorm_forward(out32.data(), rstd32.data(), sum.data(), weight.data(), N, C, norm.eps);
  else
    km::layernorm_forward(out32.data(), mean32.data(), rstd32.data(), sum.data(), weight.data(), bias.data(), N, C,
                          norm.eps);
  check.near("residual = round(a + b)", residual, sum, c.tol.fwd);
  check.near("out = round(norm(residual))", out, out32, c.tol.fwd);
  check.near("rstd", rstd, rstd32, c.tol.fwd);
  std::vector<float> dres(a.size(), 0.0f), dres16(a.size()), dw(C, 0.0f), db(C, 0.0f);
  std::vector<float> dinp32(a.size(), 0.0f), dw32(C, 0.0f), db32(C, 0.0f);
  km::norm_backward_bf16(dres.data(), dres16.data(), dw.data(), rms ? nullptr : db.data(), dout.data(), residual.data(),
                         weight.data(), mean.data(), rstd.data(), N, C, norm);
  if (rms)
    km::rmsnorm_backward(dinp32.data(), dw32.data(), dout.data(), sum.data(), weight.data(), rstd32.data(), N, C);
  else
    km::layernorm_backward(dinp32.data(), dw32.data(), db32.data(), dout.data(), sum.data(), weight.data(),
                           mean32.data(), rstd32.data(), N, C);
  check.near("dresidual", dres, dinp32, c.tol.bwd);
  check.near("dresidual's bf16 copy", dres16, dinp32, c.tol.bwd);
  check.near("dweight", dw, dw32, c.tol.bwd);
  if (!rms) check.near("dbias", db, db32, c.tol.bwd);
}

void linear(const OpCase& c, Checker& check) {
  const int N = c.shape.N, C = c.shape.C, OC = c.shape.OC;
  const auto inp = bf16_values(size_t(N) * C), weight = bf16_values(size_t(OC) * C, 0.3f), bias = bf16_values(OC);
  const auto w16 = as_bf16(weight), b16 = as_bf16(bias);
  std::vector<float> out(size_t(N) * OC), pre(out.size()), gelu_out(out.size()), h32(out.size()), gelu32(out.size());
  km::matmul_forward(h32.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
  km::gelu_forward(gelu32.data(), h32.data(), h32.size());
  km::linear_forward_bf16(out.data(), nullptr, inp.data(), w16.data(), b16.data(), N, C, OC);
  km::linear_forward_bf16(gelu_out.data(), pre.data(), inp.data(), w16.data(), b16.data(), N, C, OC);
  check.near("forward (bias)", out, h32, c.tol.fwd);
  check.near("forward GELU_AUX pre-activation", pre, h32, c.tol.fwd);
  check.near("forward GELU_AUX out", gelu_out, gelu32, c.tol.fwd);
  const auto dout = bf16_values(size_t(N) * OC), pre_in = bf16_values(size_t(N) * C, 2.0f);
  std::vector<float> dinp(inp.size()), dw(weight.size(), 0.0f), db(OC, 0.0f);
  std::vector<float> dinp32(inp.size(), 0.0f), dw32(weight.size(), 0.0f), db32(OC, 0.0f);
  km::linear_backward_bf16(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w16.data(), pre_in.data(), N, C,
                           OC);
  km::matmul_backward(dinp32.data(), dw32.data(), db32.data(), dout.data(), inp.data(), weight.data(), N, C, OC);
  km::gelu_backward_inplace(dinp32.data(), pre_in.data(), dinp32.size());
  check.near("backward DGELU dinp", dinp, dinp32, c.tol.bwd);
  check.near("backward dweight", dw, dw32, c.tol.bwd);
  check.near("backward dbias", db, db32, c.tol.bwd);
}

void gelu(const OpCase& c, Checker& check) {
  const size_t n = c.shape.N;
  const auto inp = bf16_values(n, 3.0f);
  std::vector<float> out(n), out32(n);
  km::gelu_forward_bf16(out.data(), inp.data(), n);
  km::gelu_forward(out32.data(), inp.data(), n);
  check.near("gelu_forward_bf16", out, out32, c.tol.fwd);
}

void swiglu(const OpCase& c, Checker& check) {
  const int N = c.shape.N, F = c.shape.OC;
  const auto inp = bf16_values(size_t(N) * 2 * F, 3.0f), dout = bf16_values(size_t(N) * F);
  std::vector<float> out(size_t(N) * F), out32(out.size()), dinp(inp.size()), dinp32(inp.size());
  km::swiglu_forward_bf16(out.data(), inp.data(), N, F);
  km::swiglu_forward(out32.data(), inp.data(), N, F);
  km::swiglu_backward_bf16(dinp.data(), dout.data(), inp.data(), N, F);
  km::swiglu_backward(dinp32.data(), dout.data(), inp.data(), N, F);
  check.near("swiglu_forward_bf16", out, out32, c.tol.fwd);
  check.near("swiglu_backward_bf16", dinp, dinp32, c.tol.bwd);
}

// Attention of packed pieces (an attention row's group as pieces, or one later part with its
// prefix): out, the saved softmax, dqkv and the prefix's dK/dV.
void attention(const OpCase& c, Checker& check) {
  const Shape& s = c.shape;
  const km::AttentionShape shape{s.NH, s.NKV, s.hd};
  const bool with_prefix = s.s > 0;
  const std::vector<int32_t> lengths = with_prefix ? std::vector<int32_t>{s.L} : random_lengths(s.B, s.T);
  const std::vector<int32_t> cu = offsets_of(lengths), offset = {s.s};
  const int pieces = static_cast<int>(lengths.size()), N = cu.back();
  const auto qkv = bf16_values(size_t(N) * shape.row_width(), 2.0f), dout = bf16_values(size_t(N) * shape.q_width());
  const auto prefix = bf16_values(size_t(s.s) * shape.kv_width(), 2.0f);
  std::vector<float> dkv(prefix.size(), 0.0f), dkv32(prefix.size(), 0.0f);
  const float* kv[1] = {prefix.data()};
  float* dkvs[1] = {dkv.data()};
  float* dkvs32[1] = {dkv32.data()};
  const km::AttentionPrefix with = with_prefix ? km::AttentionPrefix{offset.data(), kv, dkvs} : km::AttentionPrefix{};
  const km::AttentionPrefix with32 =
      with_prefix ? km::AttentionPrefix{offset.data(), kv, dkvs32} : km::AttentionPrefix{};
  const size_t saved = km::attention_saved_floats(cu.data(), pieces, s.NH, with_prefix ? offset.data() : nullptr);
  std::vector<float> out(size_t(N) * shape.q_width()), out32(out.size()), att(saved), att32(saved);
  std::vector<float> dqkv(qkv.size()), dqkv32(qkv.size(), 0.0f);
  km::attention_bf16_forward(out.data(), att.data(), qkv.data(), cu.data(), pieces, shape, with);
  km::attention_forward(out32.data(), att32.data(), qkv.data(), cu.data(), pieces, shape, false, with32);
  km::attention_bf16_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), cu.data(), pieces, shape, with);
  km::attention_backward(dqkv32.data(), dout.data(), qkv.data(), att32.data(), cu.data(), pieces, shape, false, with32);
  check.near("forward out", out, out32, c.tol.fwd);
  check.near("saved att", att, att32, c.tol.fwd);
  check.near("backward dqkv", dqkv, dqkv32, c.tol.bwd);
  if (with_prefix) check.near("backward prefix dK/dV", dkv, dkv32, c.tol.bwd);
}

// The LM head: logits = x W^T, the summed cross-entropy and its gradients.
void classifier(const OpCase& c, Checker& check) {
  const int N = c.shape.N, C = c.shape.C, V = c.shape.V;
  const auto x = bf16_values(size_t(N) * C), w = bf16_values(size_t(V) * C, 0.3f);
  std::vector<int32_t> targets(N);
  for (int i = 0; i < N; ++i) targets[i] = i % 9 == 4 ? -1 : random_int(0, V - 1);
  const float scale = 1.0f / 131;
  std::vector<float> dx(x.size()), dw(w.size(), 0.0f);
  const auto w16 = as_bf16(w);
  const double loss = km::classifier_bf16(dx.data(), dw.data(), x.data(), w16.data(), targets.data(), N, C, V, scale);
  std::vector<float> logits(size_t(N) * V), dlogits(logits.size(), 0.0f), dx32(x.size(), 0.0f), dw32(w.size(), 0.0f);
  km::matmul_forward(logits.data(), x.data(), w.data(), nullptr, N, C, V);
  const double loss32 = km::crossentropy_forward_backward(dlogits.data(), logits.data(), targets.data(), N, V, scale);
  km::matmul_backward(dx32.data(), dw32.data(), nullptr, dlogits.data(), x.data(), w.data(), N, C, V);
  check.near_scalar("loss", loss, loss32, c.tol.fwd);
  check.near("dx", dx, dx32, c.tol.bwd);
  check.near("dweight", dw, dw32, c.tol.bwd);
}

using TwinCheck = void (*)(const OpCase&, Checker&);
const std::map<std::string, TwinCheck>& twin_checks() {
  static const std::map<std::string, TwinCheck> checks = {
      {"residual_norm_bf16", residual_norm}, {"linear_bf16", linear},       {"gelu_bf16", gelu},
      {"swiglu_bf16", swiglu},               {"attention_bf16", attention}, {"prefix_attention_bf16", attention},
      {"classifier_chunks_bf16", classifier}};
  return checks;
}

std::vector<OpCase> rows_with_twin_check() {
  std::vector<OpCase> rows;
  for (const OpCase& c : op_cases())
    if (twin_checks().count(c.family)) rows.push_back(c);
  return rows;
}

class Bf16TwinAgainstFp32 : public ::testing::TestWithParam<OpCase> {};

TEST_P(Bf16TwinAgainstFp32, WithinTheRowsTolerance) {
  Checker check;
  twin_checks().at(GetParam().family)(GetParam(), check);
  EXPECT_GT(check.checks(), 0);
}

INSTANTIATE_TEST_SUITE_P(Cpu, Bf16TwinAgainstFp32, ::testing::ValuesIn(rows_with_twin_check()),
                         [](const ::testing::TestParamInfo<OpCase>& info) { return info.param.name(); });

// Every family named here has rows (a renamed family would leave its check without cases).
TEST(Bf16TwinAgainstFp32Families, EachCheckHasRows) {
  for (const auto& [family, check] : twin_checks()) EXPECT_NE(find_family(family), nullptr) << family;
}

}  // namespace
}  // namespace kilter::optable
