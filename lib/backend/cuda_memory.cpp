// cuda_memory.h: CudaModel's device allocations, counted the way CudaModel::carve()
// (cuda_arena.cu) and reserve() take them (every slice rounded up to 64 floats), from the same
// activation plan (lib/model/spec.h).
#include "lib/backend/cuda_memory.h"

#include <algorithm>
#include <vector>

#include "lib/model/attention_groups.h"

namespace kilter::backend {
namespace {

constexpr uint64_t kAlignFloats = 64;                 // cuda_model.cu: 256-byte arena slices
constexpr uint64_t kGemmWorkspaceBytes = 32ull << 20;  // matmul.cu: cuBLASLt's workspace
constexpr uint64_t kColumnChunks = 64;                // matmul.cu: column-sum partials per column

uint64_t align_up(uint64_t n) { return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }

}  // namespace

CudaDeviceBytes cuda_device_bytes(const model::ModelSpec& cfg, size_t padded_size, size_t owned_floats,
                                  int max_tokens, const std::string& recompute, bool bf16_operand_copies) {
  CudaDeviceBytes bytes;
  bytes.parameters = align_up(padded_size) * 4;
  bytes.gradients = align_up(padded_size) * 4;
  bytes.optimizer = 2 * uint64_t(std::max<size_t>(owned_floats, 1)) * 4;

  // reserve(max_tokens, context): full-context pieces, the remainder one shorter piece.
  const uint64_t C = uint64_t(cfg.n_embd), V = uint64_t(cfg.vocab_size), NH = uint64_t(cfg.n_head);
  const uint64_t N = uint64_t(std::max(max_tokens, 1));
  const int context = cfg.block_size;
  std::vector<int32_t> cu_seqlens = {0};
  while (cu_seqlens.back() < max_tokens) cu_seqlens.push_back(std::min(max_tokens, cu_seqlens.back() + context));
  model::AttentionGroups groups;
  groups.build(cu_seqlens.data(), int(cu_seqlens.size()) - 1, context);
  const uint64_t pieces = cu_seqlens.size() - 1, padded_rows = groups.padded_rows();
  // Per group the saved scores (B, NH, T, T); the engine scratch is the largest group's (q, k, v,
  // y, dq, dk, dv and one score matrix: kc::attention_workspace_floats). cuDNN's saved state and
  // scratch are smaller than these for every shape (statistics per row, no score matrix).
  uint64_t att_slice = 0, workspace = 0;
  for (const model::AttentionGroup& g : groups.groups) {
    const uint64_t B = uint64_t(g.B), T = uint64_t(g.T);
    att_slice += align_up(B * NH * T * T);
    workspace = std::max(workspace, 7 * B * T * C + B * NH * T * T);
  }
  // The blocks as CudaModel::carve() lays them out from the activation plan: the slices the
  // recompute modes share once, then each layer's own (the saved attention with them).
  const model::ActivationPlan plan = model::activation_plan(cfg, model::parse_recompute(recompute));
  uint64_t shared = 0, kept = 0;
  for (size_t s = 0; s < model::kActSlots; ++s) {
    if (plan.home[s] == model::ActHome::shared) shared += align_up(N * plan.per_token[s]);
    if (plan.home[s] == model::ActHome::kept) kept += align_up(N * plan.per_token[s]);
  }
  const uint64_t layers = uint64_t(cfg.n_layer);
  uint64_t floats = align_up(N * C);  // encoded
  floats += shared + layers * kept + (plan.attention_per_layer ? layers : 1) * att_slice;
  floats += align_up(N * C) + 2 * align_up(N);  // lnf and its statistics
  floats += align_up(N * V);                           // logits, their gradient in place
  const uint64_t qkv = uint64_t(cfg.qkv_width()), ffn_in = uint64_t(cfg.ffn_in_width());
  floats += 3 * align_up(N * C) + align_up(N * qkv) + align_up(N * ffn_in);  // dresidual, dln, datty, dqkv, dfch
  floats += 2 * align_up(padded_rows * qkv) + align_up(padded_rows * C);   // padded qkv, dqkv, io
  floats += align_up(workspace);
  floats += align_up(2 * kColumnChunks * uint64_t(cfg.widest_linear_out()));  // column-sum scratch
  floats += align_up(2 * N + 3 * pieces + 1 + padded_rows);  // inputs, targets, offsets, lengths, rows
  bytes.activations = floats * 4;

  // Two upload slots (inputs, targets, offsets, lengths) and cuBLASLt's workspace; with operand
  // copies, two bf16 buffers of the largest GEMM operand (+1/8 of room).
  bytes.engine = kGemmWorkspaceBytes + 2 * (2 * N + 2 * pieces + 1) * 4;
  if (bf16_operand_copies) {
    uint64_t largest = std::max({N * V, V * C, N * uint64_t(cfg.ffn_in_width())});
    for (const model::AttentionGroup& g : groups.groups)
      largest = std::max({largest, uint64_t(g.B) * NH * g.T * g.T, 7 * uint64_t(g.B) * g.T * C + uint64_t(g.B) * NH * g.T * g.T});
    bytes.engine += 2 * (largest + largest / 8) * 2;
  }
  return bytes;
}

}  // namespace kilter::backend
