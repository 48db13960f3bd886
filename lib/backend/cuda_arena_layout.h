// CudaModel's activation arena laid out in plain C++ (no device, no CUDA headers), so that the
// device (cuda_arena.cu) and the memory plan (cuda_memory.cpp) walk the same slices: ArenaCarver
// (a null base only measures), a micro-batch's ArenaLayout, the two datapaths' slices (fp32
// ArenaActivations; ArenaActivationsBf16 over the bf16 type, the device's or a 2-byte stand-in)
// and the carving of each from the model description's activation layout (lib/model/layout.h).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <type_traits>
#include <utility>
#include <vector>

#include "lib/model/attention_groups.h"
#include "lib/model/kernel_scratch.h"
#include "lib/model/layout.h"
#include "lib/model/model.h"

namespace kilter::backend {

namespace kc = model::cuda;

constexpr size_t kAlignFloats = 64;  // 256-byte alignment of every arena slice

inline size_t align_up(size_t n) { return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }

// Carves 256-byte aligned slices out of one allocation; with base == nullptr it only measures.
class ArenaCarver {
 public:
  explicit ArenaCarver(float* base) : base_(base) {}
  float* take(size_t floats) {
    float* p = base_ == nullptr ? nullptr : base_ + used_;
    used_ += align_up(floats);
    return p;
  }
  int32_t* take_ints(size_t count) { return reinterpret_cast<int32_t*>(take(count)); }
  size_t used() const { return used_; }

