// The cuDNN SDPA engine (lib/model/attention_sdpa.h) on a device against the CPU packed attention
// (lib/model/attention.cpp), its twin: the inputs are rounded to bf16 on the host first, so both
// sides see the same q, k, v and dout, and the CPU computes in fp32. Tolerances, as max |gpu - cpu|
// / max |cpu|: 2e-2 for the output (bf16 output and bf16 probabilities in P.V) and 3e-2 for the
// gradients (bf16 dQ/dK/dV and dP). Cases: whole pieces (GPT-2's 12 heads of 64, a piece of one
// token, one of the full context), later parts of cut pieces with their prefixes (bottom-right,
// staged K/V; a prefix of one token, a part of one token), grouped-query heads (8 over 2, 32 over
// 8 at head_dim 64, and head_dim 128), buckets wider than the batch. The backward runs cuDNN's
// deterministic algorithm: a second forward + backward must give the same bits. Calls split within
// the score budget the model plans with; the bf16-storage datapath's staging (bf16 rows in and
// out) against the fp32 datapath's, bit for bit. The graphs' building time is printed (the
// engine's build_stats).
// GoogleTest; without a CUDA device every test is skipped and the binary exits 77.
// usage: kilter_gpu_sdpa_test [--case TEXT]: only the cases whose name holds TEXT (the device check
// reruns a refused case alone with cuDNN's logging on; a case cuDNN refuses prints
// "  cuDNN refused case: <name>").
#include <cstring>
#include <string>
#include <vector>

#include "lib/model/attention.h"
#include "lib/model/attention_sdpa.h"
#include "lib/model/gemm.h"
#include "lib/model/sdpa_plan.h"
#include "tests/gpu/gpu_test_util.h"

using kilter::gputest::Checker;
using kilter::gputest::DeviceBuffer;
namespace km = kilter::model;
namespace kc = kilter::model::cuda;

