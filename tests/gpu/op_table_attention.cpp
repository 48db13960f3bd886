// The op table's fp32 attention families on the CUDA backend (op_table_runners.h): the cuBLASLt
// engine on one padded group of ragged rows (multi-head and grouped-query), its head layout
// kernels, a packed micro-batch through AttentionGroups (gather, groups, scatter), a later part
// of a cut piece with its prefix, and the cuDNN engine where it is built. The CPU twins take
// packed rows: a padded problem is compared on its real rows.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "lib/model/attention.h"
#include "lib/model/attention_groups.h"
#include "tests/gpu/op_table_runners.h"

namespace kilter::optable {

namespace km = kilter::model;
using gputest::DeviceBuffer;
using gputest::offsets_of;
using gputest::pack_rows;
using gputest::random_floats;
using gputest::random_int;
using gputest::random_lengths;
using gputest::unpack_rows;

namespace {

km::AttentionShape attention_shape(const Shape& s) { return {s.NH, s.NKV, s.hd}; }

std::vector<int32_t> group_lengths(const Shape& s) {
  return s.lengths.empty() ? random_lengths(s.B, s.T) : s.lengths;
}

// The causal, in-length part of a padded (B,NH,T,T) att next to the CPU's per-piece (len,len).
void check_saved_att(CaseContext& x, const std::vector<float>& att_gpu, const std::vector<float>& att_cpu,
                     const std::vector<int32_t>& lengths, int NH, int T) {
  std::vector<float> cpu_defined, gpu_defined;
  size_t piece_offset = 0;
  for (size_t b = 0; b < lengths.size(); ++b) {
    const size_t L = lengths[b];
    for (int h = 0; h < NH; ++h)
      for (size_t t = 0; t < L; ++t)
        for (size_t j = 0; j <= t; ++j) {
          cpu_defined.push_back(att_cpu[piece_offset + h * L * L + t * L + j]);
          gpu_defined.push_back(att_gpu[((b * NH + h) * T + t) * T + j]);
        }
    piece_offset += NH * L * L;
  }
  x.check.near(x.tag("attention_forward saved att"), gpu_defined, cpu_defined, x.c.tol.fwd);
}

// One padded group: out (padded rows 0), the saved att, dqkv accumulated onto random values
// (padded rows keep theirs), and dqkv overwritten (accumulate = false) on the real rows.
void run_attention(CaseContext& x) {
  const Shape& s = x.c.shape;
  const km::AttentionShape shape = attention_shape(s);
  const int B = s.B, T = s.T, NH = s.NH, C = shape.q_width(), W = shape.row_width();
  const std::vector<int32_t> lengths = group_lengths(s);
  const std::vector<int32_t> cu = offsets_of(lengths);
  const auto qkv = random_floats(size_t(B) * T * W, 2.0f);
  const std::vector<float> packed_qkv = pack_rows(qkv, lengths, T, W);
  std::vector<float> packed_out(size_t(cu.back()) * C), att(km::attention_saved_floats(cu.data(), B, NH));
  km::attention_forward(packed_out.data(), att.data(), packed_qkv.data(), cu.data(), B, shape);
  std::vector<float> out(size_t(B) * T * C, 0.0f);
  unpack_rows(out, packed_out, lengths, T, C);
  DeviceBuffer<float> d_qkv(qkv), d_out(out.size()), d_att(size_t(B) * NH * T * T);
  DeviceBuffer<float> workspace(kc::attention_workspace_floats(B, T, C, NH));
  DeviceBuffer<int32_t> d_lengths(lengths);
  kc::attention_forward(x.gemm, d_out.get(), d_att.get(), d_qkv.get(), d_lengths.get(), B, T, C, NH, workspace.get(),
                        s.NKV);
  x.check.near(x.tag("attention_forward out (padded rows 0)"), d_out.download(), out, x.c.tol.fwd);
  check_saved_att(x, d_att.download(), att, lengths, NH, T);

  const auto dout = random_floats(out.size());
  const std::vector<float> packed_dout = pack_rows(dout, lengths, T, C);
  auto dqkv = random_floats(qkv.size());
  DeviceBuffer<float> d_dout(dout), d_dqkv(dqkv);
  std::vector<float> packed_dqkv = pack_rows(dqkv, lengths, T, W);
  km::attention_backward(packed_dqkv.data(), packed_dout.data(), packed_qkv.data(), att.data(), cu.data(), B, shape);
  unpack_rows(dqkv, packed_dqkv, lengths, T, W);
  kc::attention_backward(x.gemm, d_dqkv.get(), d_dout.get(), d_qkv.get(), d_att.get(), d_lengths.get(), B, T, C, NH,
                         workspace.get(), /*accumulate=*/true, s.NKV);
  x.check.near(x.tag("attention_backward dqkv (accumulated)"), d_dqkv.download(), dqkv, x.c.tol.bwd);
  std::vector<float> fresh(packed_qkv.size(), 0.0f);
  km::attention_backward(fresh.data(), packed_dout.data(), packed_qkv.data(), att.data(), cu.data(), B, shape);
  kc::attention_backward(x.gemm, d_dqkv.get(), d_dout.get(), d_qkv.get(), d_att.get(), d_lengths.get(), B, T, C, NH,
                         workspace.get(), /*accumulate=*/false, s.NKV);
  x.check.near(x.tag("attention_backward dqkv (overwritten)"), pack_rows(d_dqkv.download(), lengths, T, W), fresh,
               x.c.tol.bwd);
}

// The head layout kernels, bit for bit against the index arithmetic of AttentionShape.
void run_attention_heads(CaseContext& x) {
  const Shape& s = x.c.shape;
  const km::AttentionShape shape = attention_shape(s);
  const int B = s.B, T = s.T, NH = s.NH, hd = s.hd, C = shape.q_width(), W = shape.row_width();
  const std::vector<int32_t> lengths = group_lengths(s);
  const size_t heads = size_t(B) * NH * T * hd;
  auto head_index = [&](int b, int h, int t, int d) { return ((size_t(b) * NH + h) * T + t) * hd + d; };
  auto row = [&](int b, int t) { return size_t(b) * T + t; };
  const auto qkv = random_floats(size_t(B) * T * W), y = random_floats(heads), dout = random_floats(size_t(B) * T * C);
  const auto dq = random_floats(heads), dk = random_floats(heads), dv = random_floats(heads);
  const auto dqkv_before = random_floats(qkv.size());
  std::vector<float> q(heads), k(heads), v(heads), out(size_t(B) * T * C), dy(heads);
  std::vector<float> added = dqkv_before, stored = dqkv_before;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t)
        for (int d = 0; d < hd; ++d) {
          const size_t i = head_index(b, h, t, d), r = row(b, t);
          const bool padded = t >= lengths[b];
          q[i] = qkv[r * W + shape.q_col(h) + d];
          k[i] = qkv[r * W + shape.k_col(h) + d];
          v[i] = qkv[r * W + shape.v_col(h) + d];
          out[r * C + h * hd + d] = padded ? 0.0f : y[i];
          dy[i] = dout[r * C + h * hd + d];
          const float gq = padded ? 0.0f : dq[i];
          added[r * W + shape.q_col(h) + d] += gq;
          stored[r * W + shape.q_col(h) + d] = gq;
          if (h % (NH / s.NKV) != 0) continue;
          float gk = 0.0f, gv = 0.0f;
          for (int m = 0; m < NH / s.NKV && !padded; ++m) {
            gk += dk[head_index(b, h + m, t, d)];
            gv += dv[head_index(b, h + m, t, d)];
          }
          added[r * W + shape.k_col(h) + d] += gk;
          added[r * W + shape.v_col(h) + d] += gv;
          stored[r * W + shape.k_col(h) + d] = gk;
          stored[r * W + shape.v_col(h) + d] = gv;
        }
  DeviceBuffer<float> d_qkv(qkv), d_q(heads), d_k(heads), d_v(heads), d_y(y), d_out(out.size()), d_dout(dout);
  DeviceBuffer<float> d_dy(heads), d_dq(dq), d_dk(dk), d_dv(dv), d_added(dqkv_before), d_stored(dqkv_before);
  DeviceBuffer<int32_t> d_lengths(lengths);
  kc::attention_split_heads(d_q.get(), d_k.get(), d_v.get(), d_qkv.get(), B, T, NH, hd, x.stream(), s.NKV);
  kc::attention_merge_heads(d_out.get(), d_y.get(), B, T, NH, hd, x.stream(), d_lengths.get());
  kc::attention_split_grad(d_dy.get(), d_dout.get(), B, T, NH, hd, x.stream());
  kc::attention_merge_qkv_grad(d_added.get(), d_dq.get(), d_dk.get(), d_dv.get(), B, T, NH, hd, true, x.stream(),
                               d_lengths.get(), s.NKV);
  kc::attention_merge_qkv_grad(d_stored.get(), d_dq.get(), d_dk.get(), d_dv.get(), B, T, NH, hd, false, x.stream(),
                               d_lengths.get(), s.NKV);
  x.check.near(x.tag("attention_split_heads q"), d_q.download(), q, x.c.tol.fwd);
  x.check.near(x.tag("attention_split_heads k (K/V head per query head)"), d_k.download(), k, x.c.tol.fwd);
  x.check.near(x.tag("attention_split_heads v"), d_v.download(), v, x.c.tol.fwd);
  x.check.near(x.tag("attention_merge_heads (padded rows 0)"), d_out.download(), out, x.c.tol.fwd);
  x.check.near(x.tag("attention_split_grad"), d_dy.download(), dy, x.c.tol.bwd);
  x.check.near(x.tag("attention_merge_qkv_grad (added)"), d_added.download(), added, x.c.tol.bwd);
  x.check.near(x.tag("attention_merge_qkv_grad (stored)"), d_stored.download(), stored, x.c.tol.bwd);
}

// The CUDA backend's packed path: the pieces gathered into padded groups (AttentionGroups), each
// group through the cuBLASLt engine, scattered back; pieces of many lengths make several groups.
void run_packed_attention(CaseContext& x) {
  const Shape& s = x.c.shape;
  const km::AttentionShape shape = attention_shape(s);
  const int NH = s.NH, C = shape.q_width(), W = shape.row_width(), context = s.context;
  std::vector<int32_t> lengths = {static_cast<int32_t>(context), 1};
  for (int i = 0; i < 14; ++i) lengths.push_back(random_int(1, context));
  const std::vector<int32_t> cu = offsets_of(lengths);
  const int N = cu.back(), pieces = static_cast<int>(lengths.size());
  const auto qkv = random_floats(size_t(N) * W, 2.0f);
  const auto dout = random_floats(size_t(N) * C);
  std::vector<float> out(size_t(N) * C), att(km::attention_saved_floats(cu.data(), pieces, NH));
  std::vector<float> dqkv(qkv.size(), 0.0f);
  km::attention_forward(out.data(), att.data(), qkv.data(), cu.data(), pieces, shape);
  km::attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), cu.data(), pieces, shape);

  km::AttentionGroups groups;
  groups.build(cu.data(), pieces, context);
  x.check.expect(x.tag("several groups"), groups.groups.size() > 2, std::to_string(groups.groups.size()) + " groups");
  const size_t P = groups.padded_rows();
  size_t saved = 0, workspace_floats = 0;
  std::vector<size_t> saved_offset;
  for (const km::AttentionGroup& g : groups.groups) {
    saved_offset.push_back(saved);
    saved += size_t(g.B) * NH * g.T * g.T;
    workspace_floats = std::max(workspace_floats, kc::attention_workspace_floats(g.B, g.T, C, NH));
  }
  DeviceBuffer<float> d_qkv(qkv), d_dout(dout), d_out(out.size()), d_dqkv(qkv.size()), d_att(saved);
  DeviceBuffer<float> d_pqkv(P * W), d_pio(P * C), d_pdqkv(P * W), workspace(workspace_floats);
  DeviceBuffer<int32_t> d_token(groups.padded_token), d_lengths(groups.lengths);
  kc::gather_padded_rows(d_pqkv.get(), d_qkv.get(), d_token.get(), P, W, x.stream());
  for (size_t g = 0; g < groups.groups.size(); ++g) {
    const km::AttentionGroup& group = groups.groups[g];
    kc::attention_forward(x.gemm, d_pio.get() + group.first_row * C, d_att.get() + saved_offset[g],
                          d_pqkv.get() + group.first_row * W, d_lengths.get() + group.first_length, group.B, group.T,
                          C, NH, workspace.get(), s.NKV);
  }
  kc::scatter_padded_rows(d_out.get(), d_pio.get(), d_token.get(), P, C, false, x.stream());
  x.check.near(x.tag("packed forward out"), d_out.download(), out, x.c.tol.fwd);
  kc::gather_padded_rows(d_pio.get(), d_dout.get(), d_token.get(), P, C, x.stream());
  for (size_t g = 0; g < groups.groups.size(); ++g) {
    const km::AttentionGroup& group = groups.groups[g];
    kc::attention_backward(x.gemm, d_pdqkv.get() + group.first_row * W, d_pio.get() + group.first_row * C,
                           d_pqkv.get() + group.first_row * W, d_att.get() + saved_offset[g],
                           d_lengths.get() + group.first_length, group.B, group.T, C, NH, workspace.get(), false,
                           s.NKV);
  }
  kc::scatter_padded_rows(d_dqkv.get(), d_pdqkv.get(), d_token.get(), P, W, false, x.stream());
  x.check.near(x.tag("packed backward dqkv (scattered, stored)"), d_dqkv.download(), dqkv, x.c.tol.bwd);
  // The scatter's accumulating form adds the group rows once more.
  kc::scatter_padded_rows(d_dqkv.get(), d_pdqkv.get(), d_token.get(), P, W, true, x.stream());
  std::vector<float> twice = dqkv;
  for (float& value : twice) value *= 2.0f;
  x.check.near(x.tag("scatter_padded_rows (accumulate)"), d_dqkv.download(), twice, x.c.tol.bwd);
}

