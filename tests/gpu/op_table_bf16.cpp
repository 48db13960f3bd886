// The op table's bf16-storage families on the CUDA backend (op_table_runners.h): bf16 rows in and
// out, fp32 math inside, against the twins in lib/model/bf16_ops.h and attention_bf16.h, which
// round where these kernels store bf16. A bf16 output must be within the case's tolerance of its
// scale AND mostly bit for bit (Checker::near_bf16); fp32 side outputs (statistics, weight
// gradients) within the fp32 bound.
#include <algorithm>
#include <string>
#include <vector>

#include "lib/model/attention.h"
#include "lib/model/attention_bf16.h"
#include "lib/model/attention_sdpa.h"
#include "lib/model/crossentropy.h"
#include "lib/model/encoder.h"
#include "lib/model/gelu.h"
#include "lib/model/swiglu.h"
#include "tests/gpu/op_table_runners.h"

namespace kilter::optable {

namespace km = kilter::model;
using gputest::DeviceBuffer;
using gputest::offsets_of;
using gputest::pack_rows;
using gputest::random_floats;
using gputest::random_int;
using gputest::random_lengths;

namespace {

void run_swiglu_bf16(CaseContext& x) {
  const int N = x.c.shape.N, F = x.c.shape.OC;
  const auto inp = bf16_values(size_t(N) * 2 * F, 3.0f), dout = bf16_values(size_t(N) * F);
  std::vector<float> out(size_t(N) * F), dinp(inp.size());
  km::swiglu_forward_bf16(out.data(), inp.data(), N, F);
  km::swiglu_backward_bf16(dinp.data(), dout.data(), inp.data(), N, F);
  Bf16Device b_inp(inp, x.stream()), b_dout(dout, x.stream()), b_out(out.size(), x.stream());
  Bf16Device b_dinp(bf16_values(inp.size()), x.stream());  // overwritten
  kc::swiglu_forward(b_out.get(), b_inp.get(), N, F, x.stream());
  kc::swiglu_backward(b_dinp.get(), b_dout.get(), b_inp.get(), N, F, x.stream());
  x.check.near_bf16(x.tag("swiglu_forward"), b_out.download(), out, x.c.tol.fwd, x.c.tol.once);
  x.check.near_bf16(x.tag("swiglu_backward"), b_dinp.download(), dinp, x.c.tol.bwd, x.c.tol.once);
}

// out = round(wte[inp] + wpe[position]) from the fp32 weights, and from their bf16 working copy.
void run_encoder_bf16(CaseContext& x) {
  const Shape& s = x.c.shape;
  const int C = s.C, V = s.V;
  const std::vector<int32_t> cu = offsets_of(s.lengths);
  const int N = cu.back(), pieces = static_cast<int>(s.lengths.size());
  std::vector<int32_t> inp(N);
  for (int32_t& id : inp) id = random_int(0, V - 1);
  const auto wte = random_floats(size_t(V) * C), wpe = random_floats(size_t(s.context) * C);
  const float* host_wpe = s.position_table ? wpe.data() : nullptr;
  std::vector<float> encoded(size_t(N) * C);
  km::encoder_forward(encoded.data(), inp.data(), wte.data(), host_wpe, cu.data(), pieces, C,
                      s.offsets.empty() ? nullptr : s.offsets.data());
  km::round_bf16_inplace(encoded.data(), encoded.size());
  DeviceBuffer<int32_t> d_inp(inp), d_cu(cu), d_offset(s.offsets);
  DeviceBuffer<float> d_wte(wte), d_wpe(wpe);
  Bf16Device b_encoded(encoded.size(), x.stream());
  kc::encoder_forward_bf16(b_encoded.get(), d_inp.get(), d_wte.get(), s.position_table ? d_wpe.get() : nullptr,
                           d_cu.get(), pieces, N, C, x.stream(), s.offsets.empty() ? nullptr : d_offset.get());
  x.check.near_bf16(x.tag("encoder_forward_bf16"), b_encoded.download(), encoded, x.c.tol.fwd, x.c.tol.once);
  // The distributed optimizer's form: the tables' bf16 working copy, summed in fp32 (the CPU
  // twin: encoder_forward on the rounded tables, rounded once).
  std::vector<float> wte_r = wte, wpe_r = wpe, from_copy(encoded.size());
  km::round_bf16_inplace(wte_r.data(), wte_r.size());
  km::round_bf16_inplace(wpe_r.data(), wpe_r.size());
  km::encoder_forward(from_copy.data(), inp.data(), wte_r.data(), s.position_table ? wpe_r.data() : nullptr, cu.data(),
                      pieces, C, s.offsets.empty() ? nullptr : s.offsets.data());
  km::round_bf16_inplace(from_copy.data(), from_copy.size());
  Bf16Device b_wte(wte_r, x.stream()), b_wpe(wpe_r, x.stream()), b_from_copy(from_copy.size(), x.stream());
  const kc::bf16* copy_wte = b_wte.get();
  kc::encoder_forward_bf16(b_from_copy.get(), d_inp.get(), copy_wte, s.position_table ? b_wpe.get() : nullptr,
                           d_cu.get(), pieces, N, C, x.stream(), s.offsets.empty() ? nullptr : d_offset.get());
  x.check.near_bf16(x.tag("encoder_forward_bf16 (bf16 tables)"), b_from_copy.download(), from_copy, x.c.tol.fwd,
                    x.c.tol.once);
}

// The norm fused with the residual add, the plain norm of the stored sum (the same bits), and the
// backward: dresidual accumulated in fp32, its bf16 copy, dweight and dbias.
void run_residual_norm_bf16(CaseContext& x) {
  const int N = x.c.shape.N, C = x.c.shape.C;
  const bool rms = x.c.shape.rms;
  const float eps = 1e-5f;
  const km::NormSpec norm{rms, eps};
  const auto a = bf16_values(size_t(N) * C, 2.0f), b = bf16_values(size_t(N) * C), dout = bf16_values(size_t(N) * C);
  const auto weight = random_floats(C), bias = random_floats(C);
  const float* cpu_bias = rms ? nullptr : bias.data();
  std::vector<float> residual(a.size()), out(a.size()), mean(N), rstd(N);
  km::residual_norm_forward_bf16(residual.data(), out.data(), mean.data(), rstd.data(), a.data(), b.data(),
                                 weight.data(), cpu_bias, N, C, norm);
  DeviceBuffer<float> d_w(weight), d_b(bias), d_mean(N), d_rstd(N), scratch(2 * kc::column_sum_scratch_floats(C));
  float* device_bias = rms ? nullptr : d_b.get();
  Bf16Device b_a(a, x.stream()), b_b(b, x.stream()), b_dout(dout, x.stream());
  Bf16Device b_residual(a.size(), x.stream()), b_out(a.size(), x.stream()), b_plain(a.size(), x.stream());
  kc::residual_norm_forward_bf16(b_residual.get(), b_out.get(), d_mean.get(), d_rstd.get(), b_a.get(), b_b.get(),
                                 d_w.get(), device_bias, N, C, rms, eps, x.stream());
  const std::vector<float> fused = b_out.download();
  x.check.near_bf16(x.tag("residual add"), b_residual.download(), residual, x.c.tol.fwd, x.c.tol.once);
  x.check.near_bf16(x.tag("norm fused with the residual add"), fused, out, x.c.tol.fwd, x.c.tol.once);
  x.check.near(x.tag("rstd"), d_rstd.download(), rstd, x.c.tol.fp32);
  if (!rms) x.check.near(x.tag("mean"), d_mean.download(), mean, x.c.tol.fp32);
  kc::residual_norm_forward_bf16(nullptr, b_plain.get(), d_mean.get(), d_rstd.get(), b_residual.get(), nullptr,
                                 d_w.get(), device_bias, N, C, rms, eps, x.stream());
  x.check.expect(x.tag("plain norm of the stored sum = the fused norm, bit for bit"), b_plain.download() == fused);

  auto dres = random_floats(a.size()), dw = random_floats(C), db = random_floats(C);  // accumulated onto
  std::vector<float> dres_copy(dres.size());
  DeviceBuffer<float> d_dres(dres), d_dw(dw), d_db(db);
  Bf16Device b_copy(dres.size(), x.stream());
  km::norm_backward_bf16(dres.data(), dres_copy.data(), dw.data(), rms ? nullptr : db.data(), dout.data(),
                         residual.data(), weight.data(), mean.data(), rstd.data(), N, C, norm);
  kc::norm_backward_bf16(d_dres.get(), b_copy.get(), d_dw.get(), rms ? nullptr : d_db.get(), b_dout.get(),
                         b_residual.get(), d_w.get(), d_mean.get(), d_rstd.get(), N, C, rms, scratch.get(), x.stream());
  x.check.near(x.tag("norm_backward_bf16 dresidual (fp32, accumulated)"), d_dres.download(), dres, x.c.tol.fp32);
  x.check.near_bf16(x.tag("norm_backward_bf16 dresidual's bf16 copy"), b_copy.download(), dres_copy, x.c.tol.bwd,
                    x.c.tol.once);
  x.check.near(x.tag("norm_backward_bf16 dweight"), d_dw.download(), dw, x.c.tol.fp32);
  if (!rms) x.check.near(x.tag("norm_backward_bf16 dbias"), d_db.download(), db, x.c.tol.fp32);
}

// Linear layers: with bias, with GELU_AUX; backward with DGELU and BGRADB, then plain (or their
// fallbacks, whichever cuBLASLt offers for the shape: the results are the same).
void run_linear_bf16(CaseContext& x) {
  const int N = x.c.shape.N, C = x.c.shape.C, OC = x.c.shape.OC;
  const auto inp = bf16_values(size_t(N) * C), weight = bf16_values(size_t(OC) * C, 0.3f), bias = bf16_values(OC);
  const std::vector<km::bf16> w16 = host_bf16(weight), b16 = host_bf16(bias);
  Bf16Device b_inp(inp, x.stream()), b_w(weight, x.stream()), b_b(bias, x.stream());
  Bf16Device b_out(size_t(N) * OC, x.stream()), b_pre(size_t(N) * OC, x.stream());
  for (bool gelu : {false, true}) {
    std::vector<float> out(size_t(N) * OC), pre(out.size());
    km::linear_forward_bf16(out.data(), gelu ? pre.data() : nullptr, inp.data(), w16.data(), b16.data(), N, C, OC);
    kc::linear_forward_bf16(x.gemm, b_out.get(), gelu ? b_pre.get() : nullptr, b_inp.get(), b_w.get(), b_b.get(), N,
                            C, OC);
    x.check.near_bf16(x.tag(gelu ? "forward GELU_AUX out" : "forward (bias)"), b_out.download(), out, x.c.tol.fwd,
                      x.c.tol.once);
    if (gelu)
      x.check.near_bf16(x.tag("forward GELU_AUX pre-activation"), b_pre.download(), pre, x.c.tol.fwd, x.c.tol.once);
  }
  // Backward of the GELU layer: dinp through DGELU into the C side needs pre_gelu (N,C).
  const auto dout = bf16_values(size_t(N) * OC), pre_in = bf16_values(size_t(N) * C, 2.0f);
  auto dw = random_floats(weight.size()), db = random_floats(OC);  // accumulated onto
  std::vector<float> dinp(inp.size()), dinp_plain(inp.size());
  DeviceBuffer<float> d_dw(dw), d_db(db), scratch(kc::linear_scratch_floats(OC));
  Bf16Device b_dout(dout, x.stream()), b_pre_in(pre_in, x.stream()), b_dinp(inp.size(), x.stream());
  km::linear_backward_bf16(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w16.data(), pre_in.data(), N, C,
                           OC);
  kc::linear_backward_bf16(x.gemm, b_dinp.get(), d_dw.get(), d_db.get(), b_dout.get(), b_inp.get(), b_w.get(),
                           b_pre_in.get(), N, C, OC, scratch.get());
  x.check.near_bf16(x.tag("backward DGELU dinp"), b_dinp.download(), dinp, x.c.tol.bwd, x.c.tol.once);
  x.check.near(x.tag("backward dweight (fp32, accumulated)"), d_dw.download(), dw, x.c.tol.fp32);
  x.check.near(x.tag("backward dbias (BGRADB, accumulated)"), d_db.download(), db, x.c.tol.fp32);
  km::linear_backward_bf16(dinp_plain.data(), dw.data(), nullptr, dout.data(), inp.data(), w16.data(), nullptr, N, C,
                           OC);
  kc::linear_backward_bf16(x.gemm, b_dinp.get(), d_dw.get(), nullptr, b_dout.get(), b_inp.get(), b_w.get(), nullptr, N,
                           C, OC, scratch.get());
  x.check.near_bf16(x.tag("backward dinp"), b_dinp.download(), dinp_plain, x.c.tol.bwd, x.c.tol.once);
  x.check.near(x.tag("backward dweight, second accumulation"), d_dw.download(), dw, x.c.tol.fp32);
}

// The Linear layers' fallback pieces: round(gelu(x)) and d = round(gelu'(x) d) in place.
void run_gelu_bf16(CaseContext& x) {
  const size_t n = x.c.shape.N;
  const auto inp = bf16_values(n, 3.0f), d = bf16_values(n);
  std::vector<float> gelu(n), dgelu = d;
  km::gelu_forward_bf16(gelu.data(), inp.data(), n);
  km::gelu_backward_inplace(dgelu.data(), inp.data(), n);
  km::round_bf16_inplace(dgelu.data(), n);
  Bf16Device b_inp(inp, x.stream()), b_gelu(n, x.stream()), b_d(d, x.stream());
  kc::gelu_forward(b_gelu.get(), b_inp.get(), n, x.stream());
  kc::gelu_backward_inplace(b_d.get(), b_inp.get(), n, x.stream());
  x.check.near_bf16(x.tag("gelu_forward (bf16)"), b_gelu.download(), gelu, x.c.tol.fwd, x.c.tol.once);
  x.check.near_bf16(x.tag("gelu_backward_inplace"), b_d.download(), dgelu, x.c.tol.bwd, x.c.tol.once);
}

// out (C) += the column sums of bf16 rows, in fp32.
void run_column_sums_bf16(CaseContext& x) {
  const int N = x.c.shape.N, C = x.c.shape.C;
  const auto rows = bf16_values(size_t(N) * C);
  auto sums = random_floats(C);
  DeviceBuffer<float> d_sums(sums), scratch(kc::column_sum_scratch_floats(C));
  for (int c = 0; c < C; ++c) {
    double sum = sums[c];
    for (int r = 0; r < N; ++r) sum += rows[size_t(r) * C + c];
    sums[c] = static_cast<float>(sum);
  }
  Bf16Device b_rows(rows, x.stream());
  kc::column_sums_accumulate(d_sums.get(), b_rows.get(), N, C, scratch.get(), x.stream());
  x.check.near(x.tag("column_sums_accumulate (bf16 rows)"), d_sums.download(), sums, x.c.tol.fwd);
}

// One padded group (ragged rows, grouped heads) in chunks of rows, against the twin on the real rows.
void run_attention_bf16(CaseContext& x) {
  const Shape& s = x.c.shape;
  const km::AttentionShape shape{s.NH, s.NKV, s.hd};
  const int B = s.B, T = s.T, NH = s.NH, C = shape.q_width(), W = shape.row_width();
  const std::vector<int32_t> lengths = s.lengths.empty() ? random_lengths(B, T) : s.lengths;
  const std::vector<int32_t> cu = offsets_of(lengths);
  const auto qkv = bf16_values(size_t(B) * T * W, 2.0f), dout = bf16_values(size_t(B) * T * C);
  const std::vector<float> packed_qkv = pack_rows(qkv, lengths, T, W), packed_dout = pack_rows(dout, lengths, T, C);
  std::vector<float> out(size_t(cu.back()) * C), att(km::attention_saved_floats(cu.data(), B, NH));
  std::vector<float> dqkv(packed_qkv.size());
  km::attention_bf16_forward(out.data(), att.data(), packed_qkv.data(), cu.data(), B, shape);
  km::attention_bf16_backward(dqkv.data(), packed_dout.data(), packed_qkv.data(), att.data(), cu.data(), B, shape);
  Bf16Device b_qkv(qkv, x.stream()), b_dout(dout, x.stream()), b_out(size_t(B) * T * C, x.stream());
  Bf16Device b_att(size_t(B) * NH * T * T, x.stream()), b_dqkv(qkv.size(), x.stream());
  DeviceBuffer<char> workspace(kc::attention_bf16_workspace_bytes(B, T, C, NH, s.budget));
  DeviceBuffer<int32_t> d_lengths(lengths);
  kc::attention_bf16_forward(x.gemm, b_out.get(), b_att.get(), b_qkv.get(), d_lengths.get(), B, T, C, NH, s.NKV,
                             workspace.get(), s.budget);
  kc::attention_bf16_backward(x.gemm, b_dqkv.get(), b_dout.get(), b_qkv.get(), b_att.get(), d_lengths.get(), B, T, C,
                              NH, s.NKV, workspace.get(), s.budget);
  const std::vector<float> all_out = b_out.download(), all_att = b_att.download();
  std::vector<float> att_gpu;
  bool padded_zero = true;
  for (int b = 0; b < B; ++b) {
    for (size_t i = (size_t(b) * T + lengths[b]) * C; i < size_t(b + 1) * T * C; ++i) padded_zero &= all_out[i] == 0.0f;
    const size_t L = lengths[b];
    for (int h = 0; h < NH; ++h)
      for (size_t t = 0; t < L; ++t)
        for (size_t j = 0; j < L; ++j) att_gpu.push_back(all_att[((size_t(b) * NH + h) * T + t) * T + j]);
  }
  x.check.near_bf16(x.tag("forward out"), pack_rows(all_out, lengths, T, C), out, x.c.tol.fwd, x.c.tol.chained);
  x.check.near_bf16(x.tag("saved att"), att_gpu, att, x.c.tol.fwd, x.c.tol.once);
  x.check.expect(x.tag("padded rows of out exactly 0"), padded_zero);
  x.check.near_bf16(x.tag("backward dqkv"), pack_rows(b_dqkv.download(), lengths, T, W), dqkv, x.c.tol.bwd,
                    x.c.tol.chained);
}

void run_prefix_attention_bf16(CaseContext& x) {
  const Shape& sh = x.c.shape;
  const km::AttentionShape shape{sh.NH, sh.NKV, sh.hd};
  const int s = sh.s, L = sh.L, NH = sh.NH, C = shape.q_width(), W = shape.row_width();
  const std::vector<int32_t> cu = {0, L}, offset = {s};
  const auto qkv = bf16_values(size_t(L) * W, 2.0f), prefix = bf16_values(size_t(s) * shape.kv_width(), 2.0f);
  const auto dout = bf16_values(size_t(L) * C);
  const auto dkv = random_floats(prefix.size());  // accumulated onto
  const float* kv[1] = {prefix.data()};
  std::vector<float> dkv_cpu = dkv;
  float* dkvs[1] = {dkv_cpu.data()};
  const km::AttentionPrefix with{offset.data(), kv, dkvs};
  std::vector<float> out(size_t(L) * C), att(km::attention_saved_floats(cu.data(), 1, NH, offset.data()));
  std::vector<float> dqkv(qkv.size());
  km::attention_bf16_forward(out.data(), att.data(), qkv.data(), cu.data(), 1, shape, with);
  km::attention_bf16_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), cu.data(), 1, shape, with);
  Bf16Device b_qkv(qkv, x.stream()), b_dout(dout, x.stream()), b_out(out.size(), x.stream());
  Bf16Device b_att(att.size(), x.stream()), b_dqkv(qkv.size(), x.stream());
  DeviceBuffer<float> d_prefix(prefix), d_dkv(dkv);
  DeviceBuffer<char> workspace(kc::attention_prefix_bf16_workspace_bytes(s, L, C, NH));
  kc::attention_prefix_bf16_forward(x.gemm, b_out.get(), b_att.get(), b_qkv.get(), d_prefix.get(), s, L, C, NH, sh.NKV,
                                    workspace.get());
  kc::attention_prefix_bf16_backward(x.gemm, b_dqkv.get(), d_dkv.get(), b_dout.get(), b_qkv.get(), d_prefix.get(),
                                     b_att.get(), s, L, C, NH, sh.NKV, workspace.get());
  x.check.near_bf16(x.tag("forward out"), b_out.download(), out, x.c.tol.fwd, x.c.tol.chained);
  x.check.near_bf16(x.tag("saved att"), b_att.download(), att, x.c.tol.fwd, x.c.tol.once);
  x.check.near_bf16(x.tag("backward dqkv"), b_dqkv.download(), dqkv, x.c.tol.bwd, x.c.tol.chained);
  x.check.near(x.tag("backward prefix dK/dV (fp32, accumulated)"), d_dkv.download(), dkv_cpu, x.c.tol.fp32);
}

