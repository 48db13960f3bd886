// Each CUDA kernel (lib/model/cuda_ops.h) against its CPU twin (lib/model/<op>.h,
// lib/optim/adamw.h) on fresh random inputs, with odd sizes that exercise tails and unaligned
// GEMM operands. Tolerances (error relative to the CPU tensor's max |value|):
//   elementwise and row ops (encoder, layernorm, gelu, softmax cross-entropy, AdamW): 1e-5
//   fp32 GEMM ops (matmul, attention, cuDNN attention with FMA math): 1e-4;
//   cuDNN attention when cuDNN picks TF32 products for fp32: 2e-3;  bf16 GEMM math: 3e-2
// Exit 0: all pass; 1: a failure; 77: no CUDA device (skipped).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "lib/model/cuda_ops.h"
#include "lib/model/attention.h"
#include "lib/model/attention_groups.h"
#include "lib/model/crossentropy.h"
#include "lib/model/encoder.h"
#include "lib/model/gelu.h"
#include "lib/model/layernorm.h"
#include "lib/model/matmul.h"
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
using kilter::gputest::unpack_rows;

namespace {

constexpr double kRowTol = 1e-5;
constexpr double kGemmTol = 1e-4;
constexpr double kBf16Tol = 3e-2;

// Packed pieces: positions restart in every piece, or start at `offset` (later parts of cut
// pieces, issue 23; empty: none). maxT: rows of wpe, >= the last position reached.
void test_encoder(Checker& check, cudaStream_t stream, const std::vector<int32_t>& lengths,
                  const std::vector<int32_t>& offset, int maxT, const std::string& tag) {
  const int C = 37, V = 61;
  const std::vector<int32_t> cu = offsets_of(lengths);
  const int N = cu.back(), pieces = static_cast<int>(lengths.size());
  std::vector<int32_t> inp(N);
  for (int32_t& id : inp) id = random_int(0, V - 1);
  const auto wte = random_floats(static_cast<size_t>(V) * C), wpe = random_floats(static_cast<size_t>(maxT) * C);
  const int32_t* host_offset = offset.empty() ? nullptr : offset.data();
  std::vector<float> out_cpu(static_cast<size_t>(N) * C);
  km::encoder_forward(out_cpu.data(), inp.data(), wte.data(), wpe.data(), cu.data(), pieces, C, host_offset);
  DeviceBuffer<int32_t> d_inp(inp), d_cu(cu), d_offset(offset);
  const int32_t* device_offset = offset.empty() ? nullptr : d_offset.get();
  DeviceBuffer<float> d_wte(wte), d_wpe(wpe), d_out(out_cpu.size());
  kc::encoder_forward(d_out.get(), d_inp.get(), d_wte.get(), d_wpe.get(), d_cu.get(), pieces, N, C, stream,
                      device_offset);
  check.near("encoder_forward out (" + tag + ")", d_out.download(), out_cpu, kRowTol);

  const auto dout = random_floats(out_cpu.size());
  auto dwte = random_floats(wte.size()), dwpe = random_floats(wpe.size());  // accumulate onto these
  DeviceBuffer<float> d_dout(dout), d_dwte(dwte), d_dwpe(dwpe);
  km::encoder_backward(dwte.data(), dwpe.data(), dout.data(), inp.data(), cu.data(), pieces, C, host_offset);
  kc::encoder_backward(d_dwte.get(), d_dwpe.get(), d_dout.get(), d_inp.get(), d_cu.get(), pieces, N, maxT, C, stream,
                       device_offset);
  check.near("encoder_backward dwte (" + tag + ")", d_dwte.download(), dwte, kRowTol);
  check.near("encoder_backward dwpe (" + tag + ")", d_dwpe.download(), dwpe, kRowTol);
}

// A later part of a cut piece (L queries, s prefix keys) against the CPU's attention with an
// AttentionPrefix: out, the accumulated dqkv and the prefix's dK/dV.
void test_prefix_attention(Checker& check, kc::Gemm& gemm, int C, int NH, int s, int L, double tol) {
  const std::string tag = std::string(gemm.math() == kc::GemmMath::bf16 ? "[bf16] " : "") + "prefix attention s" +
                          std::to_string(s) + " L" + std::to_string(L) + " C" + std::to_string(C) + " NH" +
                          std::to_string(NH) + " ";
  const std::vector<int32_t> cu = {0, L}, offset = {s};
  const auto qkv = random_floats(static_cast<size_t>(L) * 3 * C, 2.0f);
  const auto prefix = random_floats(static_cast<size_t>(s) * 2 * C, 2.0f);
  const auto dout = random_floats(static_cast<size_t>(L) * C);
  auto dqkv = random_floats(qkv.size()), dprefix = random_floats(prefix.size());  // accumulate onto these
  DeviceBuffer<float> d_qkv(qkv), d_prefix(prefix), d_dout(dout), d_dqkv(dqkv), d_dprefix(dprefix);
  const float* kv[1] = {prefix.data()};
  float* dkv[1] = {dprefix.data()};
  km::AttentionPrefix with;
  with.offset = offset.data();
  with.kv = kv;
  with.dkv = dkv;
  std::vector<float> out(static_cast<size_t>(L) * C), att(km::attention_saved_floats(cu.data(), 1, NH, offset.data()));
  km::attention_forward(out.data(), att.data(), qkv.data(), cu.data(), 1, C, NH, false, with);
  km::attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), cu.data(), 1, C, NH, false, with);
  DeviceBuffer<float> d_out(out.size()), d_att(att.size()), workspace(kc::attention_prefix_workspace_floats(s, L, C, NH));
  kc::attention_prefix_forward(gemm, d_out.get(), d_att.get(), d_qkv.get(), d_prefix.get(), s, L, C, NH,
                               workspace.get());
  check.near(tag + "forward out", d_out.download(), out, tol);
  kc::attention_prefix_backward(gemm, d_dqkv.get(), d_dprefix.get(), d_dout.get(), d_qkv.get(), d_prefix.get(),
                                d_att.get(), s, L, C, NH, workspace.get());
  check.near(tag + "backward dqkv (accumulated)", d_dqkv.download(), dqkv, tol);
  check.near(tag + "backward prefix dK/dV (accumulated)", d_dprefix.download(), dprefix, tol);
}

