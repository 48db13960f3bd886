// CudaModel's activation arena (cuda_model_impl.cuh): one device allocation carved into every
// activation of a micro-batch layout, laid out by the model description's activation layout
// (spec.h), measured and assigned by the same function, grown (stream drained first) when a larger
// layout arrives. lib/backend/cuda_memory.cpp counts the same slices for the memory plan.
#include <algorithm>

#include "lib/backend/cuda_model_impl.cuh"
#include "lib/model/sdpa_plan.h"

namespace kilter::backend {

std::vector<int32_t> CudaModel::Layout::key() const {
  std::vector<int32_t> key = {N, pieces, max_len};
  key.insert(key.end(), groups.shape_key.begin(), groups.shape_key.end());
  return key;
}

namespace {

// The integer rows of a micro-batch, in the order upload_batch writes them: inputs, targets,
// cu_seqlens, lengths, the groups' row map (map_rows) and the positions' offsets.
template <typename IntRows>  // CudaModel::Activations (private to CudaModel)
void carve_ints(ArenaCarver& carver, IntRows& a, size_t tokens, size_t pieces, size_t map_rows) {
  a.ints = carver.take_ints(2 * tokens + 3 * pieces + 1 + map_rows);
  a.inputs = a.ints;
  a.targets = a.inputs + tokens;
  a.cu_seqlens = a.targets + tokens;
  a.lengths = a.cu_seqlens + pieces + 1;
  a.padded_token = a.lengths + pieces;
  a.pos_offset = a.padded_token + map_rows;
}

}  // namespace

size_t CudaModel::carve(ArenaCarver& carver, Activations* acts, const Layout& layout) const {
  const size_t C = cfg_.n_embd, V = cfg_.vocab_size, NH = cfg_.n_head;
  const size_t tokens = layout.N;
  const size_t padded_rows = layout.groups.padded_rows();
  // Per group: att (cuBLASLt) or cuDNN's reserve space, whichever its engine may need; the
  // engine scratch is shared by the groups (they run one after the other).
  std::vector<size_t> saved_offset;
  size_t att_slice = 0, workspace = 0;
  for (size_t g = 0; g < layout.groups.groups.size(); ++g) {
    const int B = layout.groups.groups[g].B, T = layout.groups.groups[g].T;
    size_t saved = static_cast<size_t>(B) * NH * T * T;  // the workspace holds NH query heads of C wide
    size_t scratch = kc::attention_workspace_floats(B, T, static_cast<int>(C), static_cast<int>(NH));
    const bool maybe_cudnn = g < layout.group_cudnn.size() ? layout.group_cudnn[g] != 0 : cudnn_ != nullptr;
    if (cudnn_ && maybe_cudnn) {
      saved = std::max(saved, cudnn_->reserve_floats(B, T));
      scratch = std::max(scratch, cudnn_->workspace_floats(B, T));
    }
    saved_offset.push_back(att_slice);
    att_slice += align_up(saved);
    workspace = std::max(workspace, scratch);
  }
  std::vector<size_t> prefixed_saved_offset;
  for (const PrefixedPiece& part : layout.prefixed) {
    prefixed_saved_offset.push_back(att_slice);
    att_slice += align_up(NH * part.len * (static_cast<size_t>(part.offset) + part.len));
    workspace = std::max(workspace, kc::attention_prefix_workspace_floats(part.offset, part.len, static_cast<int>(C),
                                                                          static_cast<int>(NH)));
  }
  Activations a;
  a.saved_offset = std::move(saved_offset);
  a.prefixed_saved_offset = std::move(prefixed_saved_offset);
  a.encoded = carver.take(tokens * C);
  a.blocks.resize(cfg_.n_layer);
  // What the recompute modes share among the layers (recompute_), once, then each layer's own.
  const model::ActivationLayout& plan = plan_;
  model::BlockActivations shared = model::carve_block(plan, tokens, [&](model::ActSlot, model::ActHome home,
                                                                              size_t floats) {
    return home == model::ActHome::shared ? carver.take(floats) : nullptr;
  });
  float* shared_att = plan.attention_per_layer ? nullptr : carver.take(att_slice);
  for (BlockActivations& b : a.blocks) {
    b = model::carve_block(plan, tokens, [&](model::ActSlot slot, model::ActHome home, size_t floats) {
      return home == model::ActHome::kept ? carver.take(floats)
                                          : model::activation_slot(shared, slot);
    });
    b.att = plan.attention_per_layer ? carver.take(att_slice) : shared_att;
  }
  a.lnf = carver.take(tokens * C);
  a.lnf_mean = carver.take(tokens);
  a.lnf_rstd = carver.take(tokens);
  a.logits = carver.take(tokens * V);
  a.dresidual = carver.take(tokens * C);
  a.dln = carver.take(tokens * C);
  a.datty = carver.take(tokens * C);
  a.dqkv = carver.take(tokens * cfg_.qkv_width());
  a.dfch = carver.take(tokens * cfg_.ffn_in_width());
  if (cfg_.llama()) a.dact = carver.take(tokens * cfg_.ffn_width());
  a.padded_qkv = carver.take(padded_rows * cfg_.qkv_width());
  a.padded_io = carver.take(padded_rows * C);
  a.padded_dqkv = carver.take(padded_rows * cfg_.qkv_width());
  a.attention_workspace = carver.take(workspace);
  a.column_scratch = carver.take(2 * kc::column_sum_scratch_floats(cfg_.widest_linear_out()));
  carve_ints(carver, a, tokens, layout.pieces, padded_rows);
  if (acts != nullptr) *acts = std::move(a);
  return carver.used();
}

void CudaModel::lay_out_arena(const Layout& layout) {
  ArenaCarver measure(nullptr);
  ensure_arena(bf16_storage_ ? carve_bf16(measure, nullptr, nullptr, layout) : carve(measure, nullptr, layout), layout);
  ArenaCarver carver(arena_);
  if (bf16_storage_)
    carve_bf16(carver, &bacts_, &acts_, layout);
  else
    carve(carver, &acts_, layout);
}

namespace {

// bf16 elements (or fp32 ones) of an arena slice, in the carver's 4-byte units.
size_t floats_of_bf16(size_t elements) { return (elements + 1) / 2; }

}  // namespace

// The bf16 datapath's arena: the activation layout's slots in bf16 (its norm statistics in fp32),
// the saved attention state (the groups' softmax in bf16, or on SDPA cuDNN's fp32 Stats), the
// classifier's one chunk of logits, the residual stream's fp32 gradient with its bf16 copy, bf16
// scratch (the groups' padded rows and workspace only off SDPA; on SDPA the later parts' staged
// K/V); the same ints as the fp32 layout.
size_t CudaModel::carve_bf16(ArenaCarver& carver, ActivationsBf16* bacts, Activations* acts,
                             const Layout& layout) const {
  using kc::bf16;
  const size_t C = cfg_.n_embd, NH = cfg_.n_head, W = cfg_.qkv_width();
  const size_t kv = W - NH * static_cast<size_t>(cfg_.head_dim());
  // SDPA reads the packed rows themselves: the groups' padded rows are not carved.
  const size_t tokens = layout.N, padded_rows = layout.sdpa ? 0 : layout.groups.padded_rows();
  auto take_bf16 = [&](size_t elements) { return reinterpret_cast<bf16*>(carver.take(floats_of_bf16(elements))); };
  ActivationsBf16 b;
  size_t att_slice = 0, workspace = 0;  // bf16 elements; bytes
  if (layout.sdpa) {
    att_slice = 2 * align_up(tokens * NH);  // cuDNN's Stats, fp32 (the SDPA workspace is the engine's)
  } else {
    for (const model::AttentionGroup& g : layout.groups.groups) {
      b.saved_offset.push_back(att_slice);
      att_slice += 2 * align_up(floats_of_bf16(static_cast<size_t>(g.B) * NH * g.T * g.T));
      workspace = std::max(workspace, kc::attention_bf16_workspace_bytes(g.B, g.T, int(C), int(NH), score_budget_));
    }
    for (const PrefixedPiece& part : layout.prefixed) {
      b.prefixed_saved_offset.push_back(att_slice);
      att_slice += 2 * align_up(floats_of_bf16(NH * part.len * (static_cast<size_t>(part.offset) + part.len)));
      workspace = std::max(workspace, kc::attention_prefix_bf16_workspace_bytes(part.offset, part.len, int(C), int(NH)));
    }
  }
  b.encoded = take_bf16(tokens * C);
  // The plan's slots: the norm statistics (one float per token) stay fp32, every other slot bf16.
  const model::ActivationLayout& plan = plan_;
  auto slot_take = [&](model::ActSlot slot, size_t elements) -> float* {
    const bool statistic = slot == model::ActSlot::norm1_mean || slot == model::ActSlot::norm1_rstd ||
                           slot == model::ActSlot::norm2_mean || slot == model::ActSlot::norm2_rstd;
    return statistic ? carver.take(elements) : reinterpret_cast<float*>(take_bf16(elements));
  };
  model::BlockActivations shared = model::carve_block(plan, tokens, [&](model::ActSlot slot, model::ActHome home,
                                                                        size_t elements) {
    return home == model::ActHome::shared ? slot_take(slot, elements) : nullptr;
  });
  bf16* shared_att = plan.attention_per_layer ? nullptr : take_bf16(att_slice);
  b.blocks.resize(cfg_.n_layer);
  for (BlockBf16& block : b.blocks) {
    model::BlockActivations a = model::carve_block(plan, tokens, [&](model::ActSlot slot, model::ActHome home,
                                                                     size_t elements) {
      return home == model::ActHome::kept ? slot_take(slot, elements) : model::activation_slot(shared, slot);
    });
    auto as_bf16 = [](float* p) { return reinterpret_cast<bf16*>(p); };
    block.ln1 = as_bf16(a.ln1), block.qkv = as_bf16(a.qkv), block.atty = as_bf16(a.atty);
    block.residual2 = as_bf16(a.residual2), block.ln2 = as_bf16(a.ln2), block.fch = as_bf16(a.fch);
    block.fch_gelu = as_bf16(a.fch_gelu), block.residual3 = as_bf16(a.residual3);
    block.ln1_mean = a.ln1_mean, block.ln1_rstd = a.ln1_rstd, block.ln2_mean = a.ln2_mean, block.ln2_rstd = a.ln2_rstd;
    block.att = plan.attention_per_layer ? take_bf16(att_slice) : shared_att;
    block.stats = layout.sdpa ? reinterpret_cast<float*>(block.att) : nullptr;
  }
  b.lnf = take_bf16(tokens * C);
  b.lnf_mean = carver.take(tokens);
  b.lnf_rstd = carver.take(tokens);
  b.projection = take_bf16(tokens * C);
  // The classifier: as many rows as fit classifier_bytes_ of bf16 logits (a multiple of 64).
  const size_t row_bytes = sizeof(bf16) * static_cast<size_t>(vocab_padded_);
  const size_t fit = std::max<size_t>(64, classifier_bytes_ / std::max<size_t>(row_bytes, 1) / 64 * 64);
  b.classifier_rows = static_cast<int>(std::min(fit, std::max<size_t>(tokens, 1)));
  b.logits = take_bf16(static_cast<size_t>(b.classifier_rows) * vocab_padded_);
  b.row_losses = carver.take(tokens);
  b.dresidual = carver.take(tokens * C);
  b.dresidual_bf16 = take_bf16(tokens * C);
  b.dln = take_bf16(tokens * C);
  b.datty = take_bf16(tokens * C);
  b.dqkv = take_bf16(tokens * W);
  b.dfch = take_bf16(tokens * cfg_.ffn_in_width());
  if (cfg_.llama()) b.dact = take_bf16(tokens * cfg_.ffn_width());
  b.padded_qkv = take_bf16(padded_rows * W);
  b.padded_io = take_bf16(padded_rows * C);
  b.padded_dqkv = take_bf16(padded_rows * W);
  b.attention_workspace = carver.take((workspace + 3) / 4);
  b.column_scratch = carver.take(std::max(2 * kc::column_sum_scratch_floats(int(C)),
                                          kc::linear_scratch_floats(cfg_.widest_linear_out())));
  if (layout.exchange) {  // the K/V exchange moves fp32 rows
    b.exchange_qkv = carver.take(tokens * W);
    b.exchange_dqkv = carver.take(tokens * W);
  }
  if (layout.sdpa && layout.sdpa_staged_rows > 0) {
    b.sdpa_staged = take_bf16(static_cast<size_t>(layout.sdpa_staged_rows) * kv);
    b.sdpa_staged_grad = take_bf16(static_cast<size_t>(layout.sdpa_staged_rows) * kv);
  }
  // The ints keep the groups' row map whatever the engine: upload_batch writes one layout.
  Activations ints;
  carve_ints(carver, ints, tokens, layout.pieces, layout.groups.padded_rows());
  if (bacts != nullptr) *bacts = std::move(b);
  if (acts != nullptr) *acts = std::move(ints);
  return carver.used();
}

void CudaModel::ensure_arena(size_t floats, const Layout& layout) {
  if (floats <= capacity_floats_) return;
  // The old arena may still be read by queued kernels, and graphs point into it.
  KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));
  KILTER_CUDA_CHECK(cudaStreamSynchronize(copy_stream_));
  drop_graphs();
  cudaFree(arena_);
  arena_ = nullptr;
  capacity_floats_ = 0;
  // SDPA reads its rows (q|k|v, the staged prefix rows, dO, Stats) in the arena: kSdpaTailRows
  // rows of slack past the last slice, and the whole arena zeroed once, so that a tile past a
  // call's last sequence reads numbers, never memory nothing wrote.
  const size_t tail = static_cast<size_t>(model::kSdpaTailRows) * cfg_.qkv_width();
  const cudaError_t status = cudaMalloc(reinterpret_cast<void**>(&arena_), sizeof(float) * (floats + tail));
  if (status == cudaSuccess) {  // done before any stream (the copy stream too) writes into it
    KILTER_CUDA_CHECK(cudaMemsetAsync(arena_, 0, sizeof(float) * (floats + tail), stream_));
    KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  if (status != cudaSuccess) {
    cudaGetLastError();
    KILTER_FAIL("cuda backend: cannot allocate the activation arena of " << (sizeof(float) * floats >> 20)
                << " MiB for micro-batches of N=" << layout.N << " tokens (" << layout.pieces << " pieces, longest "
                << layout.max_len << ") on device " << device_ << " (" << cudaGetErrorString(status)
                << "); lower data.max_tokens or model.block_size");
  }
  capacity_floats_ = floats;
}