// The head in chunks of R rows, the vocabulary padded to Vp, against the twin.
void run_classifier_chunks_bf16(CaseContext& x) {
  const Shape& s = x.c.shape;
  const int N = s.N, C = s.C, V = s.V, Vp = s.Vp, R = s.R;
  const auto xs = bf16_values(size_t(N) * C), w = bf16_values(size_t(V) * C, 0.3f);
  std::vector<int32_t> targets(N);
  for (int i = 0; i < N; ++i) targets[i] = i % 9 == 4 ? -1 : random_int(0, V - 1);
  const float scale = 1.0f / 131;
  const std::vector<km::bf16> w16 = host_bf16(w);
  std::vector<float> dx(xs.size()), dw = random_floats(w.size());
  DeviceBuffer<float> d_dw(dw);
  const double loss = km::classifier_bf16(dx.data(), dw.data(), xs.data(), w16.data(), targets.data(), N, C, V, scale);
  std::vector<float> padded(size_t(Vp) * C, 0.0f);
  std::copy(w.begin(), w.end(), padded.begin());
  Bf16Device b_x(xs, x.stream()), b_w(padded, x.stream()), b_dx(xs.size(), x.stream());
  Bf16Device logits(size_t(R) * Vp, x.stream());
  DeviceBuffer<int32_t> d_targets(targets);
  DeviceBuffer<float> row_losses(N);
  DeviceBuffer<double> d_loss(std::vector<double>{0.0});
  kc::classifier_chunks_bf16(x.gemm, b_dx.get(), d_dw.get(), b_x.get(), b_w.get(), d_targets.get(), N, C, V, Vp, R,
                             logits.get(), row_losses.get(), d_loss.get(), scale, nullptr, true);
  x.check.near_scalar(x.tag("loss (chunks, vocabulary padded)"), d_loss.download()[0], loss, x.c.tol.scalar);
  x.check.near_bf16(x.tag("dx"), b_dx.download(), dx, x.c.tol.bwd, x.c.tol.chained);
  x.check.near(x.tag("dweight (fp32, accumulated)"), d_dw.download(), dw, x.c.tol.fp32);
}