namespace {

std::vector<float> bf16_rounded(std::vector<float> v) {
  for (float& x : v) {
    km::bf16 b;
    km::to_bf16(&b, &x, 1);
    x = km::bf16_to_float(b);
  }
  return v;
}

struct Case {
  std::string name;
  km::AttentionShape shape;
  std::vector<int> lengths, offsets;
  int context = 0;  // > 0: plan within sdpa_score_budget(tokens, context) (calls split as the model plans them)
};

// The CPU twin on the packed batch.
struct Reference {
  std::vector<float> out, dqkv;
  std::vector<std::vector<float>> prefix_dkv;
};

Reference cpu_reference(const Case& c, const std::vector<int32_t>& cu, const std::vector<float>& qkv,
                        const std::vector<float>& dout, const std::vector<std::vector<float>>& prefix_kv) {
  Reference r;
  const int pieces = static_cast<int>(c.lengths.size()), N = cu.back();
  r.out.assign(static_cast<size_t>(N) * c.shape.q_width(), 0.0f);
  r.dqkv.assign(static_cast<size_t>(N) * c.shape.row_width(), 0.0f);
  std::vector<const float*> kv;
  std::vector<float*> dkv;
  for (int p = 0; p < pieces; ++p) r.prefix_dkv.emplace_back(prefix_kv[p].size(), 0.0f);
  for (int p = 0; p < pieces; ++p) kv.push_back(prefix_kv[p].data()), dkv.push_back(r.prefix_dkv[p].data());
  const km::AttentionPrefix prefix{c.offsets.data(), kv.data(), dkv.data()};
  std::vector<float> att(km::attention_saved_floats(cu.data(), pieces, c.shape.n_head, c.offsets.data()));
  km::attention_forward(r.out.data(), att.data(), qkv.data(), cu.data(), pieces, c.shape, false, prefix);
  km::attention_backward(r.dqkv.data(), dout.data(), qkv.data(), att.data(), cu.data(), pieces, c.shape, false, prefix);
  return r;
}

// One forward + backward of both calls on the device; returns out, dqkv and the prefixes' dK/dV
// (fp32), and the raw bf16 bits of out and dqkv for the determinism check.
struct DeviceResult {
  std::vector<float> out, dqkv;
  std::vector<std::vector<float>> prefix_dkv;
  std::vector<uint16_t> out_bits, dqkv_bits;
  // The bf16-storage datapath's staging (from bf16 qkv rows, own dK/dV back into bf16 dqkv rows)
  // against the fp32 datapath's: the same bits.
  bool bf16_staging_same = true;
};

std::vector<uint16_t> bits_of(const std::vector<kc::bf16>& v) {
  std::vector<uint16_t> b(v.size());
  std::memcpy(b.data(), v.data(), sizeof(uint16_t) * v.size());
  return b;
}

DeviceResult run_sdpa(kc::SdpaAttention& engine, const km::SdpaPlan& plan, const std::vector<float>& qkv_host,
                      const std::vector<float>& dout_host, const std::vector<std::vector<float>>& prefix_kv) {
  const km::AttentionShape& shape = plan.shape;
  const int N = plan.tokens, pieces = static_cast<int>(prefix_kv.size());
  cudaStream_t stream = kilter::backend::cuda_compute_stream();
  // What SDPA reads has kSdpaTailRows rows of zeroed slack past its last row, as in the model (a
  // tile past the last sequence reads zeros; initcheck in device-check.sh sees any other read).
  const size_t tail = km::kSdpaTailRows;
  DeviceBuffer<float> qkv(qkv_host), dout(dout_host), dqkv32(qkv_host.size());
  DeviceBuffer<kc::bf16> qkv16(qkv_host.size() + tail * shape.row_width()),
      out16(dout_host.size() + tail * shape.q_width()), dout16(dout_host.size() + tail * shape.q_width()),
      dqkv16(qkv_host.size());
  const size_t staged_elems = std::max<size_t>(1, static_cast<size_t>(plan.staged_rows) * shape.kv_width());
  DeviceBuffer<kc::bf16> staged(staged_elems + tail * shape.kv_width()), staged_grad(staged_elems + tail * shape.kv_width());
  DeviceBuffer<float> stats((static_cast<size_t>(N) + tail) * shape.n_head), out32(dout_host.size());
  std::vector<std::unique_ptr<DeviceBuffer<float>>> prefix_rows, prefix_grads;
  std::vector<const float*> kv(pieces, nullptr);
  std::vector<float*> dkv(pieces, nullptr);
  for (int p = 0; p < pieces; ++p) {
    prefix_rows.push_back(std::make_unique<DeviceBuffer<float>>(prefix_kv[p]));
    prefix_grads.push_back(std::make_unique<DeviceBuffer<float>>(prefix_kv[p].size()));
    kv[p] = prefix_rows[p]->get();
    dkv[p] = prefix_grads[p]->get();
  }
  const km::AttentionPrefix prefix{nullptr, kv.data(), dkv.data()};
  std::vector<size_t> offsets;
  DeviceBuffer<int32_t> descriptors(plan.descriptor_blocks(&offsets));
  const std::vector<const km::SdpaCall*> calls = plan.calls();
  size_t workspace_bytes = 1;
  for (const km::SdpaCall* call : calls) workspace_bytes = std::max(workspace_bytes, engine.workspace_bytes(*call));
  DeviceBuffer<uint8_t> workspace(workspace_bytes);

  kc::rows_to_bf16(qkv16.get(), shape.row_width(), qkv.get(), shape.row_width(), N, shape.row_width(), stream);
  kc::rows_to_bf16(dout16.get(), shape.q_width(), dout.get(), shape.q_width(), N, shape.q_width(), stream);
  kc::sdpa_stage_keys(plan, prefix, qkv.get(), staged.get(), stream);
  for (size_t i = 0; i < calls.size(); ++i)
    engine.forward(*calls[i], descriptors.get() + offsets[i], qkv16.get(),
                   calls[i]->keys == km::SdpaKeyRows::staged ? staged.get() : qkv16.get(), out16.get(), stats.get(),
                   workspace.get(), stream);
  for (size_t i = 0; i < calls.size(); ++i) {
    const bool later = calls[i]->keys == km::SdpaKeyRows::staged;
    engine.backward(*calls[i], descriptors.get() + offsets[i], qkv16.get(), later ? staged.get() : qkv16.get(),
                    out16.get(), dout16.get(), stats.get(), dqkv16.get(), later ? staged_grad.get() : dqkv16.get(),
                    workspace.get(), stream);
  }
  kc::rows_to_fp32(out32.get(), shape.q_width(), out16.get(), shape.q_width(), N, shape.q_width(), false, stream);
  kc::rows_to_fp32(dqkv32.get(), shape.row_width(), dqkv16.get(), shape.row_width(), N, shape.row_width(), false,
                   stream);
  // The bf16 datapath's variants: staging from the bf16 rows, and the own rows' dK/dV into a copy
  // of the bf16 dqkv (before the fp32 unstaging below adds the prefixes' gradients).
  DeviceBuffer<kc::bf16> staged_from_bf16(staged_elems + tail * shape.kv_width()), dqkv16_own(qkv_host.size());
  kc::sdpa_stage_keys(plan, prefix, qkv16.get(), staged_from_bf16.get(), stream);
  KILTER_CUDA_CHECK(cudaMemcpyAsync(dqkv16_own.get(), dqkv16.get(), sizeof(kc::bf16) * qkv_host.size(),
                                    cudaMemcpyDeviceToDevice, stream));
  kc::sdpa_unstage_key_grads(plan, prefix, staged_grad.get(), dqkv16_own.get(), stream, kc::SdpaUnstage::own_rows);
  kc::sdpa_unstage_key_grads(plan, prefix, staged_grad.get(), dqkv32.get(), stream);
  KILTER_CUDA_CHECK(cudaStreamSynchronize(stream));

  DeviceResult r;
  r.out = out32.download();
  r.dqkv = dqkv32.download();
  for (auto& g : prefix_grads) r.prefix_dkv.push_back(g->download());
  r.out_bits = bits_of(out16.download());
  r.dqkv_bits = bits_of(dqkv16.download());
  r.bf16_staging_same = bits_of(staged_from_bf16.download()) == bits_of(staged.download());
  const std::vector<kc::bf16> own = dqkv16_own.download();
  for (size_t i = 0; i < own.size(); ++i) r.bf16_staging_same = r.bf16_staging_same && km::bf16_to_float(own[i]) == r.dqkv[i];
  return r;
}

void run_case(Checker& check, kc::SdpaAttention& engine, const Case& c) {
  std::printf("%s\n", c.name.c_str());
  std::vector<int32_t> cu{0};
  for (int len : c.lengths) cu.push_back(cu.back() + len);
  const int N = cu.back(), pieces = static_cast<int>(c.lengths.size());
  const std::vector<float> qkv = bf16_rounded(kilter::gputest::random_floats(static_cast<size_t>(N) * c.shape.row_width(), 2.0f));
  const std::vector<float> dout = bf16_rounded(kilter::gputest::random_floats(static_cast<size_t>(N) * c.shape.q_width()));
  std::vector<std::vector<float>> prefix_kv;
  for (int p = 0; p < pieces; ++p)
    prefix_kv.push_back(bf16_rounded(kilter::gputest::random_floats(static_cast<size_t>(c.offsets[p]) * c.shape.kv_width(), 2.0f)));
  km::SdpaPlan plan;
  km::plan_sdpa(plan, cu.data(), pieces, c.offsets.data(), c.shape,
                c.context > 0 ? km::sdpa_score_budget(N, c.context) : 0);
  std::printf("  %zu whole call(s), %zu later call(s)\n", plan.whole.size(), plan.later.size());
  for (const km::SdpaCall* call : plan.calls()) {
    std::string why;
    if (!check.expect("graphs build for " + call->bucket.text(), engine.prepare(*call, &why), why)) {
      std::printf("  cuDNN refused case: %s\n", c.name.c_str());
      return;
    }
  }
  const Reference want = cpu_reference(c, cu, qkv, dout, prefix_kv);
  const DeviceResult got = run_sdpa(engine, plan, qkv, dout, prefix_kv);
  check.near(c.name + ": out", got.out, want.out, 2e-2);
  check.near(c.name + ": dqkv", got.dqkv, want.dqkv, 3e-2);
  for (int p = 0; p < pieces; ++p)
    if (c.offsets[p] > 0) check.near(c.name + ": prefix dK/dV of piece " + std::to_string(p), got.prefix_dkv[p], want.prefix_dkv[p], 3e-2);
  const DeviceResult again = run_sdpa(engine, plan, qkv, dout, prefix_kv);
  check.expect(c.name + ": rerun gives the same bits (out, dqkv, prefix dK/dV)",
               again.out_bits == got.out_bits && again.dqkv_bits == got.dqkv_bits && again.prefix_dkv == got.prefix_dkv);
  check.expect(c.name + ": staging from bf16 rows and own dK/dV into bf16 rows as from fp32 ones", got.bf16_staging_same);
}

using SdpaEngine = kilter::gputest::DeviceTest;

}  // namespace

