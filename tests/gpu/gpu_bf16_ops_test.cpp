// The kernels of the Llama family and of the bf16-storage datapath (issues 37 and 38) against
// their CPU twins, on fresh random inputs with odd sizes:
//   fp32 (1e-5 of each tensor's scale; GEMM-based 1e-4): RMSNorm, RoPE (packed pieces with
//   offsets), SwiGLU, grouped-query attention in the cuBLASLt engine and in a later part's prefix
//   attention, AdamW and the squared norm over owned ranges in one launch each;
//   bf16 storage (twins in lib/model/bf16_ops.h, attention_bf16.h, which round where these kernels
//   store bf16): the encoder, the norms fused with the residual add and their backward, the
//   Linear layers with the GELU_AUX/DGELU/BGRADB epilogues (or their fallbacks), GELU, SwiGLU,
//   RoPE, attention (a group in chunks of rows, grouped heads) and a later part's, the chunked
//   classifier, the exchange's adds, the bf16 gather/scatter and the weights' bf16 copy. A bf16 output must be within 1e-2 of its scale (about two bf16 ulps) AND
//   mostly bit for bit (near_bf16): summation orders differ only in fp32; fp32 gradients of bf16
//   operands within 1e-4.
// Exit 0: all pass; 1: a failure; 77: no CUDA device (skipped).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "lib/model/cuda_ops.h"
#include "lib/model/attention.h"
#include "lib/model/attention_bf16.h"
#include "lib/model/bf16_ops.h"
#include "lib/model/encoder.h"
#include "lib/model/gelu.h"
#include "lib/model/layout.h"
#include "lib/model/rmsnorm.h"
#include "lib/model/rope.h"
#include "lib/model/swiglu.h"
#include "lib/optim/adamw.h"
#include "tests/gpu/gpu_test_util.h"

namespace kc = kilter::model::cuda;
namespace km = kilter::model;
using kilter::gputest::Checker;
using kilter::gputest::DeviceBuffer;
using kilter::gputest::offsets_of;
using kilter::gputest::pack_rows;
using kilter::gputest::random_floats;
using kilter::gputest::random_int;
using kilter::gputest::random_lengths;

namespace {

constexpr double kRowTol = 1e-5;
constexpr double kGemmTol = 1e-4;
constexpr double kBf16Tol = 1e-2;    // bf16 outputs against their twins
constexpr double kOneStage = 0.98;   // bit-for-bit share of a kernel that rounds once
constexpr double kChained = 0.9;     // of one whose inputs went through other bf16 roundings

cudaStream_t stream() { return kilter::backend::cuda_compute_stream(); }

std::vector<float> bf16_values(size_t n, float scale = 1.0f) {
  std::vector<float> v = random_floats(n, scale);
  km::round_bf16_inplace(v.data(), v.size());
  return v;
}

std::vector<km::bf16> host_bf16(const std::vector<float>& values) {
  std::vector<km::bf16> out(values.size());
  km::to_bf16(out.data(), values.data(), values.size());
  return out;
}

// bf16 rows on the device, filled from and read back as floats.
class Bf16Device {
 public:
  explicit Bf16Device(size_t n) : data_(n), staging_(n), n_(n) {}
  explicit Bf16Device(const std::vector<float>& host) : Bf16Device(host.size()) { upload(host); }
  void upload(const std::vector<float>& host) {
    KILTER_CUDA_CHECK(cudaMemcpy(staging_.get(), host.data(), sizeof(float) * n_, cudaMemcpyHostToDevice));
    KILTER_CUDA_CHECK(cudaDeviceSynchronize());
    kc::to_bf16(data_.get(), staging_.get(), n_, stream());
  }
  std::vector<float> download() {
    kc::to_float(staging_.get(), data_.get(), n_, stream());
    return staging_.download();
  }
  kc::bf16* get() { return data_.get(); }

