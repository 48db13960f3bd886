// CudaModel: the model (GPT-2 or the Llama family: RMSNorm, RoPE, SwiGLU, grouped K/V heads, an
// untied head) on one CUDA device: its blocks run the CPU model's block schedule
// (lib/model/block_schedule.h) on op tables of the CUDA twins of the CPU ops
// (lib/model/cuda_ops.h), so the CPU backend is its oracle (tests/gpu/). fp32 master weights,
// gradients and AdamW moments. Two datapaths: this file's, with fp32 activations (train.precision
// = fp32: IEEE fp32 GEMMs; bf16 with train.bf16_storage = off: bf16 tensor-core math on fp32
// operands, kc::Gemm), and the bf16-storage one
// (cuda_datapath_bf16.cu: bf16 activations, fused kernels), which train.bf16_storage = auto takes
// where its self-check against the CPU oracle passes at construction (cuda_self_check.cu). The
// optimizer (one launch for AdamW, one for the norm) is cuda_optimizer.cu. Device memory: one
// persistent state allocation (params, grads), the AdamW moments of the owned ranges (all of
// them, or 1/P with train.shard_optimizer: shard_optimizer()), and one activation arena sized by
// reserve() (grown, with the stream drained first, if a larger micro-batch arrives);
// train.recompute shrinks the arena (recompute_: model_base.h). The arena's size grows
// with the tokens (N) and the attention floats (NH * sum(B*T^2) over the attention groups), so
// reserve(max_tokens, block_size) covers micro-batches of full-context pieces; a batch whose
// groups pad more grows it once. Every kernel runs on cuda_compute_stream(); inputs go up on a
// separate copy stream, ordered by events.
//
// Packed micro-batches (model.h): every op but attention runs on the N token rows. Attention
// gathers the pieces into groups of similar length (model::AttentionGroups: a piece of length L
// in a row of T <= 1.25 L), runs each group as one padded (B,T) sub-batch through the chosen
// engine, and scatters the result back to the token rows, so its cost stays proportional to
// sum(L^2), not to pieces x (longest piece)^2.
//
// Device allocations after construction (arena growth, upload slots, cuDNN's per-shape trial and
// self-check) happen only in upload_batch(), at the start of a micro-batch. The trainer starts
// gradient reductions inside the last micro-batch's backward and waits for them before the next
// step, so no NCCL collective is in flight there: a cudaMalloc/cudaFree (which synchronize the
// device) cannot deadlock against a peer's collective.
//
// Attention engine (train.attention): cuDNN's SDPA on the packed rows (cuda_attention_sdpa.cu;
// sdpa, or auto in bf16, per shape bucket after its self-check), else cuDNN's multi-head attention
// API (attention_cudnn.cu) or cuBLASLt + a masked softmax (attention.cu), chosen per attention
// group shape (B,T).
// Cut pieces (context parallelism; docs/model.md, "Cut pieces"): a later part [s, s+L) of a piece takes
// positions from s and runs on its own (attention_prefix_*: L queries against the s prefix keys
// from batch.exchange and its own, bottom-right causal mask; cuBLASLt whatever the engine); the
// other pieces run in the groups. The exchange is called per layer in kv_exchange.h's order; the
// compute stream is drained before each send and before backward_wait_add, and the exchange's
// device work is complete or ordered on cuda_compute_stream() when its calls return. A batch with
// an exchange runs eagerly (no CUDA graphs: host calls sit between the kernels).
// tests/gpu/gpu_cut_test.cpp compares it with the uncut pieces on the device (docs/gpu.md).
// CUDA graphs (train.cuda_graphs): forward+loss, the LM-head backward, each block's backward and
// the embedding backward are captured once per batch layout (N, the pieces, the attention
// groups) and replayed where the replay is
// measured to beat the eager run (see GraphEntry); the on_ready calls between
// the segments keep the gradient reduction overlapping backward. Capture happens on a private
// stream so that the NCCL communicator, which orders itself after the compute stream from its
// own thread, can never join a capture.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "lib/backend/cuda_model_impl.cuh"
#include "lib/model/init.h"
#include "lib/model/rope.h"