void test_layernorm(Checker& check, cudaStream_t stream) {
  const int N = 150, C = 67;
  const auto inp = random_floats(static_cast<size_t>(N) * C, 2.0f);
  const auto weight = random_floats(C), bias = random_floats(C);
  std::vector<float> out(N * C), mean(N), rstd(N);
  km::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, C);
  DeviceBuffer<float> d_inp(inp), d_w(weight), d_b(bias), d_out(out.size()), d_mean(N), d_rstd(N);
  kc::layernorm_forward(d_out.get(), d_mean.get(), d_rstd.get(), d_inp.get(), d_w.get(), d_b.get(), N, C, stream);
  check.near("layernorm_forward out", d_out.download(), out, kRowTol);
  check.near("layernorm_forward mean", d_mean.download(), mean, kRowTol);
  check.near("layernorm_forward rstd", d_rstd.download(), rstd, kRowTol);

  const auto dout = random_floats(out.size());
  auto dinp = random_floats(inp.size()), dw = random_floats(C), db = random_floats(C);
  DeviceBuffer<float> d_dout(dout), d_dinp(dinp), d_dw(dw), d_db(db);
  DeviceBuffer<float> scratch(2 * kc::column_sum_scratch_floats(C));
  km::layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), weight.data(), mean.data(),
                         rstd.data(), N, C);
  kc::layernorm_backward(d_dinp.get(), d_dw.get(), d_db.get(), d_dout.get(), d_inp.get(), d_w.get(), d_mean.get(),
                         d_rstd.get(), N, C, scratch.get(), stream);
  check.near("layernorm_backward dinp", d_dinp.download(), dinp, kRowTol);
  check.near("layernorm_backward dweight", d_dw.download(), dw, kRowTol);
  check.near("layernorm_backward dbias", d_db.download(), db, kRowTol);
}