void CudaModel::reserve(int max_tokens, int context) {
  KILTER_CHECK(max_tokens > 0 && context > 0, "CudaModel::reserve: max_tokens and context must be positive, got "
                                                  << max_tokens << ", " << context);
  // Full-context pieces (the remainder as one shorter piece): the most attention per token.
  context = std::min(context, cfg_.block_size);
  Layout layout;
  layout.N = max_tokens;
  std::vector<int32_t> cu_seqlens = {0};
  while (cu_seqlens.back() < max_tokens) cu_seqlens.push_back(std::min(max_tokens, cu_seqlens.back() + context));
  layout.pieces = static_cast<int>(cu_seqlens.size()) - 1;
  layout.max_len = std::min(max_tokens, context);
  layout.groups.build(cu_seqlens.data(), layout.pieces, cfg_.block_size);
  // bf16 storage where SDPA may run: its layout (cuda_memory.cpp counts the same); a shape bucket
  // that falls back to the groups grows the arena at its micro-batch.
  layout.sdpa = bf16_storage_ && sdpa_ != nullptr;
  ensure_moments();  // before the arena: the state first, and no allocation left for the first step
  ensure_segments();
  ArenaCarver measure(nullptr);
  ensure_arena(bf16_storage_ ? carve_bf16(measure, nullptr, nullptr, layout) : carve(measure, nullptr, layout), layout);
  if (bf16_storage_) return;  // bf16 operands already: no rounding copies
  // bf16 math with operand copies (kc::Gemm) rounds each GEMM's operands into scratch: the
  // largest operand is the logits' gradient (N x V), the tied embedding (V x C), an MLP activation
  // (N x 4C), or an attention group's scores or head-split rows. Nothing is allocated otherwise.
  const size_t N = static_cast<size_t>(max_tokens), C = cfg_.n_embd, V = cfg_.vocab_size, NH = cfg_.n_head;
  size_t largest = std::max({N * V, V * C, N * size_t(cfg_.ffn_in_width())});
  for (const model::AttentionGroup& group : layout.groups.groups)
    largest = std::max({largest, static_cast<size_t>(group.B) * NH * group.T * group.T,
                        kc::attention_workspace_floats(group.B, group.T, static_cast<int>(C), static_cast<int>(NH))});
  gemm_->reserve_bf16(largest);
}

}  // namespace kilter::backend