namespace kilter::backend {

namespace {
// Graph replays read the loss scale from the device (kernel arguments are frozen at capture).
__global__ void store_scalar_kernel(float* dst, float value) { *dst = value; }

}  // namespace

CudaModel::CudaModel(const ModelSpec& cfg, size_t pad_multiple, const model::BackendOptions& options)
    : ModelBase(cfg, pad_multiple, options.recompute), options_(options) {
  const std::string& precision = options_.precision;
  KILTER_CHECK(precision == "fp32" || precision == "bf16",
               "train.precision=" << precision << " is not supported by the cuda backend (expected fp32 or bf16)");
  KILTER_CHECK(options_.attention == "auto" || options_.attention == "sdpa" || options_.attention == "cudnn" ||
                   options_.attention == "cublaslt",
               "train.attention=" << options_.attention << " is not one of auto, sdpa, cudnn, cublaslt");
  const std::string& storage = options_.bf16_storage;
  KILTER_USER_CHECK(storage == "auto" || storage == "on" || storage == "off",
                    "train.bf16_storage=" << storage << " is not one of auto, on, off");
  KILTER_USER_CHECK(storage != "on" || precision == "bf16",
                    "train.bf16_storage = on needs train.precision = bf16 (got " << precision << ")");
  KILTER_USER_CHECK(storage != "on" || options_.attention != "cudnn",
                    "train.bf16_storage = on: cuDNN's multi-head attention API takes fp32 activations; use "
                    "train.attention = auto, sdpa or cublaslt with bf16 storage, or train.bf16_storage = off");
  device_ = cuda_device_index();
  stream_ = cuda_compute_stream();
  KILTER_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  for (UploadSlot& slot : slots_) {
    KILTER_CUDA_CHECK(cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming));
    KILTER_CUDA_CHECK(cudaEventCreateWithFlags(&slot.consumed, cudaEventDisableTiming));
  }
  KILTER_CUDA_CHECK(cudaEventCreateWithFlags(&loss_ready_, cudaEventDisableTiming));
  const kc::GemmMath math = precision == "bf16" ? kc::GemmMath::bf16 : kc::GemmMath::fp32;
  gemm_ = std::make_unique<kc::Gemm>(stream_, math);
  s_ = stream_;
  g_ = gemm_.get();
  if (options_.cuda_graphs) {
    KILTER_CUDA_CHECK(cudaStreamCreateWithFlags(&capture_stream_, cudaStreamNonBlocking));
    KILTER_CUDA_CHECK(cudaEventCreateWithFlags(&to_capture_stream_, cudaEventDisableTiming));
    KILTER_CUDA_CHECK(cudaEventCreateWithFlags(&from_capture_stream_, cudaEventDisableTiming));
    gemm_capture_ = std::make_unique<kc::Gemm>(capture_stream_, math);
    gemm_capture_->share_bf16_scratch(*gemm_);  // the two engines' work is ordered by events
  }
  sdpa_init();  // cuda_attention_sdpa.cu
  choose_storage();
  const bool grouped_heads = cfg_.kv_heads() != cfg_.n_head;
  const bool legacy_cudnn = options_.attention == "auto" || options_.attention == "cudnn";
  if (legacy_cudnn && (bf16_storage_ || grouped_heads)) {
    // The bf16 datapath runs the bf16 cuBLASLt engine; cuDNN's multi-head attention API gives each
    // of its heads the whole vector, so grouped K/V heads cannot be expressed.
    cudnn_note_ = bf16_storage_ ? "bf16 storage runs the bf16 cuBLASLt engine"
                                : "grouped K/V heads (model.n_kv_head) are not in cuDNN's multi-head attention API";
    KILTER_USER_CHECK(options_.attention != "cudnn", "train.attention=cudnn: " << cudnn_note_
                                                                               << "; use train.attention=auto or cublaslt");
  } else if (legacy_cudnn) {
#ifdef KILTER_WITH_CUDNN
    try {
      cudnn_ = std::make_unique<kc::CudnnAttention>(stream_, math, cfg_.n_embd, cfg_.n_head);
    } catch (const Error& e) {
      KILTER_CHECK(options_.attention != "cudnn", "train.attention=cudnn: cuDNN cannot be used on device "
                                                      << device_ << ": " << e.what()
                                                      << " (use train.attention=auto or cublaslt)");
      cudnn_note_ = e.what();
      std::fprintf(stderr, "kilter: cuda backend: cuDNN attention unavailable (%s); using cuBLASLt attention\n",
                   cudnn_note_.c_str());
    }
#else
    KILTER_CHECK(options_.attention != "cudnn",
                 "train.attention=cudnn: this kilter was built without cuDNN (rebuild with -DENABLE_CUDNN=ON)");
    cudnn_note_ = "built without cuDNN";
#endif
  }

