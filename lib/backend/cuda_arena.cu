// CudaModel's activation arena (cuda_model_impl.cuh): one device allocation carved into every
// activation of a micro-batch layout, laid out by the model description's activation plan
// (spec.h), measured and assigned by the same function, grown (stream drained first) when a larger
// layout arrives. lib/backend/cuda_memory.cpp counts the same slices for the memory plan.
#include <algorithm>

#include "lib/backend/cuda_model_impl.cuh"

namespace kilter::backend {

std::vector<int32_t> CudaModel::Layout::key() const {
  std::vector<int32_t> key = {N, pieces, max_len};
  key.insert(key.end(), groups.shape_key.begin(), groups.shape_key.end());
  return key;
}

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
    size_t saved = static_cast<size_t>(B) * NH * T * T;
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
  const model::ActivationPlan& plan = plan_;
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
  a.padded_qkv = carver.take(padded_rows * cfg_.qkv_width());
  a.padded_io = carver.take(padded_rows * C);
  a.padded_dqkv = carver.take(padded_rows * cfg_.qkv_width());
  a.attention_workspace = carver.take(workspace);
  a.column_scratch = carver.take(2 * kc::column_sum_scratch_floats(cfg_.widest_linear_out()));
  const size_t pieces = layout.pieces;
  a.ints = carver.take_ints(2 * tokens + 3 * pieces + 1 + padded_rows);
  a.inputs = a.ints;
  a.targets = a.inputs + tokens;
  a.cu_seqlens = a.targets + tokens;
  a.lengths = a.cu_seqlens + pieces + 1;
  a.padded_token = a.lengths + pieces;
  a.pos_offset = a.padded_token + padded_rows;
  if (acts != nullptr) *acts = std::move(a);
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
  const cudaError_t status = cudaMalloc(reinterpret_cast<void**>(&arena_), sizeof(float) * floats);
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
  ensure_moments();  // before the arena: the state first, and no allocation left for the first step
  ArenaCarver measure(nullptr);
  ensure_arena(carve(measure, nullptr, layout), layout);
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