// A later part of a cut piece (L queries, s prefix keys) against the CPU's attention with an
// AttentionPrefix: out, and dqkv and the prefix's dK/dV accumulated onto random values.
void run_prefix_attention(CaseContext& x) {
  const Shape& sh = x.c.shape;
  const km::AttentionShape shape = attention_shape(sh);
  const int s = sh.s, L = sh.L, NH = sh.NH, C = shape.q_width(), W = shape.row_width();
  const std::vector<int32_t> cu = {0, L}, offset = {s};
  const auto qkv = random_floats(size_t(L) * W, 2.0f), prefix = random_floats(size_t(s) * shape.kv_width(), 2.0f);
  const auto dout = random_floats(size_t(L) * C);
  auto dqkv = random_floats(qkv.size()), dprefix = random_floats(prefix.size());  // accumulated onto
  DeviceBuffer<float> d_qkv(qkv), d_prefix(prefix), d_dout(dout), d_dqkv(dqkv), d_dprefix(dprefix);
  const float* kv[1] = {prefix.data()};
  float* dkv[1] = {dprefix.data()};
  const km::AttentionPrefix with{offset.data(), kv, dkv};
  std::vector<float> out(size_t(L) * C), att(km::attention_saved_floats(cu.data(), 1, NH, offset.data()));
  km::attention_forward(out.data(), att.data(), qkv.data(), cu.data(), 1, shape, false, with);
  km::attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), cu.data(), 1, shape, false, with);
  DeviceBuffer<float> d_out(out.size()), d_att(att.size()), workspace(kc::attention_prefix_workspace_floats(s, L, C, NH));
  kc::attention_prefix_forward(x.gemm, d_out.get(), d_att.get(), d_qkv.get(), d_prefix.get(), s, L, C, NH,
                               workspace.get(), sh.NKV);
  x.check.near(x.tag("attention_prefix_forward out"), d_out.download(), out, x.c.tol.fwd);
  kc::attention_prefix_backward(x.gemm, d_dqkv.get(), d_dprefix.get(), d_dout.get(), d_qkv.get(), d_prefix.get(),
                                d_att.get(), s, L, C, NH, workspace.get(), sh.NKV);
  x.check.near(x.tag("attention_prefix_backward dqkv (accumulated)"), d_dqkv.download(), dqkv, x.c.tol.bwd);
  x.check.near(x.tag("attention_prefix_backward prefix dK/dV (accumulated)"), d_dprefix.download(), dprefix,
               x.c.tol.bwd);
}