  const size_t padded = align_up(layout_.padded_size);
  const bool elsewhere = options_.params_held_elsewhere;  // set_param_units brings them
  if (!elsewhere) {
    // The gradients now; the fp32 parameters at their first write (ensure_params: under the
    // distributed optimizer they are never written whole).
    KILTER_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&grads_), sizeof(float) * padded));
    KILTER_CUDA_CHECK(cudaMemsetAsync(grads_, 0, sizeof(float) * padded, stream_));
  }
  KILTER_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&loss_device_),
                               sizeof(double) * (2 + kc::sum_of_squares_scratch_doubles())));
  KILTER_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&norm_counter_), sizeof(unsigned)));
  KILTER_CUDA_CHECK(cudaMemsetAsync(norm_counter_, 0, sizeof(unsigned), stream_));
  if (bf16_storage_) {
    // The bf16 working copy of the weights, and the head's with the vocabulary padded to a
    // multiple of 128 (its extra rows stay zero: zero logits, masked by the classifier).
    vocab_padded_ = (cfg_.vocab_size + 127) / 128 * 128;
    if (!elsewhere) KILTER_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&params_bf16_), sizeof(kc::bf16) * padded));
    const size_t head = static_cast<size_t>(vocab_padded_) * cfg_.n_embd;
    KILTER_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&head_bf16_), sizeof(kc::bf16) * head));
    KILTER_CUDA_CHECK(cudaMemsetAsync(head_bf16_, 0, sizeof(kc::bf16) * head, stream_));
    // The rounding of the zero weights (the fp32 ones are allocated at their first write).
    if (!elsewhere) KILTER_CUDA_CHECK(cudaMemsetAsync(params_bf16_, 0, sizeof(kc::bf16) * padded, stream_));
  }
  if (cfg_.llama()) {
    const model::RopeTable table = model::RopeTable::build(cfg_, cfg_.block_size);
    KILTER_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&rope_cos_), sizeof(float) * table.cos.size()));
    KILTER_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&rope_sin_), sizeof(float) * table.sin.size()));
    KILTER_CUDA_CHECK(cudaMemcpyAsync(rope_cos_, table.cos.data(), sizeof(float) * table.cos.size(),
                                      cudaMemcpyHostToDevice, stream_));
    KILTER_CUDA_CHECK(cudaMemcpyAsync(rope_sin_, table.sin.data(), sizeof(float) * table.sin.size(),
                                      cudaMemcpyHostToDevice, stream_));
  }
  KILTER_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host_scalars_), sizeof(double)));
  KILTER_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&scale_device_), sizeof(float)));

  KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaModel::choose_storage() {
  bf16_storage_ = false;
  if (options_.precision != "bf16") return;
  const std::string& storage = options_.bf16_storage;
  if (storage == "off") {
    storage_note_ = options_.bf16_storage_checked ? "the bf16-storage self-check failed on a rank"
                                                  : "train.bf16_storage=off";
    return;
  }
  if (storage == "on") {
    bf16_storage_ = true;
    storage_note_ = options_.bf16_storage_checked ? "self-checked against the CPU oracle at start-up on every rank"
                                                  : "train.bf16_storage=on, not self-checked";
    return;
  }
  if (options_.attention == "cudnn") {
    storage_note_ = "train.attention=cudnn takes fp32 activations";
    return;
  }
  // auto: the datapath has to prove itself on this device first (cuda_self_check.cu).
  const std::string why = bf16_storage_self_check(cfg_, options_);
  if (why.empty()) {
    bf16_storage_ = true;
    storage_note_ = "self-checked against the CPU oracle at start-up";
    return;
  }
  storage_note_ = "the bf16-storage self-check failed: " + why;
  std::fprintf(stderr, "kilter: cuda backend: the bf16-storage datapath disagreed with the CPU oracle on device %d (%s); "
               "training with fp32 activations and bf16 GEMMs, as train.bf16_storage=off does\n",
               device_, why.c_str());
}

CudaModel::~CudaModel() {
  // Destructors must not throw: drain and release, ignoring errors of a dying context.
  cudaStreamSynchronize(stream_);
  cudaStreamSynchronize(copy_stream_);
  drop_graphs();
  sdpa_.reset();
  cudnn_.reset();
  gemm_.reset();
  gemm_capture_.reset();
  if (capture_stream_ != nullptr) {
    cudaStreamSynchronize(capture_stream_);
    cudaStreamDestroy(capture_stream_);
    cudaEventDestroy(to_capture_stream_);
    cudaEventDestroy(from_capture_stream_);
  }
  cudaFree(scale_device_);
  cudaFree(arena_);
  if (!state_borrowed_) {
    cudaFree(params_);  // a cudaMalloc, or under the distributed optimizer a managed allocation
    cudaFree(grads_);
  }
  cudaFree(master_);
  release_moments();
  cudaFree(segments_);
  cudaFree(norm_counter_);
  if (!bf16_copy_borrowed_) cudaFree(params_bf16_);
  cudaFree(head_bf16_);
  cudaFree(rope_cos_);
  cudaFree(rope_sin_);
  cudaFree(loss_device_);
  cudaFreeHost(host_scalars_);
  for (UploadSlot& slot : slots_) {
    cudaFreeHost(slot.host);
    cudaFree(slot.device);
    cudaEventDestroy(slot.copied);
    cudaEventDestroy(slot.consumed);
  }
  cudaEventDestroy(loss_ready_);
  cudaStreamDestroy(copy_stream_);
}

std::string CudaModel::describe() const {
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, device_);
  std::string text = "cuda device " + std::to_string(device_) + " (" + prop.name + "), " + cfg_.arch + ", GEMMs " +
                     (options_.precision == "bf16" ? "bf16 tensor cores, fp32 accumulation" : "fp32") +
                     " on cuBLASLt, activations " +
                     (bf16_storage_ ? "bf16 (fused datapath)" : "fp32") +
                     (storage_note_.empty() ? "" : " (" + storage_note_ + ")") + ", attention " + sdpa_description();
#ifdef KILTER_WITH_CUDNN
  if (cudnn_) text += cudnn_->description();
#endif
  if (!cudnn_)
    text += std::string(bf16_storage_ ? "bf16 " : "") + "cuBLASLt + masked softmax" +
            (cudnn_note_.empty() ? "" : " (cuDNN: " + cudnn_note_ + ")");
  if (options_.cuda_graphs)
    text += ", CUDA graphs on (" + std::to_string(graphs_kept_) + " segment graphs kept where the replay beat eager, " +
            std::to_string(graphs_dropped_) + " left eager)";
  else
    text += ", CUDA graphs off";
  return text;
}