void test_matmul(Checker& check, kc::Gemm& gemm, int N, int C, int OC, double tol) {
  const std::string tag = std::string(gemm.math() == kc::GemmMath::bf16 ? "[bf16] " : "") + "matmul " +
                          std::to_string(N) + "x" + std::to_string(C) + "x" + std::to_string(OC) + " ";
  const auto inp = random_floats(static_cast<size_t>(N) * C), weight = random_floats(static_cast<size_t>(OC) * C);
  const auto bias = random_floats(OC), residual = random_floats(static_cast<size_t>(N) * OC);
  std::vector<float> out(static_cast<size_t>(N) * OC), out_res(out.size());
  km::matmul_forward(out.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
  km::matmul_forward_residual(out_res.data(), residual.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
  DeviceBuffer<float> d_inp(inp), d_w(weight), d_b(bias), d_res(residual), d_out(out.size()), d_out_res(out.size());
  kc::matmul_forward(gemm, d_out.get(), d_inp.get(), d_w.get(), d_b.get(), N, C, OC);
  kc::matmul_forward_residual(gemm, d_out_res.get(), d_inp.get(), d_w.get(), d_b.get(), d_res.get(), N, C, OC);
  check.near(tag + "forward", d_out.download(), out, tol);
  check.near(tag + "forward_residual", d_out_res.download(), out_res, tol);

  const auto dout = random_floats(out.size());
  auto dinp = random_floats(inp.size()), dw = random_floats(weight.size()), db = random_floats(OC);
  DeviceBuffer<float> d_dout(dout), d_dinp(dinp), d_dw(dw), d_db(db), scratch(kc::column_sum_scratch_floats(OC));
  km::matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), weight.data(), N, C, OC);
  kc::matmul_backward(gemm, d_dinp.get(), d_dw.get(), d_db.get(), d_dout.get(), d_inp.get(), d_w.get(), N, C, OC,
                      scratch.get());
  check.near(tag + "backward dinp", d_dinp.download(), dinp, tol);
  check.near(tag + "backward dweight", d_dw.download(), dw, tol);
  check.near(tag + "backward dbias", d_db.download(), db, kRowTol);
}

void test_attention(Checker& check, kc::Gemm& gemm, int B, int T, int C, int NH, double tol) {
  const std::string tag = std::string(gemm.math() == kc::GemmMath::bf16 ? "[bf16] " : "") + "attention B" +
                          std::to_string(B) + " T" + std::to_string(T) + " C" + std::to_string(C) + " NH" +
                          std::to_string(NH) + " ";
  const std::vector<int32_t> lengths = random_lengths(B, T);
  const std::vector<int32_t> cu = offsets_of(lengths);
  const int N = cu.back();
  const auto qkv = random_floats(static_cast<size_t>(B) * T * 3 * C, 2.0f);
  // CPU twin on the packed real rows; padded output rows are 0 on the device.
  const std::vector<float> packed_qkv = pack_rows(qkv, lengths, T, 3 * C);
  std::vector<float> packed_out(static_cast<size_t>(N) * C), att(km::attention_saved_floats(cu.data(), B, NH));
  km::attention_forward(packed_out.data(), att.data(), packed_qkv.data(), cu.data(), B, C, NH);
  std::vector<float> out(static_cast<size_t>(B) * T * C, 0.0f);
  unpack_rows(out, packed_out, lengths, T, C);
  DeviceBuffer<float> d_qkv(qkv), d_out(out.size()), d_att(static_cast<size_t>(B) * NH * T * T);
  DeviceBuffer<float> workspace(kc::attention_workspace_floats(B, T, C, NH));
  DeviceBuffer<int32_t> d_lengths(lengths);
  kc::attention_forward(gemm, d_out.get(), d_att.get(), d_qkv.get(), d_lengths.get(), B, T, C, NH, workspace.get());
  check.near(tag + "forward out", d_out.download(), out, tol);
  // Only the causal, in-length part of att is defined; the CPU keeps piece b's heads as
  // (len,len) matrices one after the other.
  std::vector<float> att_gpu = d_att.download(), att_cpu_defined, att_gpu_defined;
  size_t piece_offset = 0;
  for (int b = 0; b < B; ++b) {
    const size_t L = lengths[b];
    for (int h = 0; h < NH; ++h)
      for (size_t t = 0; t < L; ++t)
        for (size_t s = 0; s <= t; ++s) {
          att_cpu_defined.push_back(att[piece_offset + h * L * L + t * L + s]);
          att_gpu_defined.push_back(att_gpu[((static_cast<size_t>(b) * NH + h) * T + t) * T + s]);
        }
    piece_offset += NH * L * L;
  }
  check.near(tag + "forward att", att_gpu_defined, att_cpu_defined, tol);

  const auto dout = random_floats(out.size());
  auto dqkv = random_floats(qkv.size());  // accumulated onto; padded rows stay as they are
  DeviceBuffer<float> d_dout(dout), d_dqkv(dqkv);
  std::vector<float> packed_dqkv = pack_rows(dqkv, lengths, T, 3 * C);
  km::attention_backward(packed_dqkv.data(), pack_rows(dout, lengths, T, C).data(), packed_qkv.data(), att.data(),
                         cu.data(), B, C, NH);
  unpack_rows(dqkv, packed_dqkv, lengths, T, 3 * C);
  kc::attention_backward(gemm, d_dqkv.get(), d_dout.get(), d_qkv.get(), d_att.get(), d_lengths.get(), B, T, C, NH,
                         workspace.get());
  check.near(tag + "backward dqkv", d_dqkv.download(), dqkv, tol);
}

