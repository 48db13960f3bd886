// CudaModel's activation arena (cuda_model_impl.cuh): one device allocation carved into every
// activation of a micro-batch layout, laid out by the model description's activation layout
// (spec.h), measured and assigned by the same carving (cuda_arena_layout.h, which the memory plan
// runs too: cuda_memory.cpp), grown (stream drained first) when a larger layout arrives.
#include <algorithm>

#include "lib/backend/cuda_model_impl.cuh"
#include "lib/model/sdpa_plan.h"

namespace kilter::backend {

ArenaModel CudaModel::arena_model() const {
  ArenaModel m{cfg_, plan_, size_t(vocab_padded_), score_budget_, classifier_bytes_};
  if (cudnn_)
    m.cudnn_group = [this](int B, int T) {
      return std::make_pair(cudnn_->reserve_floats(B, T), cudnn_->workspace_floats(B, T));
    };
  return m;
}

size_t CudaModel::measure_arena(const Layout& layout) const {
  ArenaCarver measure(nullptr);
  const ArenaModel m = arena_model();
  return bf16_storage_ ? carve_arena<ActivationsBf16>(measure, m, nullptr, nullptr, layout)
                       : carve_arena<Activations>(measure, m, nullptr, nullptr, layout);
}

void CudaModel::lay_out_arena(const Layout& layout) {
  ensure_arena(measure_arena(layout), layout);
  ArenaCarver carver(arena_);
  if (bf16_storage_)
    carve_arena(carver, arena_model(), &bacts_, &acts_, layout);
  else
    carve_arena(carver, arena_model(), &acts_, &acts_, layout);
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
  Layout layout = full_context_layout(max_tokens, context, cfg_.block_size);
  // bf16 storage where SDPA may run: its layout (cuda_memory.cpp counts the same); a shape bucket
  // that falls back to the groups grows the arena at its micro-batch.
  layout.sdpa = bf16_storage_ && sdpa_ != nullptr;
  ensure_moments();  // before the arena: the state first, and no allocation left for the first step
  ensure_segments();
  ensure_arena(measure_arena(layout), layout);
  if (bf16_storage_) return;  // bf16 operands already: no rounding copies
  // bf16 math with operand copies rounds each GEMM's operands into scratch; nothing is allocated otherwise.
  gemm_->reserve_bf16(largest_gemm_operand(arena_model(), layout));
}

}  // namespace kilter::backend