void CudaModel::upload_batch(const Batch& batch, float dloss_scale) {
  cuda_device_index();  // current device on this thread
  model::validate_batch(batch, cfg_);
  Layout& layout = layout_now_;
  layout.N = batch.N;
  layout.pieces = batch.num_pieces();
  layout.max_len = 0;
  layout.prefixed.clear();
  for (int p = 0; p < layout.pieces; ++p) {
    const int offset = batch.piece_offset(p), len = batch.piece_len(p);
    layout.max_len = std::max(layout.max_len, offset + len);
    if (offset > 0) layout.prefixed.push_back({p, batch.cu_seqlens[p], offset, len});
  }
  exchange_ = batch.exchange;
  layout.exchange = exchange_ != nullptr;
  layout.groups.build(batch.cu_seqlens.data(), layout.pieces, cfg_.block_size,
                      batch.pos_offset.empty() ? nullptr : batch.pos_offset.data());
  // The attention engine: SDPA on the packed rows, or each group's engine (the per-shape trials
  // and self-checks run here, before any kernel of this micro-batch is queued).
  batch_sdpa_ = sdpa_for_batch(batch);
  layout.sdpa = batch_sdpa_ && bf16_storage_;  // the arena of the bf16 datapath follows the engine
  layout.sdpa_staged_rows = layout.sdpa ? sdpa_staged_rows() : 0;
  const size_t num_groups = layout.groups.groups.size();
  layout.group_cudnn.assign(num_groups, 0);
  batch_cudnn_ = false;
  for (size_t g = 0; g < num_groups && !batch_sdpa_; ++g) {
    layout.group_cudnn[g] = cudnn_for_shape(layout.groups.groups[g].B, layout.groups.groups[g].T);
    batch_cudnn_ = batch_cudnn_ || layout.group_cudnn[g];
  }
  lay_out_arena(layout);
  const size_t N = batch.N, pieces = layout.pieces, padded_rows = layout.groups.padded_rows();
  const size_t ints = 2 * N + 3 * pieces + 1 + padded_rows;
  UploadSlot& slot = slots_[next_slot_];
  next_slot_ ^= 1;
  // This slot's previous copy must have left the host buffer (it did long ago, normally).
  if (slot.used) KILTER_CUDA_CHECK(cudaEventSynchronize(slot.copied));
  if (ints > slot.capacity) {
    if (slot.used) KILTER_CUDA_CHECK(cudaEventSynchronize(slot.consumed));
    cudaFreeHost(slot.host);
    cudaFree(slot.device);
    slot.host = nullptr;
    slot.device = nullptr;
    slot.capacity = 0;
    KILTER_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&slot.host), sizeof(int32_t) * ints));
    KILTER_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&slot.device), sizeof(int32_t) * ints));
    slot.capacity = ints;
  }
  // The same order as Activations::ints.
  int32_t* host = slot.host;
  host = std::copy(batch.inputs.begin(), batch.inputs.end(), host);
  host = std::copy(batch.targets.begin(), batch.targets.end(), host);
  host = std::copy(batch.cu_seqlens.begin(), batch.cu_seqlens.end(), host);
  host = std::copy(layout.groups.lengths.begin(), layout.groups.lengths.end(), host);
  host = std::fill_n(host, pieces - layout.groups.lengths.size(), 0);  // later parts have no group row
  host = std::copy(layout.groups.padded_token.begin(), layout.groups.padded_token.end(), host);
  for (int p = 0; p < layout.pieces; ++p) *host++ = batch.piece_offset(p);
  // The copy waits only until the compute stream has taken this slot's previous contents, not
  // for the micro-batch in flight: the upload overlaps its compute.
  if (slot.used) KILTER_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, slot.consumed, 0));
  KILTER_CUDA_CHECK(cudaMemcpyAsync(slot.device, slot.host, sizeof(int32_t) * ints, cudaMemcpyHostToDevice,
                                    copy_stream_));
  KILTER_CUDA_CHECK(cudaEventRecord(slot.copied, copy_stream_));
  KILTER_CUDA_CHECK(cudaStreamWaitEvent(stream_, slot.copied, 0));
  KILTER_CUDA_CHECK(cudaMemcpyAsync(acts_.ints, slot.device, sizeof(int32_t) * ints, cudaMemcpyDeviceToDevice, stream_));
  KILTER_CUDA_CHECK(cudaEventRecord(slot.consumed, stream_));
  slot.used = true;
  store_scalar_kernel<<<1, 1, 0, stream_>>>(scale_device_, dloss_scale);
  KILTER_CUDA_LAUNCH_CHECK();
}