// The CUDA backend's packed attention path: the pieces of a packed batch gathered into padded
// groups (model::AttentionGroups), each group through the cuBLASLt engine, scattered back;
// against the CPU's packed attention. Pieces of many lengths (1 among them) make several groups.
void test_packed_attention(Checker& check, kc::Gemm& gemm, int C, int NH, int context, double tol) {
  const std::string tag = "packed attention (gather, groups, scatter) C" + std::to_string(C) + " NH" +
                          std::to_string(NH) + " ";
  std::vector<int32_t> lengths = {static_cast<int32_t>(context), 1};
  for (int i = 0; i < 14; ++i) lengths.push_back(random_int(1, context));
  const std::vector<int32_t> cu = offsets_of(lengths);
  const int N = cu.back(), pieces = static_cast<int>(lengths.size());
  const auto qkv = random_floats(static_cast<size_t>(N) * 3 * C, 2.0f);
  const auto dout = random_floats(static_cast<size_t>(N) * C);
  std::vector<float> out(static_cast<size_t>(N) * C), att(km::attention_saved_floats(cu.data(), pieces, NH));
  std::vector<float> dqkv(qkv.size(), 0.0f);
  km::attention_forward(out.data(), att.data(), qkv.data(), cu.data(), pieces, C, NH);
  km::attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), cu.data(), pieces, C, NH);

  km::AttentionGroups groups;
  groups.build(cu.data(), pieces, context);
  check.expect(tag + "several groups", groups.groups.size() > 2, std::to_string(groups.groups.size()) + " groups");
  const size_t P = groups.padded_rows();
  size_t saved = 0, workspace_floats = 0;
  std::vector<size_t> saved_offset;
  for (const km::AttentionGroup& g : groups.groups) {
    saved_offset.push_back(saved);
    saved += static_cast<size_t>(g.B) * NH * g.T * g.T;
    workspace_floats = std::max(workspace_floats, kc::attention_workspace_floats(g.B, g.T, C, NH));
  }
  DeviceBuffer<float> d_qkv(qkv), d_dout(dout), d_out(out.size()), d_dqkv(qkv.size()), d_att(saved);
  DeviceBuffer<float> d_pqkv(P * 3 * C), d_pio(P * C), d_pdqkv(P * 3 * C), workspace(workspace_floats);
  DeviceBuffer<int32_t> d_token(groups.padded_token), d_lengths(groups.lengths);
  cudaStream_t stream = gemm.stream();
  kc::gather_padded_rows(d_pqkv.get(), d_qkv.get(), d_token.get(), P, 3 * C, stream);
  for (size_t g = 0; g < groups.groups.size(); ++g) {
    const km::AttentionGroup& group = groups.groups[g];
    kc::attention_forward(gemm, d_pio.get() + group.first_row * C, d_att.get() + saved_offset[g],
                          d_pqkv.get() + group.first_row * 3 * C, d_lengths.get() + group.first_length, group.B,
                          group.T, C, NH, workspace.get());
  }
  kc::scatter_padded_rows(d_out.get(), d_pio.get(), d_token.get(), P, C, false, stream);
  check.near(tag + "forward out", d_out.download(), out, tol);
  kc::gather_padded_rows(d_pio.get(), d_dout.get(), d_token.get(), P, C, stream);
  for (size_t g = 0; g < groups.groups.size(); ++g) {
    const km::AttentionGroup& group = groups.groups[g];
    kc::attention_backward(gemm, d_pdqkv.get() + group.first_row * 3 * C, d_pio.get() + group.first_row * C,
                           d_pqkv.get() + group.first_row * 3 * C, d_att.get() + saved_offset[g],
                           d_lengths.get() + group.first_length, group.B, group.T, C, NH, workspace.get(), false);
  }
  kc::scatter_padded_rows(d_dqkv.get(), d_pdqkv.get(), d_token.get(), P, 3 * C, false, stream);
  check.near(tag + "backward dqkv", d_dqkv.download(), dqkv, tol);
}