// classifier_bf16 on one chunk of bf16 logits: row losses and dlogits in place (padded columns
// and rows without a target 0), the scale read from device memory; then sum_row_losses.
void run_classifier_rows_bf16(CaseContext& x) {
  const int R = x.c.shape.N, V = x.c.shape.V, Vp = x.c.shape.Vp;
  std::vector<float> logits(size_t(R) * Vp, 0.0f);
  const auto real = bf16_values(size_t(R) * V, 5.0f);
  for (int r = 0; r < R; ++r) std::copy_n(real.begin() + size_t(r) * V, V, logits.begin() + size_t(r) * Vp);
  std::vector<int32_t> targets(R);
  for (int i = 0; i < R; ++i) targets[i] = i % 5 == 4 ? -1 : random_int(0, V - 1);
  const float scale = 1.0f / 29.0f;
  std::vector<float> want(logits.size(), 0.0f), row_losses(R, 0.0f);
  for (int r = 0; r < R; ++r) {
    if (targets[r] < 0) continue;
    std::vector<float> row(real.begin() + size_t(r) * V, real.begin() + size_t(r + 1) * V);
    row_losses[r] = static_cast<float>(km::crossentropy_forward_backward_inplace(row.data(), &targets[r], 1, V, scale));
    km::round_bf16_inplace(row.data(), row.size());
    std::copy(row.begin(), row.end(), want.begin() + size_t(r) * Vp);
  }
  Bf16Device b_logits(logits, x.stream());
  DeviceBuffer<int32_t> d_targets(targets);
  DeviceBuffer<float> d_losses(random_floats(R)), d_scale(std::vector<float>{scale});
  kc::classifier_bf16(b_logits.get(), d_losses.get(), d_targets.get(), R, V, Vp, 1234.0f, d_scale.get(), true,
                      x.stream());
  const std::vector<float> losses = d_losses.download();
  x.check.near(x.tag("classifier_bf16 row losses (rows without a target 0)"), losses, row_losses, x.c.tol.fp32);
  x.check.near_bf16(x.tag("classifier_bf16 dlogits in place"), b_logits.download(), want, x.c.tol.bwd, x.c.tol.once);
  DeviceBuffer<double> d_sum(std::vector<double>{1.5});
  double sum = 1.5;
  for (float loss : losses) sum += loss;
  kc::sum_row_losses(d_sum.get(), d_losses.get(), R, x.stream());
  x.check.near_scalar(x.tag("sum_row_losses (added)"), d_sum.download()[0], sum, x.c.tol.scalar);
}

