// cuda_memory.h: CudaModel's device allocations, counted the way CudaModel::carve()
// (cuda_arena.cu) and reserve() take them (every slice rounded up to 64 floats), from the same
// activation layout (lib/model/spec.h), and the cuDNN SDPA engine's (cuda_attention_sdpa.cu) from
// its host plan (lib/model/sdpa_plan.h).
#include "lib/backend/cuda_memory.h"

#include <algorithm>
#include <vector>

#include "lib/model/attention_groups.h"
#include "lib/model/sdpa_plan.h"

namespace kilter::backend {
namespace {

constexpr uint64_t kAlignFloats = 64;                 // cuda_model.cu: 256-byte arena slices
constexpr uint64_t kGemmWorkspaceBytes = 32ull << 20;  // matmul.cu: cuBLASLt's workspace
constexpr uint64_t kColumnChunks = 64;                // matmul.cu: column-sum partials per column

uint64_t align_up(uint64_t n) { return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }
uint64_t align256(uint64_t bytes) { return (bytes + 255) / 256 * 256; }
uint64_t bf16_slice(uint64_t elements) { return align_up((elements + 1) / 2); }  // in floats

// attention_bf16.cu: attention_bf16_workspace_bytes (q, k, v, y, dq, dk, dv in bf16, then one
// chunk of rows' fp32 scores and bf16 dP).
uint64_t attention_bf16_workspace(uint64_t B, uint64_t T, uint64_t C, uint64_t NH) {
  const uint64_t per_row = NH * T * T;
  const uint64_t rows = std::max<uint64_t>(1, std::min<uint64_t>(B, kAttentionScoreBudgetFloats / per_row));
  return 7 * align256(2 * B * T * C) + align256(4 * rows * per_row) + align256(2 * rows * per_row);
}

// CudaModel::carve_bf16 (cuda_arena.cu) for full-context pieces: the bf16 datapath's arena, floats.
// sdpa: the batch runs on cuDNN SDPA (Layout::sdpa): cuDNN's Stats instead of the groups' softmax,
// no padded rows and no group workspace (full-context pieces have no later parts to stage).
uint64_t bf16_arena_floats(const model::ModelSpec& cfg, const model::ActivationLayout& plan, uint64_t N,
                           const model::AttentionGroups& groups, uint64_t pieces, bool sdpa) {
  const uint64_t C = uint64_t(cfg.n_embd), NH = uint64_t(cfg.n_head), W = uint64_t(cfg.qkv_width());
  const uint64_t P = sdpa ? 0 : groups.padded_rows(), Vp = (uint64_t(cfg.vocab_size) + 127) / 128 * 128;
  uint64_t att_slice = sdpa ? align_up(N * NH) : 0, workspace = 0;  // floats; bytes
  for (const model::AttentionGroup& g : groups.groups) {
    if (sdpa) break;
    att_slice += bf16_slice(uint64_t(g.B) * NH * g.T * g.T);
    workspace = std::max(workspace, attention_bf16_workspace(uint64_t(g.B), uint64_t(g.T), C, NH));
  }
  auto slot = [&](size_t s) {  // the norm statistics are fp32, every other slot bf16
    const model::ActSlot which = static_cast<model::ActSlot>(s);
    const bool statistic = which == model::ActSlot::norm1_mean || which == model::ActSlot::norm1_rstd ||
                           which == model::ActSlot::norm2_mean || which == model::ActSlot::norm2_rstd;
    return statistic ? align_up(N) : bf16_slice(N * plan.per_token[s]);
  };
  uint64_t shared = 0, kept = 0;
  for (size_t s = 0; s < model::kActSlots; ++s) {
    if (plan.home[s] == model::ActHome::shared) shared += slot(s);
    if (plan.home[s] == model::ActHome::kept) kept += slot(s);
  }
  const uint64_t layers = uint64_t(cfg.n_layer);
  uint64_t floats = bf16_slice(N * C);  // encoded
  floats += shared + layers * kept + (plan.attention_per_layer ? layers : 1) * att_slice;
  floats += bf16_slice(N * C) + 2 * align_up(N);  // ln_f and its statistics
  floats += bf16_slice(N * C);                     // a projection before the fused residual add
  const uint64_t fit = std::max<uint64_t>(64, kClassifierChunkBytes / (2 * Vp) / 64 * 64);
  floats += bf16_slice(std::min(fit, N) * Vp) + align_up(N);  // one chunk of logits, the row losses
  floats += align_up(N * C) + 3 * bf16_slice(N * C);          // dresidual fp32, its copy, dln, datty
  floats += bf16_slice(N * W) + bf16_slice(N * uint64_t(cfg.ffn_in_width()));  // dqkv, dfch
  if (cfg.llama()) floats += bf16_slice(N * uint64_t(cfg.ffn_width()));       // dact
  floats += 2 * bf16_slice(P * W) + bf16_slice(P * C);                        // padded qkv, dqkv, io
  floats += align_up((workspace + 3) / 4);
  floats += align_up(std::max<uint64_t>(2 * kColumnChunks * C, kColumnChunks * uint64_t(cfg.widest_linear_out())));
  floats += align_up(2 * N + 3 * pieces + 1 + groups.padded_rows());  // the ints keep the groups' row map
  return floats;
}

// What the SDPA engine takes outside the arena (cuda_attention_sdpa.cu's SdpaState): cuDNN's
// workspace, as large as the largest call's (sdpa_workspace_bound), and on the fp32-activation
// datapath its bf16 rows (qkv, dqkv, out, dout), one staging row and every layer's Stats.
uint64_t sdpa_engine_bytes(const model::ModelSpec& cfg, uint64_t N, bool bf16_storage) {
  const model::AttentionShape shape{cfg.n_head, cfg.kv_heads(), cfg.head_dim()};
  uint64_t bytes = model::sdpa_workspace_bound(shape, int(N), cfg.block_size);
  const uint64_t tail = model::kSdpaTailRows;  // DeviceScratch's slack per buffer
  if (!bf16_storage)
    bytes += 2 * (2 * (N + tail) * uint64_t(shape.row_width()) + 2 * (N + tail) * uint64_t(shape.q_width()) +
                  2 * (1 + tail) * uint64_t(shape.kv_width())) +
             4 * (uint64_t(cfg.n_layer) * N + tail) * uint64_t(shape.n_head);
  return bytes;
}

}  // namespace

bool cuda_plan_counts_sdpa(const model::ModelSpec& cfg, const std::string& attention, const std::string& precision) {
#ifdef KILTER_WITH_SDPA
  const bool asked = attention == "sdpa" || (attention == "auto" && precision == "bf16");
  return asked && model::sdpa_shape_supported({cfg.n_head, cfg.kv_heads(), cfg.head_dim()}, nullptr);
#else
  (void)cfg, (void)attention, (void)precision;
  return false;
#endif
}

CudaDeviceBytes cuda_device_bytes(const model::ModelSpec& cfg, size_t padded_size, size_t owned_floats,
                                  int max_tokens, const std::string& recompute, bool bf16_operand_copies,
                                  bool bf16_storage, bool sdpa) {
  CudaDeviceBytes bytes;
  bytes.parameters = align_up(padded_size) * 4;
  if (bf16_storage)  // the working copy of every weight, and the head's with its vocabulary padded
    bytes.parameters += 2 * align_up(padded_size) + 2 * (uint64_t(cfg.vocab_size) + 127) / 128 * 128 * cfg.n_embd;
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
  // The blocks as CudaModel::carve() lays them out from the activation layout: the slices the
  // recompute modes share once, then each layer's own (the saved attention with them).
  const model::ActivationLayout plan = model::activation_layout(cfg, model::parse_recompute(recompute));
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
  if (cfg.llama()) floats += align_up(N * uint64_t(cfg.ffn_width()));          // dact
  floats += 2 * align_up(padded_rows * qkv) + align_up(padded_rows * C);   // padded qkv, dqkv, io
  floats += align_up(workspace);
  floats += align_up(2 * kColumnChunks * uint64_t(cfg.widest_linear_out()));  // column-sum scratch
  floats += align_up(2 * N + 3 * pieces + 1 + padded_rows);  // inputs, targets, offsets, lengths, rows
  // cuda_arena.cu's ensure_arena: kSdpaTailRows rows of q|k|v width of slack past the last slice.
  const uint64_t tail = uint64_t(model::kSdpaTailRows) * qkv;
  bytes.activations = ((bf16_storage ? bf16_arena_floats(cfg, plan, N, groups, pieces, sdpa) : floats) + tail) * 4;

  // Two upload slots (inputs, targets, offsets, lengths) and cuBLASLt's workspace; with operand
  // copies, two bf16 buffers of the largest GEMM operand (+1/8 of room).
  bytes.engine = kGemmWorkspaceBytes + 2 * (2 * N + 2 * pieces + 1) * 4;
  if (cfg.llama()) bytes.engine += 2 * uint64_t(cfg.block_size) * (cfg.head_dim() / 2) * 4;  // RoPE's cos and sin
  if (sdpa) bytes.cudnn = sdpa_engine_bytes(cfg, N, bf16_storage);
  if (bf16_operand_copies && !bf16_storage) {
    uint64_t largest = std::max({N * V, V * C, N * uint64_t(cfg.ffn_in_width())});
    for (const model::AttentionGroup& g : groups.groups)
      largest = std::max({largest, uint64_t(g.B) * NH * g.T * g.T, 7 * uint64_t(g.B) * g.T * C + uint64_t(g.B) * NH * g.T * g.T});
    bytes.engine += 2 * (largest + largest / 8) * 2;
  }
  return bytes;
}

}  // namespace kilter::backend