#ifdef KILTER_WITH_CUDNN
// The cuDNN engine against the same CPU twin: out and dqkv (it keeps cuDNN's reserve space, not
// att). fp32 uses FMA math (tolerance 1e-4); bf16 mode allows TF32 products (3e-2). Padded rows
// must be exactly 0 in out and leave dqkv exactly as it was (cuDNN does not promise to write
// them; the head merges do). Returns false when cuDNN is not usable here.
bool test_attention_cudnn(Checker& check, cudaStream_t stream, kc::GemmMath math, int B, int T, int C, int NH) {
  std::unique_ptr<kc::CudnnAttention> engine;
  try {
    engine = std::make_unique<kc::CudnnAttention>(stream, math, C, NH);
  } catch (const kilter::Error& e) {
    std::printf("NOTE: cuDNN attention not usable here: %s\n", e.what());
    return false;
  }
  std::string why;
  const bool supported = engine->supports(B, T, &why);
  const std::string tag = std::string(math == kc::GemmMath::bf16 ? "[bf16] " : "") + "cuDNN attention B" +
                          std::to_string(B) + " T" + std::to_string(T) + " C" + std::to_string(C) + " NH" +
                          std::to_string(NH) + " ";
  check.expect(tag + "shape supported", supported, why);
  if (!supported) return true;
  const std::string description = engine->description();
  std::printf("  %s\n", description.c_str());
  const double tol = math == kc::GemmMath::bf16 ? kBf16Tol : kGemmTol;
  const std::vector<int32_t> lengths = random_lengths(B, T);
  const std::vector<int32_t> cu = offsets_of(lengths);
  const auto qkv = random_floats(static_cast<size_t>(B) * T * 3 * C, 2.0f);
  const std::vector<float> packed_qkv = pack_rows(qkv, lengths, T, 3 * C);
  std::vector<float> packed_out(static_cast<size_t>(cu.back()) * C), att(km::attention_saved_floats(cu.data(), B, NH));
  km::attention_forward(packed_out.data(), att.data(), packed_qkv.data(), cu.data(), B, C, NH);
  std::vector<float> out(static_cast<size_t>(B) * T * C, 0.0f);
  unpack_rows(out, packed_out, lengths, T, C);
  DeviceBuffer<float> d_qkv(qkv), d_out(out.size()), reserve(engine->reserve_floats(B, T));
  DeviceBuffer<float> workspace(engine->workspace_floats(B, T));
  DeviceBuffer<int32_t> d_lengths(lengths);
  engine->forward(d_out.get(), reserve.get(), d_qkv.get(), lengths.data(), d_lengths.get(), B, T, workspace.get());
  const std::vector<float> out_gpu = d_out.download();
  check.near(tag + "forward out", out_gpu, out, tol);
  bool padded_zero = true;
  for (int b = 0; b < B; ++b)
    for (size_t i = static_cast<size_t>(b * T + lengths[b]) * C; i < static_cast<size_t>(b + 1) * T * C; ++i)
      padded_zero = padded_zero && out_gpu[i] == 0.0f;
  check.expect(tag + "forward padded rows exactly 0", padded_zero);

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
  check.near(tag + "backward dqkv (accumulated)", dqkv_gpu, dqkv, tol);
  bool padded_untouched = true;
  for (int b = 0; b < B; ++b)
    for (size_t i = static_cast<size_t>(b * T + lengths[b]) * 3 * C; i < static_cast<size_t>(b + 1) * T * 3 * C; ++i)
      padded_untouched = padded_untouched && dqkv_gpu[i] == dqkv_before[i];
  check.expect(tag + "backward padded rows of dqkv untouched", padded_untouched);
  return true;
}
#endif