// to_bf16 / to_float against round_bf16, and the exchange's fp32 adds into bf16 rows.
void run_convert_bf16(CaseContext& x) {
  const size_t n = x.c.shape.N;
  const auto values = random_floats(n, 3.0f);
  std::vector<float> rounded = values;
  km::round_bf16_inplace(rounded.data(), n);
  DeviceBuffer<float> d_values(values), d_back(n);
  DeviceBuffer<kc::bf16> d_bf16(n);
  kc::to_bf16(d_bf16.get(), d_values.get(), n, x.stream());
  kc::to_float(d_back.get(), d_bf16.get(), n, x.stream());
  x.check.expect(x.tag("to_bf16 then to_float = round_bf16, bit for bit"), d_back.download() == rounded);
  DeviceBuffer<float> d_round(values);  // train.grad_dtype = bf16's rounding in place
  kc::round_bf16_inplace(d_round.get(), n, x.stream());
  x.check.expect(x.tag("round_bf16_inplace = round_bf16, bit for bit"), d_round.download() == rounded);
  const auto base = bf16_values(n), y = random_floats(n, 0.1f);
  std::vector<float> sum(n);
  for (size_t i = 0; i < n; ++i) sum[i] = km::round_bf16(base[i] + y[i]);
  Bf16Device b_x(base, x.stream());
  DeviceBuffer<float> d_y(y);
  kc::add_into_bf16(b_x.get(), d_y.get(), n, x.stream());
  x.check.near_bf16(x.tag("add_into_bf16 (the exchange's dK/dV)"), b_x.download(), sum, x.c.tol.fwd, x.c.tol.once);
}