 private:
  DeviceBuffer<kc::bf16> data_;
  DeviceBuffer<float> staging_;
  size_t n_;
};

// ---- the Llama family's kernels in fp32 --------------------------------------------------------

void test_rmsnorm(Checker& check) {
  const int N = 150, C = 67;
  const auto inp = random_floats(size_t(N) * C, 2.0f), weight = random_floats(C);
  std::vector<float> out(inp.size()), rstd(N);
  km::rmsnorm_forward(out.data(), rstd.data(), inp.data(), weight.data(), N, C, 1e-6f);
  DeviceBuffer<float> d_inp(inp), d_w(weight), d_out(out.size()), d_rstd(N);
  kc::rmsnorm_forward(d_out.get(), d_rstd.get(), d_inp.get(), d_w.get(), N, C, 1e-6f, stream());
  check.near("rmsnorm_forward out", d_out.download(), out, kRowTol);
  check.near("rmsnorm_forward rstd", d_rstd.download(), rstd, kRowTol);
  const auto dout = random_floats(out.size());
  auto dinp = random_floats(inp.size()), dw = random_floats(C);  // accumulated onto
  DeviceBuffer<float> d_dout(dout), d_dinp(dinp), d_dw(dw), scratch(2 * kc::column_sum_scratch_floats(C));
  km::rmsnorm_backward(dinp.data(), dw.data(), dout.data(), inp.data(), weight.data(), rstd.data(), N, C);
  kc::rmsnorm_backward(d_dinp.get(), d_dw.get(), d_dout.get(), d_inp.get(), d_w.get(), d_rstd.get(), N, C,
                       scratch.get(), stream());
  check.near("rmsnorm_backward dinp", d_dinp.download(), dinp, kRowTol);
  check.near("rmsnorm_backward dweight", d_dw.download(), dw, kRowTol);
}

km::ModelSpec llama_spec(int n_head, int n_kv_head, int n_embd, int context) {
  km::ModelSpec spec;
  spec.arch = "llama";
  spec.n_head = n_head;
  spec.n_kv_head = n_kv_head;
  spec.n_embd = n_embd;
  spec.block_size = context;
  spec.vocab_size = 32;
  spec.rope_scaling = "llama3";
  spec.rope_original_context = 16;
  return spec;
}

// Pieces with offsets (a later part of a cut piece continues its positions), fp32 and bf16.
void test_rope(Checker& check) {
  const km::ModelSpec spec = llama_spec(4, 2, 32, 64);
  const km::AttentionShape shape{4, 2, 8};
  const km::RopeTable table = km::RopeTable::build(spec, spec.block_size);
  const std::vector<int32_t> lengths = {13, 1, 20, 9}, offset = {0, 30, 5, 40};
  const std::vector<int32_t> cu = offsets_of(lengths);
  const int N = cu.back(), pieces = 4, W = shape.row_width();
  std::vector<int32_t> positions(N);
  km::piece_positions(positions.data(), cu.data(), pieces, offset.data());
  DeviceBuffer<float> d_cos(table.cos), d_sin(table.sin);
  DeviceBuffer<int32_t> d_cu(cu), d_offset(offset);
  for (bool backward : {false, true}) {
    const std::string what = backward ? "rope_backward" : "rope_forward";
    const std::vector<float> rows = bf16_values(size_t(N) * W, 2.0f);
    std::vector<float> want = rows;
    (backward ? km::rope_backward : km::rope_forward)(want.data(), positions.data(), N, shape, table);
    DeviceBuffer<float> d_rows(rows);
    if (backward)
      kc::rope_backward(d_rows.get(), d_cu.get(), d_offset.get(), pieces, N, 4, 2, 8, d_cos.get(), d_sin.get(), stream());
    else
      kc::rope_forward(d_rows.get(), d_cu.get(), d_offset.get(), pieces, N, 4, 2, 8, d_cos.get(), d_sin.get(), stream());
    check.near(what + " (fp32, offsets, 2 K/V heads)", d_rows.download(), want, kRowTol);
    km::round_bf16_inplace(want.data(), want.size());
    Bf16Device b_rows(rows);
    if (backward)
      kc::rope_backward(b_rows.get(), d_cu.get(), d_offset.get(), pieces, N, 4, 2, 8, d_cos.get(), d_sin.get(), stream());
    else
      kc::rope_forward(b_rows.get(), d_cu.get(), d_offset.get(), pieces, N, 4, 2, 8, d_cos.get(), d_sin.get(), stream());
    check.near_bf16("[bf16] " + what, b_rows.download(), want, kBf16Tol, kOneStage);
  }
}

void test_swiglu(Checker& check) {
  const int N = 37, F = 45;
  const auto inp = bf16_values(size_t(N) * 2 * F, 3.0f), dout = bf16_values(size_t(N) * F);
  std::vector<float> out(size_t(N) * F), dinp(inp.size());
  km::swiglu_forward(out.data(), inp.data(), N, F);
  km::swiglu_backward(dinp.data(), dout.data(), inp.data(), N, F);
  DeviceBuffer<float> d_inp(inp), d_dout(dout), d_out(out.size()), d_dinp(inp.size());
  kc::swiglu_forward(d_out.get(), d_inp.get(), N, F, stream());
  kc::swiglu_backward(d_dinp.get(), d_dout.get(), d_inp.get(), N, F, stream());
  check.near("swiglu_forward", d_out.download(), out, kRowTol);
  check.near("swiglu_backward", d_dinp.download(), dinp, kRowTol);
  std::vector<float> out16(out.size()), dinp16(dinp.size());
  km::swiglu_forward_bf16(out16.data(), inp.data(), N, F);
  km::swiglu_backward_bf16(dinp16.data(), dout.data(), inp.data(), N, F);
  Bf16Device b_inp(inp), b_dout(dout), b_out(out.size()), b_dinp(inp.size());
  kc::swiglu_forward(b_out.get(), b_inp.get(), N, F, stream());
  kc::swiglu_backward(b_dinp.get(), b_dout.get(), b_inp.get(), N, F, stream());
  check.near_bf16("[bf16] swiglu_forward", b_out.download(), out16, kBf16Tol, kOneStage);
  check.near_bf16("[bf16] swiglu_backward", b_dinp.download(), dinp16, kBf16Tol, kOneStage);
}

// Grouped-query attention in the fp32 cuBLASLt engine: one padded group of ragged rows against
// the CPU's packed attention with the same AttentionShape; then a later part's prefix attention.
void test_gqa_attention(Checker& check, kc::Gemm& gemm) {
  const int B = 3, T = 19, NH = 6, NKV = 2, hd = 8, C = NH * hd;
  const km::AttentionShape shape{NH, NKV, hd};
  const int W = shape.row_width();
  std::vector<int32_t> lengths = {T, 1, 11};
  const std::vector<int32_t> cu = offsets_of(lengths);
  const auto qkv = random_floats(size_t(B) * T * W, 2.0f), dout = random_floats(size_t(B) * T * C);
  // Padded (B,T) rows for the device; the packed real rows for the CPU.
  const std::vector<float> packed_qkv = pack_rows(qkv, lengths, T, W), packed_dout = pack_rows(dout, lengths, T, C);
  std::vector<float> out(size_t(cu.back()) * C), att(km::attention_saved_floats(cu.data(), B, NH));
  std::vector<float> dqkv(packed_qkv.size(), 0.0f);
  km::attention_forward(out.data(), att.data(), packed_qkv.data(), cu.data(), B, shape);
  km::attention_backward(dqkv.data(), packed_dout.data(), packed_qkv.data(), att.data(), cu.data(), B, shape);
  DeviceBuffer<float> d_qkv(qkv), d_dout(dout), d_out(size_t(B) * T * C), d_att(size_t(B) * NH * T * T);
  DeviceBuffer<float> d_dqkv(qkv.size()), workspace(kc::attention_workspace_floats(B, T, C, NH));
  DeviceBuffer<int32_t> d_lengths(lengths);
  kc::attention_forward(gemm, d_out.get(), d_att.get(), d_qkv.get(), d_lengths.get(), B, T, C, NH, workspace.get(), NKV);
  kc::attention_backward(gemm, d_dqkv.get(), d_dout.get(), d_qkv.get(), d_att.get(), d_lengths.get(), B, T, C, NH,
                         workspace.get(), false, NKV);
  check.near("GQA attention (6 heads, 2 K/V) forward", pack_rows(d_out.download(), lengths, T, C), out, kGemmTol);
  check.near("GQA attention backward dqkv", pack_rows(d_dqkv.download(), lengths, T, W), dqkv, kGemmTol);

  // A later part: L queries against s prefix keys of the 2 K/V heads.
  const int s = 23, L = 17;
  const std::vector<int32_t> cu1 = {0, L}, offset = {s};
  const auto own = random_floats(size_t(L) * W, 2.0f), prefix = random_floats(size_t(s) * shape.kv_width(), 2.0f);
  const auto pdout = random_floats(size_t(L) * C);
  auto pdqkv = random_floats(own.size()), pdkv = random_floats(prefix.size());  // accumulated onto
  DeviceBuffer<float> e_qkv(own), e_prefix(prefix), e_dout(pdout), e_dqkv(pdqkv), e_dkv(pdkv);
  const float* kv[1] = {prefix.data()};
  float* dkv[1] = {pdkv.data()};
  const km::AttentionPrefix with{offset.data(), kv, dkv};
  std::vector<float> pout(size_t(L) * C), patt(km::attention_saved_floats(cu1.data(), 1, NH, offset.data()));
  km::attention_forward(pout.data(), patt.data(), own.data(), cu1.data(), 1, shape, false, with);
  km::attention_backward(pdqkv.data(), pdout.data(), own.data(), patt.data(), cu1.data(), 1, shape, false, with);
  DeviceBuffer<float> e_out(pout.size()), e_att(patt.size()), e_work(kc::attention_prefix_workspace_floats(s, L, C, NH));
  kc::attention_prefix_forward(gemm, e_out.get(), e_att.get(), e_qkv.get(), e_prefix.get(), s, L, C, NH, e_work.get(),
                               NKV);
  kc::attention_prefix_backward(gemm, e_dqkv.get(), e_dkv.get(), e_dout.get(), e_qkv.get(), e_prefix.get(), e_att.get(),
                                s, L, C, NH, e_work.get(), NKV);
  check.near("GQA prefix attention forward", e_out.download(), pout, kGemmTol);
  check.near("GQA prefix attention dqkv (accumulated)", e_dqkv.download(), pdqkv, kGemmTol);
  check.near("GQA prefix attention prefix dK/dV (accumulated)", e_dkv.download(), pdkv, kGemmTol);
}

// AdamW and the squared norm over owned ranges of a layout in one launch each, against the CPU
// AdamW per part; the bf16 copy written in the same pass is the rounding of the update.
void test_adamw_segments(Checker& check) {
  km::ModelSpec spec;
  spec.n_layer = 2, spec.n_head = 2, spec.n_embd = 24, spec.block_size = 16, spec.vocab_size = 37;
  const km::ParamLayout layout = km::ParamLayout::build(spec, 64);
  const size_t P = layout.padded_size, third = P / 3;
  const std::vector<km::ParamRange> owned = {{0, third}, {2 * third, P - 2 * third}};
  std::vector<kc::AdamWSegment> segments;
  uint64_t total = 0;
  km::for_each_owned_part(layout, owned, [&](size_t lo, size_t hi, size_t k, bool decay) {
    segments.push_back({lo, hi, k, total, decay ? 1.0f : 0.0f});
    total += hi - lo;
  });
  const size_t moments = third + (P - 2 * third);
  auto params = random_floats(P), m = random_floats(moments, 0.01f), v = random_floats(moments, 0.01f);
  for (float& x : v) x = std::fabs(x);
  const auto grads = random_floats(P);
  DeviceBuffer<float> d_p(params), d_g(grads), d_m(m), d_v(v);
  DeviceBuffer<kc::AdamWSegment> d_segments(segments);
  DeviceBuffer<kc::bf16> d_copy(P);
  double norm = 0.0;
  for (const kc::AdamWSegment& seg : segments) {
    kilter::optim::adamw_update(params.data() + seg.lo, grads.data() + seg.lo, m.data() + seg.moment,
                                v.data() + seg.moment, seg.hi - seg.lo, 1e-2f, 0.9f, 0.95f, 1e-8f,
                                seg.decay != 0 ? 0.3f : 0.0f, 0.7f, 4);
    for (uint64_t i = seg.lo; i < seg.hi; ++i) norm += double(grads[i]) * grads[i];
  }
  kc::adamw_update_segments(d_p.get(), d_g.get(), d_m.get(), d_v.get(), d_segments.get(), int(segments.size()), total,
                            1e-2f, 0.9f, 0.95f, 1e-8f, 0.3f, 0.7f, 4, stream(), d_copy.get());
  const std::vector<float> got = d_p.download();
  check.near("AdamW over owned ranges, one launch: params", got, params, kRowTol);
  check.near("AdamW over owned ranges, one launch: m", d_m.download(), m, kRowTol);
  check.near("AdamW over owned ranges, one launch: v", d_v.download(), v, kRowTol);
  std::vector<kc::bf16> copy = d_copy.download();
  bool copy_ok = true;
  for (const kc::AdamWSegment& seg : segments)
    for (uint64_t i = seg.lo; i < seg.hi; ++i) {
      float want = km::round_bf16(got[i]), have = __bfloat162float(copy[i]);
      copy_ok = copy_ok && want == have;
    }
  check.expect("AdamW writes the bf16 copy of every updated parameter", copy_ok);
  DeviceBuffer<double> result(1), scratch(kc::sum_of_squares_scratch_doubles());
  DeviceBuffer<unsigned> counter(1);
  for (int round = 0; round < 2; ++round) {  // the kernel leaves its counter ready for the next call
    kc::sum_of_squares_segments(result.get(), d_g.get(), d_segments.get(), int(segments.size()), total, scratch.get(),
                                counter.get(), stream());
    check.near_scalar("squared norm over owned ranges, one launch (call " + std::to_string(round + 1) + ")",
                      result.download()[0], norm, 1e-12);
  }
}

// ---- the bf16-storage kernels ------------------------------------------------------------------

void test_encoder_and_norms(Checker& check) {
  const int C = 40, V = 61, maxT = 40;
  const std::vector<int32_t> lengths = {13, 1, 7, 9}, offset = {0, 30, 5, 31};
  const std::vector<int32_t> cu = offsets_of(lengths);
  const int N = cu.back(), pieces = 4;
  std::vector<int32_t> inp(N);
  for (int32_t& id : inp) id = random_int(0, V - 1);
  const auto wte = random_floats(size_t(V) * C), wpe = random_floats(size_t(maxT) * C);
  std::vector<float> encoded(size_t(N) * C);
  km::encoder_forward(encoded.data(), inp.data(), wte.data(), wpe.data(), cu.data(), pieces, C, offset.data());
  km::round_bf16_inplace(encoded.data(), encoded.size());
  DeviceBuffer<int32_t> d_inp(inp), d_cu(cu), d_offset(offset);
  DeviceBuffer<float> d_wte(wte), d_wpe(wpe);
  Bf16Device b_encoded(encoded.size());
  kc::encoder_forward_bf16(b_encoded.get(), d_inp.get(), d_wte.get(), d_wpe.get(), d_cu.get(), pieces, N, C, stream(),
                           d_offset.get());
  check.near_bf16("[bf16] encoder_forward", b_encoded.download(), encoded, kBf16Tol, kOneStage);

  const auto weight = random_floats(C), bias = random_floats(C);
  const auto other = bf16_values(size_t(N) * C), dout = bf16_values(size_t(N) * C);
  DeviceBuffer<float> d_w(weight), d_b(bias), scratch(2 * kc::column_sum_scratch_floats(C));
  Bf16Device b_other(other), b_dout(dout);
  for (bool rms : {false, true}) {
    const std::string tag = rms ? "[bf16] rmsnorm " : "[bf16] layernorm ";
    const km::NormSpec norm{rms, 1e-5f};
    const float* cpu_bias = rms ? nullptr : bias.data();
    std::vector<float> residual(encoded.size()), out(encoded.size()), plain(encoded.size()), mean(N), rstd(N);
    km::residual_norm_forward_bf16(residual.data(), out.data(), mean.data(), rstd.data(), encoded.data(), other.data(),
                                   weight.data(), cpu_bias, N, C, norm);
    km::norm_forward_bf16(plain.data(), mean.data(), rstd.data(), residual.data(), weight.data(), cpu_bias, N, C, norm);
    Bf16Device b_residual(residual.size()), b_out(out.size()), b_plain(out.size());
    DeviceBuffer<float> d_mean(N), d_rstd(N);
    kc::residual_norm_forward_bf16(b_residual.get(), b_out.get(), d_mean.get(), d_rstd.get(), b_encoded.get(),
                                   b_other.get(), d_w.get(), rms ? nullptr : d_b.get(), N, C, rms, 1e-5f, stream());
    kc::residual_norm_forward_bf16(nullptr, b_plain.get(), d_mean.get(), d_rstd.get(), b_residual.get(), nullptr,
                                   d_w.get(), rms ? nullptr : d_b.get(), N, C, rms, 1e-5f, stream());
    const std::vector<float> fused = b_out.download(), again = b_plain.download();
    check.near_bf16(tag + "residual add", b_residual.download(), residual, kBf16Tol, kOneStage);
    check.near_bf16(tag + "fused with the residual add", fused, out, kBf16Tol, kOneStage);
    check.expect(tag + "plain norm of the stored sum = the fused norm, bit for bit", fused == again);
    check.near(tag + "rstd", d_rstd.download(), rstd, kRowTol);
    // Backward: dresidual accumulated in fp32, its bf16 copy, dweight and dbias.
    auto dres = random_floats(encoded.size()), dw = random_floats(C), db = random_floats(C);
    std::vector<float> dres_copy(dres.size());
    DeviceBuffer<float> d_dres(dres), d_dw(dw), d_db(db);
    Bf16Device b_copy(dres.size());
    km::norm_backward_bf16(dres.data(), dres_copy.data(), dw.data(), rms ? nullptr : db.data(), dout.data(),
                           residual.data(), weight.data(), mean.data(), rstd.data(), N, C, norm);
    kc::norm_backward_bf16(d_dres.get(), b_copy.get(), d_dw.get(), rms ? nullptr : d_db.get(), b_dout.get(),
                           b_residual.get(), d_w.get(), d_mean.get(), d_rstd.get(), N, C, rms, scratch.get(), stream());
    check.near(tag + "backward dresidual (fp32)", d_dres.download(), dres, kRowTol);
    check.near_bf16(tag + "backward dresidual's bf16 copy", b_copy.download(), dres_copy, kBf16Tol, kOneStage);
    check.near(tag + "backward dweight", d_dw.download(), dw, kRowTol);
    if (!rms) check.near(tag + "backward dbias", d_db.download(), db, kRowTol);
  }
}

// Linear layers: plain, with bias, with GELU_AUX; backward with DGELU and BGRADB (or their
// fallbacks, whichever cuBLASLt offers for the shape: the results are the same).
void test_linear(Checker& check, kc::Gemm& gemm, int N, int C, int OC) {
  const std::string tag = "[bf16] linear " + std::to_string(N) + "x" + std::to_string(C) + "x" + std::to_string(OC) + " ";
  const auto inp = bf16_values(size_t(N) * C), weight = bf16_values(size_t(OC) * C, 0.3f), bias = bf16_values(OC);
  const std::vector<km::bf16> w16 = host_bf16(weight), b16 = host_bf16(bias);
  Bf16Device b_inp(inp), b_w(weight), b_b(bias), b_out(size_t(N) * OC), b_pre(size_t(N) * OC);
  for (bool gelu : {false, true}) {
    std::vector<float> out(size_t(N) * OC), pre(out.size());
    km::linear_forward_bf16(out.data(), gelu ? pre.data() : nullptr, inp.data(), w16.data(), b16.data(), N, C, OC);
    kc::linear_forward_bf16(gemm, b_out.get(), gelu ? b_pre.get() : nullptr, b_inp.get(), b_w.get(), b_b.get(), N, C,
                            OC);
    check.near_bf16(tag + (gelu ? "forward GELU_AUX out" : "forward (bias)"), b_out.download(), out, kBf16Tol,
                    kOneStage);
    if (gelu) check.near_bf16(tag + "forward GELU_AUX pre-activation", b_pre.download(), pre, kBf16Tol, kOneStage);
  }
  // Backward of the GELU layer: dinp through DGELU into the C side needs pre_gelu (N,C).
  const auto dout = bf16_values(size_t(N) * OC), pre_in = bf16_values(size_t(N) * C, 2.0f);
  auto dw = random_floats(weight.size()), db = random_floats(OC);
  std::vector<float> dinp(inp.size()), dinp_plain(inp.size());
  DeviceBuffer<float> d_dw(dw), d_db(db), scratch(kc::linear_scratch_floats(OC));
  Bf16Device b_dout(dout), b_pre_in(pre_in), b_dinp(inp.size());
  km::linear_backward_bf16(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w16.data(), pre_in.data(), N, C,
                           OC);
  kc::linear_backward_bf16(gemm, b_dinp.get(), d_dw.get(), d_db.get(), b_dout.get(), b_inp.get(), b_w.get(),
                           b_pre_in.get(), N, C, OC, scratch.get());
  check.near_bf16(tag + "backward DGELU dinp", b_dinp.download(), dinp, kBf16Tol, kOneStage);
  check.near(tag + "backward dweight (fp32, accumulated)", d_dw.download(), dw, kGemmTol);
  check.near(tag + "backward dbias (BGRADB, accumulated)", d_db.download(), db, kGemmTol);
  km::linear_backward_bf16(dinp_plain.data(), dw.data(), nullptr, dout.data(), inp.data(), w16.data(), nullptr, N, C, OC);
  kc::linear_backward_bf16(gemm, b_dinp.get(), d_dw.get(), nullptr, b_dout.get(), b_inp.get(), b_w.get(), nullptr, N, C,
                           OC, scratch.get());
  check.near_bf16(tag + "backward dinp", b_dinp.download(), dinp_plain, kBf16Tol, kOneStage);
  check.near(tag + "backward dweight, second accumulation", d_dw.download(), dw, kGemmTol);
  // The fallbacks' pieces on their own: GELU, its backward, column sums of bf16 rows.
  const size_t n = size_t(N) * OC;
  std::vector<float> gelu(n), dgelu = dout;
  km::gelu_forward_bf16(gelu.data(), dout.data(), n);
  km::gelu_backward_inplace(dgelu.data(), dout.data(), n);
  km::round_bf16_inplace(dgelu.data(), n);
  Bf16Device b_gelu(n), b_dgelu(dout);
  kc::gelu_forward(b_gelu.get(), b_dout.get(), n, stream());
  kc::gelu_backward_inplace(b_dgelu.get(), b_dout.get(), n, stream());
  check.near_bf16("[bf16] gelu_forward", b_gelu.download(), gelu, kBf16Tol, kOneStage);
  check.near_bf16("[bf16] gelu_backward", b_dgelu.download(), dgelu, kBf16Tol, kOneStage);
  std::vector<float> sums(OC, 0.0f);
  for (int r = 0; r < N; ++r)
    for (int c = 0; c < OC; ++c) sums[c] += dout[size_t(r) * OC + c];
  DeviceBuffer<float> d_sums(OC), col_scratch(kc::column_sum_scratch_floats(OC));
  kc::column_sums_accumulate(d_sums.get(), b_dout.get(), N, OC, col_scratch.get(), stream());
  check.near("[bf16] column sums", d_sums.download(), sums, kRowTol);
}

// One padded group (ragged rows, grouped heads) in chunks of rows, against the twin on the real rows.
void test_attention_bf16(Checker& check, kc::Gemm& gemm, int B, int T, int NH, int NKV, int hd, size_t budget) {
  const std::string tag = "[bf16] attention B" + std::to_string(B) + " T" + std::to_string(T) + " NH" +
                          std::to_string(NH) + " NKV" + std::to_string(NKV) + " ";
  const km::AttentionShape shape{NH, NKV, hd};
  const int C = NH * hd, W = shape.row_width();
  const std::vector<int32_t> lengths = random_lengths(B, T);
  const std::vector<int32_t> cu = offsets_of(lengths);
  const auto qkv = bf16_values(size_t(B) * T * W, 2.0f), dout = bf16_values(size_t(B) * T * C);
  const std::vector<float> packed_qkv = pack_rows(qkv, lengths, T, W), packed_dout = pack_rows(dout, lengths, T, C);
  std::vector<float> out(size_t(cu.back()) * C), att(km::attention_saved_floats(cu.data(), B, NH));
  std::vector<float> dqkv(packed_qkv.size());
  km::attention_bf16_forward(out.data(), att.data(), packed_qkv.data(), cu.data(), B, shape);
  km::attention_bf16_backward(dqkv.data(), packed_dout.data(), packed_qkv.data(), att.data(), cu.data(), B, shape);
  Bf16Device b_qkv(qkv), b_dout(dout), b_out(size_t(B) * T * C), b_att(size_t(B) * NH * T * T), b_dqkv(qkv.size());
  DeviceBuffer<char> workspace(kc::attention_bf16_workspace_bytes(B, T, C, NH, budget));
  DeviceBuffer<int32_t> d_lengths(lengths);
  kc::attention_bf16_forward(gemm, b_out.get(), b_att.get(), b_qkv.get(), d_lengths.get(), B, T, C, NH, NKV,
                             workspace.get(), budget);
  kc::attention_bf16_backward(gemm, b_dqkv.get(), b_dout.get(), b_qkv.get(), b_att.get(), d_lengths.get(), B, T, C, NH,
                              NKV, workspace.get(), budget);
  const std::vector<float> all_out = b_out.download(), all_att = b_att.download();
  const std::vector<float> out_gpu = pack_rows(all_out, lengths, T, C);
  const std::vector<float> dqkv_gpu = pack_rows(b_dqkv.download(), lengths, T, W);
  std::vector<float> att_gpu;
  bool padded_zero = true;
  for (int b = 0; b < B; ++b) {
    for (size_t i = (size_t(b) * T + lengths[b]) * C; i < size_t(b + 1) * T * C; ++i) padded_zero &= all_out[i] == 0.0f;
    const size_t L = lengths[b];
    for (int h = 0; h < NH; ++h)
      for (size_t t = 0; t < L; ++t)
        for (size_t s = 0; s < L; ++s) att_gpu.push_back(all_att[((size_t(b) * NH + h) * T + t) * T + s]);
  }
  check.near_bf16(tag + "forward out", out_gpu, out, kBf16Tol, kChained);
  check.near_bf16(tag + "saved att", att_gpu, att, kBf16Tol, kOneStage);
  check.expect(tag + "padded rows of out exactly 0", padded_zero);
  check.near_bf16(tag + "backward dqkv", dqkv_gpu, dqkv, 2 * kBf16Tol, kChained);
}

void test_prefix_attention_bf16(Checker& check, kc::Gemm& gemm, int s, int L, int NH, int NKV, int hd) {
  const std::string tag = "[bf16] prefix attention s" + std::to_string(s) + " L" + std::to_string(L) + " ";
  const km::AttentionShape shape{NH, NKV, hd};
  const int C = NH * hd, W = shape.row_width();
  const std::vector<int32_t> cu = {0, L}, offset = {s};
  const auto qkv = bf16_values(size_t(L) * W, 2.0f), prefix = bf16_values(size_t(s) * shape.kv_width(), 2.0f);
  const auto dout = bf16_values(size_t(L) * C);
  auto dkv = random_floats(prefix.size());  // accumulated onto
  const float* kv[1] = {prefix.data()};
  std::vector<float> dkv_cpu = dkv;
  float* dkvs[1] = {dkv_cpu.data()};
  const km::AttentionPrefix with{offset.data(), kv, dkvs};
  std::vector<float> out(size_t(L) * C), att(km::attention_saved_floats(cu.data(), 1, NH, offset.data())), dqkv(qkv.size());
  km::attention_bf16_forward(out.data(), att.data(), qkv.data(), cu.data(), 1, shape, with);
  km::attention_bf16_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), cu.data(), 1, shape, with);
  Bf16Device b_qkv(qkv), b_dout(dout), b_out(out.size()), b_att(att.size()), b_dqkv(qkv.size());
  DeviceBuffer<float> d_prefix(prefix), d_dkv(dkv);
  DeviceBuffer<char> workspace(kc::attention_prefix_bf16_workspace_bytes(s, L, C, NH));
  kc::attention_prefix_bf16_forward(gemm, b_out.get(), b_att.get(), b_qkv.get(), d_prefix.get(), s, L, C, NH, NKV,
                                    workspace.get());
  kc::attention_prefix_bf16_backward(gemm, b_dqkv.get(), d_dkv.get(), b_dout.get(), b_qkv.get(), d_prefix.get(),
                                     b_att.get(), s, L, C, NH, NKV, workspace.get());
  check.near_bf16(tag + "forward out", b_out.download(), out, kBf16Tol, kChained);
  check.near_bf16(tag + "saved att", b_att.download(), att, kBf16Tol, kOneStage);
  check.near_bf16(tag + "backward dqkv", b_dqkv.download(), dqkv, 2 * kBf16Tol, kChained);
  check.near(tag + "backward prefix dK/dV (fp32, accumulated)", d_dkv.download(), dkv_cpu, 2 * kBf16Tol);
}