// The fp32-activation datapath's op table (block_schedule.h): the names resolved into the arena's
// slices (BlockNames over memory_), every entry the CUDA twin of the CPU table's, on the segment's
// stream and GEMM engine (s_, g_). The exchange's calls drain the stream first: it reads and adds
// rows from elsewhere. Fusions: the residual add in the projection's GEMM; the rest two calls.
class CudaModel::Fp32Ops final : public DeviceOps<float> {
 public:
  explicit Fp32Ops(CudaModel& m)
      : DeviceOps(m, m.memory_, m.acts_,
                  {m.acts_.dresidual, m.acts_.dln, m.acts_.datty, m.acts_.dqkv, m.acts_.dfch, m.acts_.dact}) {}
  void norm(const model::NormArgs& a) override {
    const NormTensors t = norm_tensors(a.layer, a.out);
    const float eps = static_cast<float>(spec_.norm_eps);
    if (a.rms)
      kc::rmsnorm_forward(t.out, t.rstd, stream(a.layer, a.in), t.w, rows(), spec_.n_embd, eps, m_.s_);
    else
      kc::layernorm_forward(t.out, t.mean, t.rstd, stream(a.layer, a.in), t.w, t.b, rows(), spec_.n_embd, m_.s_, eps);
  }
  void linear(const model::LinearArgs& a) override {
    const LinearTensors t = linear_tensors(a.layer, a.weight);
    kc::matmul_forward(*m_.g_, act(a.layer, a.out), act(a.layer, a.in), t.w, t.b, rows(), t.in, t.out);
  }
  void projection_residual_norm(const model::ResidualNormArgs& a) override {
    const LinearTensors t = linear_tensors(a.layer, a.weight);
    kc::matmul_forward_residual(*m_.g_, stream(a.layer, a.out), act(a.layer, a.in), t.w, t.b,
                                stream(a.layer, a.residual), rows(), t.in, t.out);
    norm({.layer = a.layer, .out = a.norm_out, .in = a.out, .rms = a.rms});
  }
  void attention(const model::AttentionArgs& a) override;
  void kv_send(const model::LayerArgs& a) override {
    KILTER_CUDA_CHECK(cudaStreamSynchronize(m_.s_));
    m_.exchange_->forward_send(a.layer, act(a.layer, model::Act::qkv));
  }

  void linear_backward(const model::LinearBackwardArgs& a) override {
    const LinearTensors t = linear_tensors(a.layer, a.weight);
    kc::matmul_backward(*m_.g_, grad(a.dinp), t.dw, t.db, grad(a.dout), act(a.layer, a.in), t.w, rows(), t.in, t.out,
                        m_.acts_.column_scratch, false);
  }
  void linear_gelu_backward(const model::LinearGeluBackwardArgs& a) override {
    linear_backward({.layer = a.layer, .dinp = a.dinp, .dout = a.dout, .in = a.in, .weight = a.weight});
    kc::gelu_backward(grad(a.dinp), act(a.layer, a.pre_gelu), grad(a.dinp),
                      static_cast<size_t>(rows()) * spec_.ffn_width(), m_.s_, /*accumulate=*/false);
  }
  void norm_backward(const model::NormBackwardArgs& a) override {
    const NormTensors t = norm_tensors(a.layer, a.norm);
    float* scratch = m_.acts_.column_scratch;
    if (a.rms)
      kc::rmsnorm_backward(grad(a.dinp), t.dw, grad(a.dout), stream(a.layer, a.in), t.w, t.rstd, rows(), spec_.n_embd,
                           scratch, m_.s_);
    else
      kc::layernorm_backward(grad(a.dinp), t.dw, t.db, grad(a.dout), stream(a.layer, a.in), t.w, t.mean, t.rstd,
                             rows(), spec_.n_embd, scratch, m_.s_);
  }
  void attention_backward(const model::AttentionBackwardArgs& a) override;
  void kv_wait_add_grads(const model::LayerArgs& a) override {
    // The groups' scatter overwrites their rows of dqkv: it must be done before the exchange adds.
    KILTER_CUDA_CHECK(cudaStreamSynchronize(m_.s_));
    m_.exchange_->backward_wait_add(a.layer, grad(model::Grad::dqkv));
  }
};

// Attention of the pieces named: on SDPA, or the later parts against the prefixes the exchange
// holds (cuBLASLt), or the groups (gathered into padded rows, each on its engine, scattered back).
void CudaModel::Fp32Ops::attention(const model::AttentionArgs& a) {
  const int C = spec_.n_embd, NH = spec_.n_head, W = spec_.qkv_width();
  const BlockActivations& block = m_.acts_.blocks[size_t(a.layer)];
  const Activations& x = m_.acts_;
  float* out = act(a.layer, a.out);
  if (m_.batch_sdpa_) return m_.sdpa_forward_layer(a.layer, block, out, a.pieces);
  if (a.pieces == model::AttentionPieces::with_prefix) {
    const std::vector<PrefixedPiece>& prefixed = m_.layout_now_.prefixed;
    for (size_t k = 0; k < prefixed.size(); ++k) {
      const PrefixedPiece& part = prefixed[k];
      kc::attention_prefix_forward(*m_.g_, out + static_cast<size_t>(part.first_row) * C,
                                   block.att + x.prefixed_saved_offset[k],
                                   block.qkv + static_cast<size_t>(part.first_row) * W,
                                   m_.exchange_->prefix_kv(a.layer, part.piece), part.offset, part.len, C, NH,
                                   x.attention_workspace, spec_.kv_heads());
    }
    return;
  }
  const model::AttentionGroups& groups = m_.layout_now_.groups;
  kc::gather_padded_rows(x.padded_qkv, block.qkv, x.padded_token, groups.padded_rows(), W, m_.s_);
  for (size_t g = 0; g < groups.groups.size(); ++g) {
    const model::AttentionGroup& group = groups.groups[g];
    float* padded_out = x.padded_io + group.first_row * C;
    float* saved = block.att + x.saved_offset[g];
    const float* qkv = x.padded_qkv + group.first_row * W;
    const int32_t* lengths = x.lengths + group.first_length;
#ifdef KILTER_WITH_CUDNN
    if (m_.layout_now_.group_cudnn[g]) {
      m_.cudnn_->forward(padded_out, saved, qkv, groups.lengths.data() + group.first_length, lengths, group.B,
                         group.T, x.attention_workspace);
      continue;
    }
#endif
    kc::attention_forward(*m_.g_, padded_out, saved, qkv, lengths, group.B, group.T, C, NH, x.attention_workspace,
                          spec_.kv_heads());
  }
  kc::scatter_padded_rows(out, x.padded_io, x.padded_token, groups.padded_rows(), C, /*accumulate=*/false, m_.s_);
}

