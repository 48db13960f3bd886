// cuda_memory.h: CudaModel's device allocations, the arena measured by the carving CudaModel runs
// (cuda_arena_layout.h) on reserve()'s layout, and the cuDNN SDPA engine's (cuda_attention_sdpa.cu)
// from its host plan (lib/model/sdpa_plan.h).
#include "lib/backend/cuda_memory.h"

#include <algorithm>

#include "lib/backend/cuda_arena_layout.h"
#include "lib/model/sdpa_plan.h"

namespace kilter::backend {
namespace {

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

  // reserve(max_tokens, context)'s layout (full-context pieces, the remainder one shorter piece),
  // carved as CudaModel carves it (cuda_arena_layout.h), with no cuDNN engine (its saved state and
  // scratch are smaller than the groups' for every shape: statistics per row, no score matrix).
  const uint64_t V = uint64_t(cfg.vocab_size), N = uint64_t(std::max(max_tokens, 1));
  ArenaLayout layout = full_context_layout(int(N), cfg.block_size, cfg.block_size);
  layout.sdpa = bf16_storage && sdpa;
  const uint64_t pieces = uint64_t(layout.pieces);
  const model::ActivationLayout plan = model::activation_layout(cfg, model::parse_recompute(recompute));
  ArenaModel m{cfg, plan, (V + 127) / 128 * 128, kAttentionScoreBudgetFloats, kClassifierChunkBytes};
  ArenaCarver measure(nullptr);
  const uint64_t floats = bf16_storage
                              ? carve_arena<ArenaActivationsBf16<uint16_t>>(measure, m, nullptr, nullptr, layout)
                              : carve_arena<ArenaActivations>(measure, m, nullptr, nullptr, layout);
  // cuda_arena.cu's ensure_arena: kSdpaTailRows rows of q|k|v width of slack past the last slice.
  bytes.activations = (floats + uint64_t(model::kSdpaTailRows) * uint64_t(cfg.qkv_width())) * 4;

  // Two upload slots (inputs, targets, offsets, lengths) and cuBLASLt's workspace; with operand
  // copies, two bf16 buffers of the largest GEMM operand (+1/8 of room).
  bytes.engine = kc::kGemmWorkspaceBytes + 2 * (2 * N + 2 * pieces + 1) * 4;
  if (cfg.llama()) bytes.engine += 2 * uint64_t(cfg.block_size) * (cfg.head_dim() / 2) * 4;  // RoPE's cos and sin
  if (sdpa) bytes.cudnn = sdpa_engine_bytes(cfg, N, bf16_storage);
  if (bf16_operand_copies && !bf16_storage) {
    const uint64_t largest = largest_gemm_operand(m, layout);
    bytes.engine += 2 * (largest + largest / 8) * 2;
  }
  return bytes;
}

}  // namespace kilter::backend