// The head in chunks (R rows, vocabulary padded to Vp) against the twin.
void test_classifier(Checker& check, kc::Gemm& gemm) {
  const int N = 150, C = 40, V = 257, Vp = 384, R = 64;
  const auto x = bf16_values(size_t(N) * C), w = bf16_values(size_t(V) * C, 0.3f);
  std::vector<int32_t> targets(N);
  for (int i = 0; i < N; ++i) targets[i] = i % 9 == 4 ? -1 : random_int(0, V - 1);
  const float scale = 1.0f / 131;
  const std::vector<km::bf16> w16 = host_bf16(w);
  std::vector<float> dx(x.size()), dw = random_floats(w.size());
  DeviceBuffer<float> d_dw(dw);
  const double loss = km::classifier_bf16(dx.data(), dw.data(), x.data(), w16.data(), targets.data(), N, C, V, scale);
  std::vector<float> padded(size_t(Vp) * C, 0.0f);
  std::copy(w.begin(), w.end(), padded.begin());
  Bf16Device b_x(x), b_w(padded), b_dx(x.size()), logits(size_t(R) * Vp);
  DeviceBuffer<int32_t> d_targets(targets);
  DeviceBuffer<float> row_losses(N);
  DeviceBuffer<double> d_loss(std::vector<double>{0.0});
  kc::classifier_chunks_bf16(gemm, b_dx.get(), d_dw.get(), b_x.get(), b_w.get(), d_targets.get(), N, C, V, Vp, R,
                             logits.get(), row_losses.get(), d_loss.get(), scale, nullptr, true);
  check.near_scalar("[bf16] classifier loss (3 chunks, vocabulary padded)", d_loss.download()[0], loss, 1e-4);
  check.near_bf16("[bf16] classifier dx", b_dx.download(), dx, kBf16Tol, kChained);
  check.near("[bf16] classifier dweight (fp32, accumulated)", d_dw.download(), dw, 1e-3);
}