void test_gelu(Checker& check, cudaStream_t stream) {
  const size_t N = 10007;
  const auto inp = random_floats(N, 4.0f);
  std::vector<float> out(N);
  km::gelu_forward(out.data(), inp.data(), N);
  DeviceBuffer<float> d_inp(inp), d_out(N);
  kc::gelu_forward(d_out.get(), d_inp.get(), N, stream);
  check.near("gelu_forward", d_out.download(), out, kRowTol);
  const auto dout = random_floats(N);
  auto dinp = random_floats(N);
  DeviceBuffer<float> d_dout(dout), d_dinp(dinp);
  km::gelu_backward(dinp.data(), inp.data(), dout.data(), N);
  kc::gelu_backward(d_dinp.get(), d_inp.get(), d_dout.get(), N, stream);
  check.near("gelu_backward", d_dinp.download(), dinp, kRowTol);
}

void test_crossentropy(Checker& check, cudaStream_t stream) {
  const int N = 37, V = 1031;
  const auto logits = random_floats(static_cast<size_t>(N) * V, 5.0f);
  std::vector<int32_t> targets(N);
  for (int i = 0; i < N; ++i) targets[i] = i % 5 == 4 ? -1 : random_int(0, V - 1);
  const float scale = 1.0f / 29.0f;
  auto dlogits = random_floats(logits.size());
  DeviceBuffer<float> d_logits(logits), d_dlogits(dlogits);
  DeviceBuffer<int32_t> d_targets(targets);
  const double loss_cpu = km::crossentropy_forward_backward(dlogits.data(), logits.data(), targets.data(), N, V, scale);
  const double loss_gpu =
      kc::crossentropy_forward_backward(d_dlogits.get(), d_logits.get(), d_targets.get(), N, V, scale, stream);
  check.near_scalar("crossentropy loss", loss_gpu, loss_cpu, kRowTol);
  check.near("crossentropy dlogits (accumulate)", d_dlogits.download(), dlogits, kRowTol);
  // In-place overwrite, the form the model uses, against the CPU's in-place twin.
  std::vector<float> inplace = logits;
  const double loss_inplace = km::crossentropy_forward_backward_inplace(inplace.data(), targets.data(), N, V, scale);
  DeviceBuffer<double> d_loss(std::vector<double>{0.0});
  kc::crossentropy_forward_backward_async(d_logits.get(), d_logits.get(), d_targets.get(), N, V, scale, d_loss.get(),
                                          false, stream);
  // Rows without a target are zeroed on the GPU; the CPU's in-place form leaves them alone.
  std::vector<float> gpu_inplace = d_logits.download();
  for (int i = 0; i < N; ++i)
    if (targets[i] < 0) std::fill(inplace.begin() + static_cast<size_t>(i) * V, inplace.begin() + static_cast<size_t>(i + 1) * V, 0.0f);
  check.near_scalar("crossentropy in-place loss", d_loss.download()[0], loss_inplace, kRowTol);
  check.near("crossentropy in-place dlogits", gpu_inplace, inplace, kRowTol);
}