 private:
  float* base_;
  size_t used_ = 0;
};

// A later part of a cut piece in the current micro-batch.
struct PrefixedPiece {
  int piece = 0, first_row = 0, offset = 0, len = 0;
};

// A micro-batch's layout (host side).
struct ArenaLayout {
  int N = 0, pieces = 0, max_len = 0;  // max_len: rows of dwpe touched (max offset + length)
  bool exchange = false;               // the batch has cut pieces (bf16 storage stages their K/V)
  model::AttentionGroups groups;       // the pieces without a prefix
  std::vector<PrefixedPiece> prefixed;
  std::vector<char> group_cudnn;  // per group: runs on cuDNN
  // bf16 storage with the batch on SDPA: no groups' softmax, padded rows or group workspace, but
  // cuDNN's Stats per layer and the later parts' staged K/V rows (sdpa_staged_rows of them).
  bool sdpa = false;
  int sdpa_staged_rows = 0;
  std::vector<int32_t> key() const {  // N, pieces, max_len, then the groups' (B,T)
    std::vector<int32_t> key = {N, pieces, max_len};
    key.insert(key.end(), groups.shape_key.begin(), groups.shape_key.end());
    return key;
  }
};

// The largest layout per token (CudaModel::reserve): max_tokens in full-context pieces, the
// remainder one shorter piece, grouped for a model of block_size positions.
inline ArenaLayout full_context_layout(int max_tokens, int context, int block_size) {
  ArenaLayout layout;
  layout.N = max_tokens;
  std::vector<int32_t> cu_seqlens = {0};
  while (cu_seqlens.back() < max_tokens) cu_seqlens.push_back(std::min(max_tokens, cu_seqlens.back() + context));
  layout.pieces = static_cast<int>(cu_seqlens.size()) - 1;
  layout.max_len = std::min(max_tokens, context);
  layout.groups.build(cu_seqlens.data(), layout.pieces, block_size);
  return layout;
}

// What both datapaths' slices of the arena hold, over their activation type T and block slots.
template <typename T, typename Block>
struct ArenaSlices {
  T* encoded = nullptr;
  std::vector<Block> blocks;  // att: the groups' saved state, group after group, then the later parts'
  T* lnf = nullptr;
  float *lnf_mean = nullptr, *lnf_rstd = nullptr;
  T *dln = nullptr, *datty = nullptr, *dqkv = nullptr, *dfch = nullptr, *dact = nullptr;  // dact: llama's SwiGLU
  // Attention in the groups' padded layout: qkv, out / dout, dqkv.
  T *padded_qkv = nullptr, *padded_io = nullptr, *padded_dqkv = nullptr;
  float* column_scratch = nullptr;
  std::vector<size_t> saved_offset;           // per group: its saved state within a block's att
  std::vector<size_t> prefixed_saved_offset;  // per later part (ArenaLayout::prefixed): its att after the groups'
};

// A micro-batch's ints, one block uploaded at once: inputs (N), targets (N), cu_seqlens (pieces+1),
// the groups' row lengths (pieces), padded_token (padded rows), pos_offset (pieces).
struct ArenaInts {
  int32_t *ints, *inputs, *targets, *cu_seqlens, *lengths, *padded_token, *pos_offset;
};

// The fp32 datapath's slices of the arena for one micro-batch layout, its ints with them.
struct ArenaActivations : ArenaSlices<float, model::BlockActivations>, ArenaInts {
  float *logits = nullptr, *dresidual = nullptr;
  float* attention_workspace = nullptr;  // the attention engine's scratch
};

// The bf16-storage datapath's slices (cuda_datapath_bf16.cu): every activation bf16 but the
// norms' statistics, laid out from the same activation layout; the ints stay in ArenaActivations.
template <typename Bf16>
struct ArenaBlockBf16 : model::BlockSlots<Bf16> {
  float* stats = nullptr;  // a batch on SDPA: cuDNN's Stats (N x n_head) in att's slice; else null
};
template <typename Bf16>
struct ArenaActivationsBf16 : ArenaSlices<Bf16, ArenaBlockBf16<Bf16>> {  // saved offsets in bf16 elements
  Bf16* projection = nullptr;  // a Linear's output before the fused residual add and norm
  Bf16* logits = nullptr;      // one chunk of the classifier: classifier_rows x vocab_padded
  int classifier_rows = 0;
  float* row_losses = nullptr;  // N
  float* dresidual = nullptr;   // the residual stream's gradient, fp32 (dresidual_bf16: its copy)
  Bf16* dresidual_bf16 = nullptr;
  void* attention_workspace = nullptr;
  float *exchange_qkv = nullptr, *exchange_dqkv = nullptr;  // fp32 rows for the K/V exchange (cut pieces)
  // A batch on SDPA with later parts: their staged K/V rows and those rows' dK/dV (kv_width wide).
  Bf16 *sdpa_staged = nullptr, *sdpa_staged_grad = nullptr;
};

// The gradients' slices and the groups' padded rows, in both datapaths' order (take: T elements).
template <typename T, typename Block, typename Take>
void carve_gradients(ArenaSlices<T, Block>& a, const model::ModelSpec& cfg, size_t tokens, size_t padded_rows,
                     Take take) {
  a.dln = take(tokens * cfg.n_embd);
  a.datty = take(tokens * cfg.n_embd);
  a.dqkv = take(tokens * cfg.qkv_width());
  a.dfch = take(tokens * cfg.ffn_in_width());
  if (cfg.llama()) a.dact = take(tokens * cfg.ffn_width());
  a.padded_qkv = take(padded_rows * cfg.qkv_width());
  a.padded_io = take(padded_rows * cfg.n_embd);
  a.padded_dqkv = take(padded_rows * cfg.qkv_width());
}

// What the carving reads besides the layout and the kernels' scratch sizes (kernel_scratch.h):
// the model and the chunk budgets.
struct ArenaModel {
  const model::ModelSpec& cfg;
  const model::ActivationLayout& plan;
  size_t vocab_padded = 0, score_budget = 0, classifier_bytes = 0;
  // The cuDNN attention engine's saved state and scratch (floats) for a group of B x T, where the
  // model has one (it may run a group): the arena takes the larger of those and the groups'.
  std::function<std::pair<size_t, size_t>(int B, int T)> cudnn_group;
};

// The largest operand a GEMM of the fp32 datapath rounds into bf16 scratch with operand copies
// (kc::Gemm): the logits' gradient (N x V), the tied embedding (V x C), an MLP activation (N x
// ffn_in_width), or an attention group's scores or head-split rows (its workspace).
inline size_t largest_gemm_operand(const ArenaModel& m, const ArenaLayout& layout) {
  const size_t N = layout.N, C = m.cfg.n_embd, V = m.cfg.vocab_size, NH = m.cfg.n_head;
  size_t largest = std::max({N * V, V * C, N * size_t(m.cfg.ffn_in_width())});
  for (const model::AttentionGroup& g : layout.groups.groups)
    largest = std::max(
        {largest, size_t(g.B) * NH * g.T * g.T, kc::attention_workspace_floats(g.B, g.T, int(C), int(NH))});
  return largest;
}

// The integer rows of a micro-batch, in the order upload_batch writes them: inputs, targets,
// cu_seqlens, lengths, the groups' row map (map_rows) and the positions' offsets.
inline void carve_ints(ArenaCarver& carver, ArenaInts& a, size_t tokens, size_t pieces, size_t map_rows) {
  a.ints = carver.take_ints(2 * tokens + 3 * pieces + 1 + map_rows);
  a.inputs = a.ints;
  a.targets = a.inputs + tokens;
  a.cu_seqlens = a.targets + tokens;
  a.lengths = a.cu_seqlens + pieces + 1;
  a.padded_token = a.lengths + pieces;
  a.pos_offset = a.padded_token + map_rows;
}

// The arena's floats for `elements` values of T (bf16: two to a float).
template <typename T>
size_t floats_for(size_t elements) {
  return (elements * sizeof(T) + sizeof(float) - 1) / sizeof(float);
}

// A block's slots carved in floats, as the datapath's element type T (the statistics stay fp32).
template <typename T>
model::BlockSlots<T> slots_as(const model::BlockActivations& a) {
  auto as = [](float* p) { return reinterpret_cast<T*>(p); };
  return {as(a.ln1),       a.ln1_mean, a.ln1_rstd, as(a.qkv), as(a.atty),     as(a.att),      as(a.residual2),
          as(a.ln2),       a.ln2_mean, a.ln2_rstd, as(a.fch), as(a.fch_gelu), as(a.residual3)};
}

// Lays out every activation of a layout in the datapath's slices A (ArenaActivations: fp32;
// ArenaActivationsBf16) and the micro-batch's ints; returns the floats used. The same function
// measures (null base) and assigns, so they cannot disagree. The bf16 datapath's arena: the
// activation layout's slots in bf16 (its norm statistics in fp32), the saved attention state (the
// groups' softmax in bf16, or on SDPA cuDNN's fp32 Stats), the classifier's one chunk of logits,
// the residual stream's fp32 gradient with its bf16 copy, bf16 scratch (the groups' padded rows
// and workspace only off SDPA; on SDPA the later parts' staged K/V).
template <typename A>
size_t carve_arena(ArenaCarver& carver, const ArenaModel& m, A* acts, ArenaInts* ints, const ArenaLayout& layout) {
  using T = std::remove_pointer_t<decltype(A::encoded)>;
  constexpr bool bf16 = !std::is_same_v<T, float>;
  const model::ModelSpec& cfg = m.cfg;
  const size_t C = cfg.n_embd, NH = cfg.n_head, W = cfg.qkv_width();
  const int c = cfg.n_embd, nh = cfg.n_head;  // as the kernels' scratch sizes take them
  const bool sdpa = bf16 && layout.sdpa;
  // SDPA reads the packed rows themselves: the groups' padded rows are not carved.
  const size_t tokens = layout.N, padded_rows = sdpa ? 0 : layout.groups.padded_rows();
  auto take = [&](size_t elements) { return reinterpret_cast<T*>(carver.take(floats_for<T>(elements))); };
  // Saved attention state of so many elements, in T elements of whole aligned slices.
  auto saved_slice = [](size_t elements) { return align_up(floats_for<T>(elements)) * sizeof(float) / sizeof(T); };
  A a;
  size_t att_slice = 0, workspace = 0;  // T elements; bytes
  if (sdpa) {
    att_slice = 2 * align_up(tokens * NH);  // cuDNN's Stats, fp32 (the SDPA workspace is the engine's)
  } else {
    // Per group: att (cuBLASLt) or, on fp32 activations, cuDNN's reserve space, whichever its
    // engine may need; the engine scratch is shared by the groups (they run one after the other).
    for (size_t g = 0; g < layout.groups.groups.size(); ++g) {
      const int B = layout.groups.groups[g].B, T_len = layout.groups.groups[g].T;
      size_t saved = static_cast<size_t>(B) * NH * T_len * T_len;
      size_t scratch = bf16 ? kc::attention_bf16_workspace_bytes(B, T_len, c, nh, m.score_budget)
                            : sizeof(float) * kc::attention_workspace_floats(B, T_len, c, nh);
      const bool maybe_cudnn = g < layout.group_cudnn.size() ? layout.group_cudnn[g] != 0 : true;
      if (!bf16 && m.cudnn_group && maybe_cudnn) {
        const auto [cudnn_saved, cudnn_scratch] = m.cudnn_group(B, T_len);
        saved = std::max(saved, cudnn_saved);
        scratch = std::max(scratch, sizeof(float) * cudnn_scratch);
      }
      a.saved_offset.push_back(att_slice);
      att_slice += saved_slice(saved);
      workspace = std::max(workspace, scratch);
    }
    for (const PrefixedPiece& part : layout.prefixed) {
      a.prefixed_saved_offset.push_back(att_slice);
      att_slice += saved_slice(NH * part.len * (static_cast<size_t>(part.offset) + part.len));
      const size_t scratch = bf16 ? kc::attention_prefix_bf16_workspace_bytes(part.offset, part.len, c, nh)
                                  : sizeof(float) * kc::attention_prefix_workspace_floats(part.offset, part.len, c, nh);
      workspace = std::max(workspace, scratch);
    }
  }
  a.encoded = take(tokens * C);
  // The plan's slots: the norm statistics (one float per token) stay fp32, every other slot T.
  auto slot_take = [&](model::ActSlot slot, size_t elements) -> float* {
    const bool statistic = slot == model::ActSlot::norm1_mean || slot == model::ActSlot::norm1_rstd ||
                           slot == model::ActSlot::norm2_mean || slot == model::ActSlot::norm2_rstd;
    return statistic ? carver.take(elements) : reinterpret_cast<float*>(take(elements));
  };
  // What the recompute modes share among the layers, once, then each layer's own.
  model::BlockActivations shared = model::carve_block(m.plan, tokens, [&](model::ActSlot slot, model::ActHome home,
                                                                          size_t elements) {
    return home == model::ActHome::shared ? slot_take(slot, elements) : nullptr;
  });
  T* shared_att = m.plan.attention_per_layer ? nullptr : take(att_slice);
  a.blocks.resize(cfg.n_layer);
  for (auto& block : a.blocks) {
    static_cast<model::BlockSlots<T>&>(block) = slots_as<T>(model::carve_block(
        m.plan, tokens, [&](model::ActSlot slot, model::ActHome home, size_t elements) {
          return home == model::ActHome::kept ? slot_take(slot, elements) : model::activation_slot(shared, slot);
        }));
    block.att = m.plan.attention_per_layer ? take(att_slice) : shared_att;
    if constexpr (bf16) block.stats = sdpa ? reinterpret_cast<float*>(block.att) : nullptr;
  }
  a.lnf = take(tokens * C);
  a.lnf_mean = carver.take(tokens);
  a.lnf_rstd = carver.take(tokens);
  if constexpr (bf16) {
    a.projection = take(tokens * C);
    // The classifier: as many rows as fit classifier_bytes of bf16 logits (a multiple of 64).
    const size_t row_bytes = 2 * m.vocab_padded;
    const size_t fit = std::max<size_t>(64, m.classifier_bytes / std::max<size_t>(row_bytes, 1) / 64 * 64);
    a.classifier_rows = static_cast<int>(std::min(fit, std::max<size_t>(tokens, 1)));
    a.logits = take(static_cast<size_t>(a.classifier_rows) * m.vocab_padded);
    a.row_losses = carver.take(tokens);
  } else {
    a.logits = take(tokens * cfg.vocab_size);
  }
  a.dresidual = carver.take(tokens * C);
  if constexpr (bf16) a.dresidual_bf16 = take(tokens * C);
  carve_gradients(a, cfg, tokens, padded_rows, take);
  a.attention_workspace = carver.take(floats_for<char>(workspace));
  a.column_scratch = carver.take(bf16 ? std::max(2 * kc::column_sum_scratch_floats(int(C)),
                                                 kc::linear_scratch_floats(cfg.widest_linear_out()))
                                      : 2 * kc::column_sum_scratch_floats(cfg.widest_linear_out()));
  if constexpr (bf16) {
    if (layout.exchange) {  // the K/V exchange moves fp32 rows
      a.exchange_qkv = carver.take(tokens * W);
      a.exchange_dqkv = carver.take(tokens * W);
    }
    if (sdpa && layout.sdpa_staged_rows > 0) {  // kv: the K/V columns of a q|k|v row
      const size_t kv = W - NH * static_cast<size_t>(cfg.head_dim());
      a.sdpa_staged = take(static_cast<size_t>(layout.sdpa_staged_rows) * kv);
      a.sdpa_staged_grad = take(static_cast<size_t>(layout.sdpa_staged_rows) * kv);
    }
  }
  // The ints keep the groups' row map whatever the engine: upload_batch writes one layout.
  ArenaInts rows;
  carve_ints(carver, rows, tokens, layout.pieces, layout.groups.padded_rows());
  if (acts != nullptr) *acts = std::move(a);
  if (ints != nullptr) *ints = rows;  // after acts: the fp32 slices hold their ints themselves
  return carver.used();
}

}  // namespace kilter::backend