// The datapath's small movers: the exchange's fp32 adds into bf16 rows (round(x + y)), the bf16
// gather into padded attention groups and the scatter back, and the weights' first rounding with
// the head's padded copy (rows past the vocabulary stay zero).
void test_movers(Checker& check) {
  const size_t n = 1000;
  const auto x = bf16_values(n), y = random_floats(n, 0.1f);
  std::vector<float> sum(n);
  for (size_t i = 0; i < n; ++i) sum[i] = km::round_bf16(x[i] + y[i]);
  Bf16Device b_x(x);
  DeviceBuffer<float> d_y(y);
  kc::add_into_bf16(b_x.get(), d_y.get(), n, stream());
  check.near_bf16("[bf16] add_into_bf16 (the exchange's dK/dV)", b_x.download(), sum, kBf16Tol, 1.0);

  const int W = 13;
  const std::vector<int32_t> padded_token = {4, 0, -1, 2, 1, -1, 3};  // 5 token rows, 2 padding rows
  const auto rows = bf16_values(5 * size_t(W));
  Bf16Device b_rows(rows), b_padded(padded_token.size() * W), b_back(rows.size());
  DeviceBuffer<int32_t> d_token(padded_token);
  kc::gather_padded_rows(b_padded.get(), b_rows.get(), d_token.get(), padded_token.size(), W, stream());
  kc::scatter_padded_rows(b_back.get(), b_padded.get(), d_token.get(), padded_token.size(), W, stream());
  const std::vector<float> padded = b_padded.download();
  bool gathered = true;
  for (size_t r = 0; r < padded_token.size(); ++r)
    for (int c = 0; c < W; ++c)
      gathered &= padded[r * W + c] == (padded_token[r] < 0 ? 0.0f : rows[size_t(padded_token[r]) * W + c]);
  check.expect("[bf16] gather into padded rows (padding 0)", gathered);
  check.expect("[bf16] scatter back gives the rows", b_back.download() == rows);

  const int V = 37, C = 8, Vp = 128;
  const auto params = random_floats(100 + size_t(V) * C);
  std::vector<float> want(params.size()), head(size_t(Vp) * C, 0.0f);
  for (size_t i = 0; i < params.size(); ++i) want[i] = km::round_bf16(params[i]);
  std::copy(want.begin() + 100, want.end(), head.begin());
  DeviceBuffer<float> d_params(params);
  Bf16Device b_copy(params.size()), b_head(head.size());
  kc::round_params_bf16(b_copy.get(), d_params.get(), params.size(), b_head.get(), 100, params.size(), stream());
  check.expect("[bf16] the weights' working copy", b_copy.download() == want);
  check.expect("[bf16] the head's padded copy (rows past the vocabulary 0)", b_head.download() == head);
}

}  // namespace