TEST_F(SdpaEngine, AgainstTheCpuTwinOnEveryCase) {
  const std::string only = kilter::gputest::test_option("--case");
  Checker check;
  const std::vector<Case> cases = {
      {"whole pieces, 12 heads of 64", km::AttentionShape::mha(768, 12), {1024, 300, 1, 77, 512}, {0, 0, 0, 0, 0}},
      {"whole pieces and later parts, 4 heads of 64", km::AttentionShape::mha(256, 4), {100, 64, 1, 300, 17, 200},
       {0, 200, 5, 0, 1, 823}},
      {"grouped-query 8 over 2, cut", {8, 2, 64}, {33, 130, 9}, {0, 70, 0}},
      {"grouped-query 32 over 8 (Llama 3.2 1B)", {32, 8, 64}, {256, 40}, {0, 0}},
      {"head_dim 128, 4 over 1, cut", {4, 1, 128}, {60, 60}, {0, 60}},
      // The model's score budget (sdpa_plan.h): one long piece among short ones runs as several
      // calls; later parts of several (Sq, Skv) buckets likewise.
      {"calls split within the score budget, 12 heads of 64", km::AttentionShape::mha(768, 12),
       {1000, 1, 17, 40, 63, 5, 900, 2, 30}, {0, 0, 0, 0, 0, 0, 0, 0, 0}, 1024},
      {"later parts split within the score budget, 8 over 2", {8, 2, 64}, {9, 30, 1, 12, 70, 4, 20, 7},
       {0, 37, 100, 0, 1, 100, 3, 0}, 64},
  };
  int ran = 0;
  for (const Case& c : cases) {
    if (c.name.find(only) == std::string::npos) continue;
    ++ran;
    try {
      kc::SdpaAttention engine(c.shape);
      run_case(check, engine, c);
      const kc::SdpaBuildStats stats = engine.build_stats();
      std::printf("  %s; %d graphs built in %.2f s\n", engine.description().c_str(), stats.graphs, stats.seconds);
    } catch (const kilter::Error& e) {
      check.expect(c.name + ": SDPA engine usable", false, e.what());
      std::printf("  cuDNN refused case: %s\n", c.name.c_str());
    }
  }
  check.expect("at least one case matches --case " + only, ran > 0);
}