void test_adamw_and_norm(Checker& check, cudaStream_t stream) {
  const size_t n = 100003;
  auto params = random_floats(n), m = random_floats(n, 0.01f), v = random_floats(n, 0.01f);
  for (float& x : v) x = std::fabs(x);
  const auto grads = random_floats(n);
  DeviceBuffer<float> d_p(params), d_g(grads), d_m(m), d_v(v);
  kilter::optim::adamw_update(params.data(), grads.data(), m.data(), v.data(), n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, 3);
  kc::adamw_update(d_p.get(), d_g.get(), d_m.get(), d_v.get(), n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, 3, stream);
  check.near("adamw params", d_p.download(), params, kRowTol);
  check.near("adamw m", d_m.download(), m, kRowTol);
  check.near("adamw v", d_v.download(), v, kRowTol);

  double expected = 0.0;
  for (float g : grads) expected += static_cast<double>(g) * g;
  DeviceBuffer<double> result(1), scratch(kc::sum_of_squares_scratch_doubles());
  kc::sum_of_squares_async(result.get(), d_g.get(), n, scratch.get(), stream);
  check.near_scalar("sum_of_squares (global norm)", result.download()[0], expected, 1e-12);
}

}  // namespace

int main() {
  kilter::gputest::skip_without_device();
  try {
    kilter::backend::cuda_device_index();
    cudaStream_t stream = kilter::backend::cuda_compute_stream();
    Checker check;
    kc::Gemm gemm(stream, kc::GemmMath::fp32);
    kc::Gemm gemm_bf16(stream, kc::GemmMath::bf16);
    test_encoder(check, stream, {13, 1, 7, 13, 4}, {}, 13, "packed");  // one piece of length 1
    test_layernorm(check, stream);
    test_matmul(check, gemm, 45, 37, 29, kGemmTol);       // odd: unaligned operands
    test_matmul(check, gemm, 256, 128, 384, kGemmTol);    // aligned: tensor-core friendly shapes
    test_matmul(check, gemm_bf16, 256, 128, 384, kBf16Tol);
    test_attention(check, gemm, 3, 17, 24, 4, kGemmTol);  // head_dim 6, ragged rows
    test_attention(check, gemm, 2, 64, 128, 2, kGemmTol);
    test_attention(check, gemm_bf16, 2, 64, 128, 2, kBf16Tol);
    test_packed_attention(check, gemm, 24, 4, 70, kGemmTol);  // head_dim 6
    test_encoder(check, stream, {13, 1, 7, 9}, {0, 30, 5, 31}, 40, "offsets");
    test_prefix_attention(check, gemm, 24, 4, 37, 70, kGemmTol);  // head_dim 6, two 64-row blocks on the CPU
    test_prefix_attention(check, gemm, 128, 2, 1, 5, kGemmTol);
    test_prefix_attention(check, gemm_bf16, 128, 2, 200, 64, kBf16Tol);
#ifdef KILTER_WITH_CUDNN
    try {
      if (test_attention_cudnn(check, stream, kc::GemmMath::fp32, 3, 17, 24, 4)) {  // head_dim 6, ragged rows
        test_attention_cudnn(check, stream, kc::GemmMath::fp32, 2, 64, 128, 2);
        test_attention_cudnn(check, stream, kc::GemmMath::fp32, 2, 256, 128, 2);
        test_attention_cudnn(check, stream, kc::GemmMath::bf16, 2, 64, 128, 2);
      }
    } catch (const kilter::Error& e) {  // one failed check; the other kernels still get tested
      check.expect("cuDNN attention ran", false, e.what());
    }
#else
    std::printf("NOTE: built without cuDNN: the cuDNN attention engine is not tested\n");
#endif
    test_gelu(check, stream);
    test_crossentropy(check, stream);
    test_adamw_and_norm(check, stream);
    return check.finish("kilter_gpu_ops_test");
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
}