// Rows into padded attention groups (padding rows 0) and back.
void run_padded_rows_bf16(CaseContext& x) {
  const int W = x.c.shape.C;
  const std::vector<int32_t> padded_token = {4, 0, -1, 2, 1, -1, 3};  // 5 token rows, 2 padding rows
  const auto rows = bf16_values(size_t(x.c.shape.N) * W);
  Bf16Device b_rows(rows, x.stream()), b_padded(padded_token.size() * W, x.stream()), b_back(rows.size(), x.stream());
  DeviceBuffer<int32_t> d_token(padded_token);
  kc::gather_padded_rows(b_padded.get(), b_rows.get(), d_token.get(), padded_token.size(), W, x.stream());
  kc::scatter_padded_rows(b_back.get(), b_padded.get(), d_token.get(), padded_token.size(), W, x.stream());
  const std::vector<float> padded = b_padded.download();
  bool gathered = true;
  for (size_t r = 0; r < padded_token.size(); ++r)
    for (int c = 0; c < W; ++c)
      gathered &= padded[r * W + c] == (padded_token[r] < 0 ? 0.0f : rows[size_t(padded_token[r]) * W + c]);
  x.check.expect(x.tag("gather into padded rows (padding 0)"), gathered);
  x.check.expect(x.tag("scatter back gives the rows"), b_back.download() == rows);
}

