// cuDNN SDPA on its own for the engine probe of cut pieces (probed_engines.h, "sdpa_cut"): one
// plan of whole pieces and later parts of cut pieces (the bottom-right causal mask over staged
// prefix K/V, the path only cut pieces take: a prefix of one token, a part of one token, a long
// prefix) on the run's heads and head_dim, forward and backward, against the CPU packed attention
// (lib/model/attention.cpp) on the self-checks' inputs (attention_self_check.h), as the model
// stages and unstages them. Every buffer SDPA reads has kSdpaTailRows rows of zeroed slack.
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "io/error.h"
#include "lib/backend/cuda_common.h"
#include "lib/backend/cuda_model.h"
#include "lib/model/attention.h"
#include "lib/model/attention_self_check.h"
#ifdef KILTER_WITH_SDPA
#include "lib/model/attention_sdpa.h"
#include "lib/model/sdpa_plan.h"
#endif

namespace kilter::backend {

#ifdef KILTER_WITH_SDPA
namespace {

namespace kc = model::cuda;

// A zeroed device buffer of n elements and `tail` more (the slack), freed on scope exit.
template <typename T>
struct ProbeBuffer {
  T* ptr = nullptr;
  size_t n = 0;
  explicit ProbeBuffer(size_t count, size_t tail = 0) : n(count) {
    const size_t bytes = sizeof(T) * std::max<size_t>(count + tail, 1);
    KILTER_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr), bytes));
    KILTER_CUDA_CHECK(cudaMemset(ptr, 0, bytes));
    KILTER_CUDA_CHECK(cudaDeviceSynchronize());  // the compute stream does not wait for the legacy one
  }
  ProbeBuffer(const std::vector<T>& host, size_t tail) : ProbeBuffer(host.size(), tail) {
    if (!host.empty()) KILTER_CUDA_CHECK(cudaMemcpy(ptr, host.data(), sizeof(T) * host.size(), cudaMemcpyHostToDevice));
    KILTER_CUDA_CHECK(cudaDeviceSynchronize());
  }
  ~ProbeBuffer() { cudaFree(ptr); }
  ProbeBuffer(const ProbeBuffer&) = delete;
  ProbeBuffer& operator=(const ProbeBuffer&) = delete;
  std::vector<T> download() const {
    std::vector<T> host(n);
    if (n > 0) KILTER_CUDA_CHECK(cudaMemcpy(host.data(), ptr, sizeof(T) * n, cudaMemcpyDeviceToHost));
    return host;
  }
};

// The problem: lengths and prefixes (s) per piece within a context of L tokens.
struct CutProblem {
  std::vector<int> lengths, offsets;
};

CutProblem cut_problem(int L) {
  // Whole L/2; a later part L/4 after L/2; a part of one token after L - 1; a whole piece of one
  // token; a part of up to 17 tokens after a prefix of one.
  return {{L / 2, L / 4, 1, 1, std::min(17, L - 1)}, {0, L / 2, L - 1, 0, 1}};
}

}  // namespace