int main() {
  kilter::gputest::skip_without_device();
  try {
    kilter::backend::cuda_device_index();
    Checker check;
    kc::Gemm gemm(stream(), kc::GemmMath::fp32);
    kc::Gemm gemm_bf16(stream(), kc::GemmMath::bf16);
    test_rmsnorm(check);
    test_rope(check);
    test_swiglu(check);
    test_gqa_attention(check, gemm);
    test_adamw_segments(check);
    test_encoder_and_norms(check);
    test_linear(check, gemm_bf16, 45, 37, 29);     // odd: no epilogue (aux rows not a multiple of 8), fallbacks
    test_linear(check, gemm_bf16, 256, 128, 384);  // the epilogues
    test_attention_bf16(check, gemm_bf16, 3, 17, 4, 4, 6, size_t(1) << 20);  // head_dim 6, one chunk
    test_attention_bf16(check, gemm_bf16, 5, 64, 8, 2, 16, 8 * 64 * 64);     // grouped heads, a row per chunk
    test_prefix_attention_bf16(check, gemm_bf16, 37, 70, 4, 4, 6);
    test_prefix_attention_bf16(check, gemm_bf16, 200, 64, 8, 2, 16);
    test_classifier(check, gemm_bf16);
    test_movers(check);
    return check.finish("kilter_gpu_bf16_ops_test");
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
}