void CudaModel::Fp32Ops::attention_backward(const model::AttentionBackwardArgs& a) {
  const int C = spec_.n_embd, NH = spec_.n_head, W = spec_.qkv_width();
  const BlockActivations& block = m_.acts_.blocks[size_t(a.layer)];
  const Activations& x = m_.acts_;
  if (m_.batch_sdpa_) return m_.sdpa_backward_layer(a.layer, block, a.pieces);
  if (a.pieces == model::AttentionPieces::with_prefix) {
    // Their rows of dqkv are not written by the groups' scatter: zeroed here.
    const std::vector<PrefixedPiece>& prefixed = m_.layout_now_.prefixed;
    for (size_t k = 0; k < prefixed.size(); ++k) {
      const PrefixedPiece& part = prefixed[k];
      float* dqkv = x.dqkv + static_cast<size_t>(part.first_row) * W;
      KILTER_CUDA_CHECK(cudaMemsetAsync(dqkv, 0, sizeof(float) * part.len * W, m_.s_));
      kc::attention_prefix_backward(*m_.g_, dqkv, m_.exchange_->prefix_dkv(a.layer, part.piece),
                                    x.datty + static_cast<size_t>(part.first_row) * C,
                                    block.qkv + static_cast<size_t>(part.first_row) * W,
                                    m_.exchange_->prefix_kv(a.layer, part.piece), block.att + x.prefixed_saved_offset[k],
                                    part.offset, part.len, C, NH, x.attention_workspace, spec_.kv_heads());
    }
    return;
  }
  const model::AttentionGroups& groups = m_.layout_now_.groups;
  kc::gather_padded_rows(x.padded_qkv, block.qkv, x.padded_token, groups.padded_rows(), W, m_.s_);
  kc::gather_padded_rows(x.padded_io, x.datty, x.padded_token, groups.padded_rows(), C, m_.s_);
  for (size_t g = 0; g < groups.groups.size(); ++g) {
    const model::AttentionGroup& group = groups.groups[g];
    float* dqkv = x.padded_dqkv + group.first_row * W;
    const float* dout = x.padded_io + group.first_row * C;
    float* saved = block.att + x.saved_offset[g];
    const float* qkv = x.padded_qkv + group.first_row * W;
    const int32_t* lengths = x.lengths + group.first_length;
#ifdef KILTER_WITH_CUDNN
    if (m_.layout_now_.group_cudnn[g]) {
      m_.cudnn_->backward(dqkv, dout, qkv, saved, groups.lengths.data() + group.first_length, lengths, group.B,
                          group.T, x.attention_workspace, /*accumulate=*/false);
      continue;
    }
#endif
    kc::attention_backward(*m_.g_, dqkv, dout, qkv, saved, lengths, group.B, group.T, C, NH, x.attention_workspace,
                           /*accumulate=*/false, spec_.kv_heads());
  }
  kc::scatter_padded_rows(x.dqkv, x.padded_dqkv, x.padded_token, groups.padded_rows(), W, /*accumulate=*/false, m_.s_);
}

void CudaModel::forward_kernels() {
  const int C = cfg_.n_embd, V = cfg_.vocab_size;
  const int N = layout_now_.N;
  if (units_) {
    unit_needed(0);
    units_->prefetch(1);  // block 0's gather overlaps the embeddings
  }
  kc::encoder_forward(acts_.encoded, acts_.inputs, params_ + offsets_.wte, model::tensor_at(params_, offsets_.wpe),
                      acts_.cu_seqlens, layout_now_.pieces, N, C, s_, acts_.pos_offset);
  Fp32Ops ops(*this);
  schedule_.forward(ops);  // to ln_f's output
  if (units_) units_->forward_done(cfg_.n_layer);  // the last block's
  // Head: every row's logits (rows without a target get a zero gradient; the CPU gathers target
  // rows instead, which gives the same loss and gradients), then the loss and dlogits in place,
  // scaled by the device-side loss scale.
  kc::matmul_forward(*g_, acts_.logits, acts_.lnf, params_ + offsets_.head, nullptr, N, C, V);
  KILTER_CUDA_CHECK(cudaMemsetAsync(loss_device_, 0, sizeof(double), s_));
  kc::crossentropy_forward_backward_async(acts_.logits, acts_.logits, acts_.targets, N, V, 0.0f, loss_device_,
                                          /*accumulate=*/false, s_, scale_device_);
  KILTER_CUDA_CHECK(cudaMemcpyAsync(host_scalars_, loss_device_, sizeof(double), cudaMemcpyDeviceToHost, s_));
}

void CudaModel::finish_forward() { KILTER_CUDA_CHECK(cudaEventRecord(loss_ready_, stream_)); }

double CudaModel::read_loss() {
  KILTER_CUDA_CHECK(cudaEventSynchronize(loss_ready_));
  return host_scalars_[0];
}