std::string cuda_sdpa_cut_self_check(const model::ModelSpec& cfg) {
  const model::AttentionShape shape{cfg.n_head, cfg.kv_heads(), cfg.head_dim()};
  const int L = std::min(cfg.block_size, 512);
  if (L < 8) return "";  // no later part worth the name fits a context this short
  const CutProblem problem = cut_problem(L);
  const int pieces = static_cast<int>(problem.lengths.size());
  std::vector<int32_t> cu = {0}, offsets(problem.offsets.begin(), problem.offsets.end());
  std::vector<model::RowSpan> spans;
  for (int len : problem.lengths) spans.push_back({cu.back(), len}), cu.push_back(cu.back() + len);
  const int N = cu.back();
  const size_t W = shape.row_width(), C = shape.q_width(), KV = shape.kv_width(), tail = model::kSdpaTailRows;

  model::SdpaPlan plan;
  model::plan_sdpa(plan, cu.data(), pieces, offsets.data(), shape, model::sdpa_score_budget(N, L));
  kc::SdpaAttention engine(shape);
  for (const model::SdpaCall* call : plan.calls()) {
    std::string why;
    if (!engine.prepare(*call, &why)) return "cuDNN has no engine for " + call->bucket.text() + ": " + why;
  }

  // The inputs, and the CPU's answer.
  const std::vector<float> qkv = model::self_check_qkv(N, shape, spans, 12345u);
  const std::vector<float> dout = model::self_check_rows(size_t(N) * C, 54321u);
  std::vector<std::vector<float>> prefix_kv, prefix_dkv;
  std::vector<const float*> kv_host;
  std::vector<float*> dkv_host;
  for (int p = 0; p < pieces; ++p) {
    prefix_kv.push_back(model::self_check_rows(size_t(offsets[p]) * KV, 777u + p));
    prefix_dkv.emplace_back(prefix_kv.back().size(), 0.0f);
  }
  for (int p = 0; p < pieces; ++p) kv_host.push_back(prefix_kv[p].data()), dkv_host.push_back(prefix_dkv[p].data());
  std::vector<float> out_cpu(size_t(N) * C, 0.0f), dqkv_cpu(qkv.size(), 0.0f);
  {
    const model::AttentionPrefix prefix{offsets.data(), kv_host.data(), dkv_host.data()};
    std::vector<float> att(model::attention_saved_floats(cu.data(), pieces, shape.n_head, offsets.data()));
    model::attention_forward(out_cpu.data(), att.data(), qkv.data(), cu.data(), pieces, shape, false, prefix);
    model::attention_backward(dqkv_cpu.data(), dout.data(), qkv.data(), att.data(), cu.data(), pieces, shape, false, prefix);
  }

  // The engine, as the fp32-activation datapath runs it (staging from fp32 rows).
  cudaStream_t stream = cuda_compute_stream();
  ProbeBuffer<float> qkv32(qkv, 0), dout32(dout, 0), out32(size_t(N) * C), dqkv32(qkv.size());
  ProbeBuffer<kc::bf16> qkv16(size_t(N) * W, tail * W), dout16(size_t(N) * C, tail * C), out16(size_t(N) * C, tail * C),
      dqkv16(size_t(N) * W, tail * W);
  const size_t staged_rows = std::max(plan.staged_rows, 1);
  ProbeBuffer<kc::bf16> staged(staged_rows * KV, tail * KV), staged_grad(staged_rows * KV, tail * KV);
  ProbeBuffer<float> stats(size_t(N) * shape.n_head, tail * shape.n_head);
  std::vector<std::unique_ptr<ProbeBuffer<float>>> prefix_rows, prefix_grads;
  std::vector<const float*> kv_device(pieces, nullptr);
  std::vector<float*> dkv_device(pieces, nullptr);
  for (int p = 0; p < pieces; ++p) {
    prefix_rows.push_back(std::make_unique<ProbeBuffer<float>>(prefix_kv[p], 0));
    prefix_grads.push_back(std::make_unique<ProbeBuffer<float>>(prefix_kv[p].size()));
    if (offsets[p] > 0) kv_device[p] = prefix_rows[p]->ptr, dkv_device[p] = prefix_grads[p]->ptr;
  }
  std::vector<size_t> descriptor_offsets;
  ProbeBuffer<int32_t> descriptors(plan.descriptor_blocks(&descriptor_offsets), 0);
  const std::vector<const model::SdpaCall*> calls = plan.calls();
  size_t workspace_bytes = 1;
  for (const model::SdpaCall* call : calls) workspace_bytes = std::max(workspace_bytes, engine.workspace_bytes(*call));
  ProbeBuffer<uint8_t> workspace(workspace_bytes);

  const model::AttentionPrefix prefix{nullptr, kv_device.data(), dkv_device.data()};
  kc::rows_to_bf16(qkv16.ptr, W, qkv32.ptr, W, N, W, stream);
  kc::rows_to_bf16(dout16.ptr, C, dout32.ptr, C, N, C, stream);
  kc::sdpa_stage_keys(plan, prefix, qkv32.ptr, staged.ptr, stream);
  for (size_t i = 0; i < calls.size(); ++i) {
    const bool later = calls[i]->keys == model::SdpaKeyRows::staged;
    engine.forward(*calls[i], descriptors.ptr + descriptor_offsets[i], qkv16.ptr, later ? staged.ptr : qkv16.ptr,
                   out16.ptr, stats.ptr, workspace.ptr, stream);
  }
  for (size_t i = 0; i < calls.size(); ++i) {
    const bool later = calls[i]->keys == model::SdpaKeyRows::staged;
    engine.backward(*calls[i], descriptors.ptr + descriptor_offsets[i], qkv16.ptr, later ? staged.ptr : qkv16.ptr,
                    out16.ptr, dout16.ptr, stats.ptr, dqkv16.ptr, later ? staged_grad.ptr : dqkv16.ptr, workspace.ptr,
                    stream);
  }
  kc::rows_to_fp32(out32.ptr, C, out16.ptr, C, N, C, false, stream);
  kc::rows_to_fp32(dqkv32.ptr, W, dqkv16.ptr, W, N, W, false, stream);
  kc::sdpa_unstage_key_grads(plan, prefix, staged_grad.ptr, dqkv32.ptr, stream);
  KILTER_CUDA_CHECK(cudaStreamSynchronize(stream));

  const double out_error = model::max_relative_difference(out32.download(), out_cpu);
  const double grad_error = model::max_relative_difference(dqkv32.download(), dqkv_cpu);
  double prefix_error = 0.0;
  for (int p = 0; p < pieces; ++p)
    if (offsets[p] > 0)
      prefix_error = std::max(prefix_error, model::max_relative_difference(prefix_grads[p]->download(), prefix_dkv[p]));
  const double tolerance = model::kAttentionSelfCheckTolerance;
  if (out_error <= tolerance && grad_error <= tolerance && prefix_error <= tolerance) return "";
  char text[240];
  std::snprintf(text, sizeof text, "cut pieces against the CPU packed attention: relative difference %.3g in out, %.3g "
                "in dqkv, %.3g in the prefixes' dK/dV (limit %.0e)", out_error, grad_error, prefix_error, tolerance);
  return text;
}
#else
std::string cuda_sdpa_cut_self_check(const model::ModelSpec& cfg) {
  (void)cfg;
  return "this kilter was built without cuDNN SDPA (the cudnn-frontend headers)";
}
#endif

}  // namespace kilter::backend
