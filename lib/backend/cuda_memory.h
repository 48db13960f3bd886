// What the CUDA backend allocates on its device, from the config alone (plain C++: no device,
// no CUDA headers), for the memory plan (lib/train/memory_plan.h). It follows CudaModel's
// constructor, ensure_moments() and reserve(): the flat state, the AdamW moments of the owned
// floats, the activation arena of the largest micro-batch (its own carving, cuda_arena_layout.h,
// for full-context pieces), and the GEMM engine's workspaces. tests/gpu/gpu_model_test.cpp compares it with
// the device memory a model really takes. Both datapaths: fp32 activations (train.precision =
// fp32, or bf16 storage off) and bf16 storage; attention in the padded groups or on cuDNN SDPA.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "lib/model/model.h"

namespace kilter::backend {

// The bf16 datapath's chunk budgets (CudaModel's defaults; the plan below counts with them): the
// fp32 attention scores of one chunk of a group's rows, and one chunk of the classifier's bf16 logits.
constexpr uint64_t kAttentionScoreBudgetFloats = uint64_t(32) << 20;  // 128 MiB
constexpr uint64_t kClassifierChunkBytes = uint64_t(128) << 20;

struct CudaDeviceBytes {
  uint64_t parameters = 0;   // fp32 weights, and under bf16 storage their bf16 working copy
  uint64_t gradients = 0;    // the flat fp32 gradient buffer
  uint64_t optimizer = 0;    // AdamW m and v of the owned floats
  uint64_t activations = 0;  // the arena: kept activations, saved attention, backward scratch, logits
  uint64_t engine = 0;       // cuBLASLt's workspace, the upload slots, bf16 operand copies (opt-in)
  // cuDNN SDPA's, apart from the GEMMs': its workspace (the largest call's) and, on the
  // fp32-activation datapath, its bf16 rows and every layer's Stats (each with kSdpaTailRows rows).
  uint64_t cudnn = 0;
  uint64_t total() const { return parameters + gradients + optimizer + activations + engine + cudnn; }
};

// padded_size: the layout's padded float count; owned_floats: the floats whose moments this
// rank holds (num_params unsharded). recompute: none | gelu | attention | block.
// bf16_operand_copies: KILTER_CUDA_BF16_INPUTS=1 with bf16 math (scratch for both operands).
// bf16_storage: the bf16 datapath (train.bf16_storage on, or auto where its self-check passes):
// bf16 activations (carve_arena) and the weights' bf16 working copy.
// sdpa: attention on cuDNN SDPA (cuda_plan_counts_sdpa): its workspace (model::sdpa_workspace_bound:
// cuDNN's deterministic backward, the largest call the score budget allows), and on the bf16
// datapath its Stats per layer instead of the groups' saved softmax, padded rows and workspace
// (on the fp32-activation datapath the groups' buffers stay, and its bf16 rows and Stats add).
CudaDeviceBytes cuda_device_bytes(const model::ModelSpec& cfg, size_t padded_size, size_t owned_floats,
                                  int max_tokens, const std::string& recompute, bool bf16_operand_copies,
                                  bool bf16_storage = false, bool sdpa = false);

// Whether the plan counts cuDNN SDPA attention: train.attention = sdpa, or auto with
// train.precision = bf16 (the engine the config asks for; under auto a shape bucket whose
// self-check fails runs on the groups, whose buffers the arena then grows into), where this kilter
// was built with SDPA and the attention shape is one it takes (head_dim a multiple of 8, ...).
bool cuda_plan_counts_sdpa(const model::ModelSpec& cfg, const std::string& attention, const std::string& precision);

}  // namespace kilter::backend