// The cuDNN engine against the same twin: out and dqkv (it keeps cuDNN's reserve space, not
// att). Padded rows must be exactly 0 in out and leave dqkv exactly as it was (cuDNN does not
// promise to write them; the head merges do).
void run_cudnn_attention(CaseContext& x) {
#ifdef KILTER_WITH_CUDNN
  const Shape& s = x.c.shape;
  const int B = s.B, T = s.T, NH = s.NH, C = s.C;
  const kc::GemmMath math = x.c.math == Math::fp32 ? kc::GemmMath::fp32 : kc::GemmMath::bf16;
  std::unique_ptr<kc::CudnnAttention> engine;
  try {
    engine = std::make_unique<kc::CudnnAttention>(x.stream(), math, C, NH);
  } catch (const kilter::Error& e) {
    GTEST_SKIP() << "cuDNN attention not usable here: " << e.what();
  }
  std::string why;
  const bool supported = engine->supports(B, T, &why);
  x.check.expect(x.tag("CudnnAttention::supports the shape"), supported, why);
  if (!supported) return;
  std::printf("  %s\n", engine->description().c_str());
  const std::vector<int32_t> lengths = random_lengths(B, T);
  const std::vector<int32_t> cu = offsets_of(lengths);
  const auto qkv = random_floats(size_t(B) * T * 3 * C, 2.0f);
  const std::vector<float> packed_qkv = pack_rows(qkv, lengths, T, 3 * C);
  std::vector<float> packed_out(size_t(cu.back()) * C), att(km::attention_saved_floats(cu.data(), B, NH));
  km::attention_forward(packed_out.data(), att.data(), packed_qkv.data(), cu.data(), B, C, NH);
  std::vector<float> out(size_t(B) * T * C, 0.0f);
  unpack_rows(out, packed_out, lengths, T, C);
  DeviceBuffer<float> d_qkv(qkv), d_out(out.size()), reserve(engine->reserve_floats(B, T));
  DeviceBuffer<float> workspace(engine->workspace_floats(B, T));
  DeviceBuffer<int32_t> d_lengths(lengths);
  engine->forward(d_out.get(), reserve.get(), d_qkv.get(), lengths.data(), d_lengths.get(), B, T, workspace.get());
  const std::vector<float> out_gpu = d_out.download();
  x.check.near(x.tag("cuDNN forward out"), out_gpu, out, x.c.tol.fwd);
  bool padded_zero = true;
  for (int b = 0; b < B; ++b)
    for (size_t i = size_t(b * T + lengths[b]) * C; i < size_t(b + 1) * T * C; ++i)
      padded_zero = padded_zero && out_gpu[i] == 0.0f;
  x.check.expect(x.tag("cuDNN forward padded rows exactly 0"), padded_zero);

  const auto dout = random_floats(out.size());
  auto dqkv = random_floats(qkv.size());
  const std::vector<float> dqkv_before = dqkv;
  DeviceBuffer<float> d_dout(dout), d_dqkv(dqkv);
  std::vector<float> packed_dqkv = pack_rows(dqkv, lengths, T, 3 * C);
  km::attention_backward(packed_dqkv.data(), pack_rows(dout, lengths, T, C).data(), packed_qkv.data(), att.data(),
                         cu.data(), B, C, NH);
  unpack_rows(dqkv, packed_dqkv, lengths, T, 3 * C);
  engine->backward(d_dqkv.get(), d_dout.get(), d_qkv.get(), reserve.get(), lengths.data(), d_lengths.get(), B, T,
                   workspace.get(), /*accumulate=*/true);
  const std::vector<float> dqkv_gpu = d_dqkv.download();
  x.check.near(x.tag("cuDNN backward dqkv (accumulated)"), dqkv_gpu, dqkv, x.c.tol.bwd);
  bool padded_untouched = true;
  for (int b = 0; b < B; ++b)
    for (size_t i = size_t(b * T + lengths[b]) * 3 * C; i < size_t(b + 1) * T * 3 * C; ++i)
      padded_untouched = padded_untouched && dqkv_gpu[i] == dqkv_before[i];
  x.check.expect(x.tag("cuDNN backward padded rows of dqkv untouched"), padded_untouched);
#else
  (void)x;
  GTEST_SKIP() << "built without cuDNN: the cuDNN attention engine is not compiled";
#endif
}

}  // namespace

void add_attention_runners(RunnerMap& runners) {
  runners["attention"] = run_attention;
  runners["attention_heads"] = run_attention_heads;
  runners["packed_attention"] = run_packed_attention;
  runners["prefix_attention"] = run_prefix_attention;
  runners["cudnn_attention"] = run_cudnn_attention;
}

}  // namespace kilter::optable