double CudaModel::forward_loss(const Batch& batch) {
  model::check_evaluation_batch(batch);
  upload_batch(batch, 0.0f);
  // bf16 storage: the forward with the loss only is its own segment, not forward_backward's 0.
  if (bf16_storage_)
    run_segment(cfg_.n_layer + 3, [&] { forward_kernels_bf16(true); });
  else
    run_segment(0, [&] { forward_kernels(); });
  finish_forward();
  if (units_) units_->pass_done();
  return read_loss();
}

void CudaModel::head_backward() {
  // LM head (tied to wte, or its own): dlnf = dlogits @ head; dhead += dlogits^T @ lnf; then ln_f.
  const int N = layout_now_.N, C = cfg_.n_embd, V = cfg_.vocab_size;
  const Activations& a = acts_;
  kc::matmul_backward(*g_, a.dln, grads_ + offsets_.head, nullptr, a.logits, a.lnf, params_ + offsets_.head, N, C, V,
                      a.column_scratch, /*accumulate_dinp=*/false);
  KILTER_CUDA_CHECK(cudaMemsetAsync(a.dresidual, 0, sizeof(float) * static_cast<size_t>(N) * C, s_));
  Fp32Ops(*this).norm_backward({.layer = cfg_.n_layer - 1, .dinp = model::Grad::dresidual, .dout = model::Grad::dln,
                                .in = model::Stream::out, .norm = model::Act::next_ln, .rms = cfg_.llama()});
}

double CudaModel::forward_backward(const Batch& batch, float loss_scale, const model::GradReadyFn& on_ready) {
  upload_batch(batch, loss_scale);
  const bool bf16 = bf16_storage_;
  run_segment(0, [&] { bf16 ? forward_kernels_bf16(false) : forward_kernels(); });
  // The loss is known after the forward; with bf16 storage after the classifier, which computes
  // logits, loss and their gradient chunk by chunk as the head's backward segment.
  if (!bf16) finish_forward();
  if (backward_start_hook_) backward_start_hook_();
  // Sharded parameters: the head and the final norm's unit (kept since the forward) first; each
  // block's unit before its backward, the one below it prefetched; each unit's gradients handed
  // over as soon as they are final (CpuModel's order).
  if (units_) unit_needed(cfg_.n_layer + 1);
  run_segment(1, [&] { bf16 ? head_backward_bf16() : head_backward(); });
  if (bf16) finish_forward();
  // Reported ranges are final in stream order: the NCCL communicator waits on this stream.
  if (on_ready) on_ready(offsets_.lnf_w, layout_.padded_size - offsets_.lnf_w);
  if (units_) units_->grads_final(cfg_.n_layer + 1);
  for (int l = cfg_.n_layer - 1; l >= 0; --l) {
    if (units_) {
      unit_needed(l + 1);
      units_->prefetch(l);
    }
    run_segment(2 + (cfg_.n_layer - 1 - l), [&] {
      if (bf16) return bf16_ops_backward(l);
      Fp32Ops ops(*this);
      schedule_.block_backward(ops, l);
    });
    if (on_ready) on_ready(offsets_.block[l], offsets_.block_floats);
    if (units_) units_->grads_final(l + 1);
  }
  if (units_) unit_needed(0);
  run_segment(cfg_.n_layer + 2, [&] {
    kc::encoder_backward(grads_ + offsets_.wte, model::tensor_at(grads_, offsets_.wpe),
                         bf16 ? bacts_.dresidual : acts_.dresidual, acts_.inputs, acts_.cu_seqlens,
                         layout_now_.pieces, batch.N, layout_now_.max_len, cfg_.n_embd, s_, acts_.pos_offset);
  });
  if (on_ready) on_ready(offsets_.wte, offsets_.embeddings_end() - offsets_.wte);
  if (units_) {
    units_->grads_final(0);
    units_->pass_done();
  }
  return read_loss();
}

void CudaModel::set_param_units(model::ParamUnitHooks* hooks) {
  // A captured graph would freeze the gathers' cross-stream waits and the NCCL calls between its
  // kernels: the sharded model runs eagerly.
  KILTER_USER_CHECK(hooks == nullptr || !options_.cuda_graphs,
                    "config key train.cuda_graphs = true: CUDA graphs are not built for train.shard = parameters "
                    "(each unit's gather and reduce-scatter runs between the kernels); set train.cuda_graphs = false");
  KILTER_CHECK(hooks != nullptr || !state_borrowed_,
               "cuda backend: the parameter holder's buffers are the model's until it is destroyed");
  units_ = hooks;
  unit_ranges_ = units_ ? model::param_unit_ranges(layout_) : std::vector<model::ParamRange>{};
  KILTER_CHECK(!options_.params_held_elsewhere || !units_ || units_->params_storage(),
               "train.shard = parameters: the cuda model was built without its parameter buffers, and the "
               "parameter holder brings none");
  if (units_ && units_->params_storage()) {
    // The holder's sparsely backed buffers replace the whole ones (before anything is written to
    // them: run_setup initializes or restores after this). The kernels see the same offsets.
    KILTER_CHECK(units_->grads_storage(), "sharded parameters: a holder with parameter storage but none for gradients");
    KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));
    KILTER_CUDA_CHECK(cudaFree(params_));
    KILTER_CUDA_CHECK(cudaFree(grads_));
    state_borrowed_ = true;
    params_ = units_->params_storage();
    grads_ = units_->grads_storage();
    if (bf16_storage_) {
      // The holder gathers the working copy alone; of params_ it backs only the norms' tensors,
      // which the bf16 kernels read in fp32 (widened from the copy at each unit's gather). The
      // master is the distributed optimizer's (shard_optimizer, which run_setup calls next).
      norm_ranges_ = model::norm_tensor_ranges(layout_);
      if (void* copy = units_->working_copy_storage(sizeof(kc::bf16), norm_ranges_)) {
        KILTER_CUDA_CHECK(cudaFree(params_bf16_));
        params_bf16_ = static_cast<kc::bf16*>(copy);
        bf16_copy_borrowed_ = true;
        copy_gathered_ = true;
      }
    }
  }
}