// The weights' first rounding with the head's padded copy (rows past the vocabulary, zero when
// allocated, stay zero).
void run_round_params_bf16(CaseContext& x) {
  const int first = x.c.shape.N, V = x.c.shape.V, C = x.c.shape.C, Vp = x.c.shape.Vp;
  const auto params = random_floats(size_t(first) + size_t(V) * C);
  std::vector<float> want(params.size()), head(size_t(Vp) * C, 0.0f);
  for (size_t i = 0; i < params.size(); ++i) want[i] = km::round_bf16(params[i]);
  std::copy(want.begin() + first, want.end(), head.begin());
  DeviceBuffer<float> d_params(params);
  Bf16Device b_copy(params.size(), x.stream()), b_head(head.size(), x.stream());  // zero, as allocated
  kc::round_params_bf16(b_copy.get(), d_params.get(), params.size(), b_head.get(), first, params.size(), x.stream());
  x.check.expect(x.tag("the weights' working copy"), b_copy.download() == want);
  x.check.expect(x.tag("the head's padded copy (rows past the vocabulary 0)"), b_head.download() == head);
}

// Strided rows: fp32 -> bf16 (rounded), bf16 -> fp32 (stored, then added), bf16 copies.
void run_strided_rows_bf16(CaseContext& x) {
  const int rows = x.c.shape.N, cols = x.c.shape.C, ld = x.c.shape.OC;
  const auto src = random_floats(size_t(rows) * ld);
  std::vector<float> rounded(size_t(rows) * cols);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) rounded[size_t(r) * cols + c] = km::round_bf16(src[size_t(r) * ld + c]);
  DeviceBuffer<float> d_src(src);
  Bf16Device packed(rounded.size(), x.stream()), copied(size_t(rows) * ld, x.stream());
  kc::rows_to_bf16(packed.get(), cols, d_src.get(), ld, rows, cols, x.stream());
  x.check.expect(x.tag("rows_to_bf16 (ld -> packed)"), packed.download() == rounded);
  const auto base = random_floats(size_t(rows) * ld);
  std::vector<float> stored = base, added = base;
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      stored[size_t(r) * ld + c] = rounded[size_t(r) * cols + c];
      added[size_t(r) * ld + c] += rounded[size_t(r) * cols + c];
    }
  DeviceBuffer<float> d_stored(base), d_added(base);
  kc::rows_to_fp32(d_stored.get(), ld, packed.get(), cols, rows, cols, false, x.stream());
  kc::rows_to_fp32(d_added.get(), ld, packed.get(), cols, rows, cols, true, x.stream());
  x.check.expect(x.tag("rows_to_fp32 (stored)"), d_stored.download() == stored);
  x.check.expect(x.tag("rows_to_fp32 (added)"), d_added.download() == added);
  const std::vector<float> before = copied.download();
  kc::rows_copy_bf16(copied.get(), ld, packed.get(), cols, rows, cols, x.stream());
  std::vector<float> want = before;
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) want[size_t(r) * ld + c] = rounded[size_t(r) * cols + c];
  x.check.expect(x.tag("rows_copy_bf16 (packed -> ld, the rest untouched)"), copied.download() == want);
}

}  // namespace

void add_bf16_runners(RunnerMap& runners) {
  runners["rope_bf16"] = [](CaseContext& x) { run_rope_rows(x, true); };
  runners["swiglu_bf16"] = run_swiglu_bf16;
  runners["encoder_bf16"] = run_encoder_bf16;
  runners["residual_norm_bf16"] = run_residual_norm_bf16;
  runners["linear_bf16"] = run_linear_bf16;
  runners["gelu_bf16"] = run_gelu_bf16;
  runners["column_sums_bf16"] = run_column_sums_bf16;
  runners["attention_bf16"] = run_attention_bf16;
  runners["prefix_attention_bf16"] = run_prefix_attention_bf16;
  runners["classifier_chunks_bf16"] = run_classifier_chunks_bf16;
  runners["classifier_rows_bf16"] = run_classifier_rows_bf16;
  runners["convert_bf16"] = run_convert_bf16;
  runners["padded_rows_bf16"] = run_padded_rows_bf16;
  runners["round_params_bf16"] = run_round_params_bf16;
  runners["strided_rows_bf16"] = run_strided_rows_bf16;
}

}  // namespace kilter::optable