void CudaModel::unit_needed(int unit) {
  if (!units_->need(unit) || !bf16_storage_) return;
  const model::ParamRange& r = unit_ranges_[size_t(unit)];
  // The holder gathered the unit's working copy: its norms widened, the head's padded copy.
  if (copy_gathered_) return unit_copy_derived(r);
  // The holder gathered the fp32 parameters: the unit's part of the bf16 working copy (and of the
  // padded head's copy where the head lies in it).
  const size_t head = offsets_.head, head_end = head + static_cast<size_t>(cfg_.vocab_size) * cfg_.n_embd;
  const bool has_head = head >= r.offset && head_end <= r.offset + r.count;
  kc::round_params_bf16(params_bf16_ + r.offset, params_ + r.offset, r.count, has_head ? head_bf16_ : nullptr,
                        has_head ? head - r.offset : 0, has_head ? head_end - r.offset : 0, stream_);
}

void CudaModel::forward_units(int layer) {
  // Block `layer` (or the final norm) is next; the forward of block layer - 2 is over, and it is
  // released before the next unit is asked for (a device holder backs at most three blocks).
  if (layer >= 2) units_->forward_done(layer - 1);
  unit_needed(layer + 1);
  units_->prefetch(layer + 2);
}

void CudaModel::ensure_params() {
  if (params_ != nullptr) return;
  const size_t padded = align_up(layout_.padded_size);
  KILTER_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&params_), sizeof(float) * padded));
  KILTER_CUDA_CHECK(cudaMemsetAsync(params_, 0, sizeof(float) * padded, stream_));
}

void CudaModel::init_params(uint64_t seed) {
  KILTER_CHECK(!copy_gathered_ || master_sharded_, "cuda backend: under train.shard = parameters with bf16 storage "
                                                   "the fp32 master is the distributed optimizer's: shard_optimizer "
                                                   "comes before the parameters are written");
  std::vector<float> host(layout_.padded_size, 0.0f);
  model::init_params(host.data(), layout_, cfg_, seed);
  cuda_device_index();
  if (master_sharded_) {
    load_sharded_master(host.data(), layout_.padded_size);
    zero_moments();
    KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return;
  }
  ensure_params();
  KILTER_CUDA_CHECK(cudaMemcpyAsync(params_, host.data(), sizeof(float) * layout_.padded_size, cudaMemcpyHostToDevice,
                                    stream_));
  if (bf16_storage_) refresh_working_copy();
  zero_moments();
  KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));  // `host` goes out of scope
}

void CudaModel::set_params(const float* host) {
  KILTER_CHECK(!copy_gathered_ || master_sharded_, "cuda backend: under train.shard = parameters with bf16 storage "
                                                   "the fp32 master is the distributed optimizer's: shard_optimizer "
                                                   "comes before the parameters are written");
  cuda_device_index();
  if (master_sharded_) return load_sharded_master(host, layout_.num_params);
  ensure_params();
  KILTER_CUDA_CHECK(cudaMemcpyAsync(params_, host, sizeof(float) * layout_.num_params, cudaMemcpyHostToDevice, stream_));
  if (bf16_storage_) refresh_working_copy();
  KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaModel::get_params(float* host) const {
  check_not_unit_wise("the whole parameters read (get_params: an unsharded checkpoint, a sample from the whole model)");
  cuda_device_index();
  if (master_sharded_) return read_working_copy(host);  // no rank holds the whole master
  KILTER_CHECK(params_ != nullptr, "cuda backend: get_params before the parameters were set");
  KILTER_CUDA_CHECK(cudaMemcpyAsync(host, params_, sizeof(float) * layout_.num_params, cudaMemcpyDeviceToHost, stream_));
  KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaModel::zero_grads() {
  cuda_device_index();
  KILTER_CUDA_CHECK(cudaMemsetAsync(grads_, 0, sizeof(float) * layout_.padded_size, stream_));
}

std::unique_ptr<model::Model> make_cuda_model(const ModelSpec& cfg, size_t pad_multiple,
                                              const model::BackendOptions& options) {
  return std::make_unique<CudaModel>(cfg, pad_multiple, options);
}

std::string cuda_bf16_storage_self_check(const ModelSpec& cfg, const model::BackendOptions& options) {
  return CudaModel::bf16_storage_self_check(cfg, options);
}

std::unique_ptr<model::Model> make_cuda_model(const ModelSpec& cfg, size_t pad_multiple, const std::string& precision) {
  model::BackendOptions options;
  options.precision = precision;
  return make_cuda_model(cfg, pad_multiple, options);
}

}  // namespace kilter::backend
