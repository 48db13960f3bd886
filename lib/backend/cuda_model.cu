// CudaModel: the GPT-2 model on one CUDA device, composed from the CUDA twins of the CPU ops
// (lib/backend/cuda_ops.h) in exactly CpuModel's order, so the CPU backend is its oracle
// (tests/gpu/). fp32 master weights, gradients, AdamW moments and activations; precision "bf16"
// switches the GEMMs to bf16 tensor-core math with fp32 accumulation (kc::Gemm). Device memory: one
// persistent state allocation (params, grads), the AdamW moments of the owned ranges (all of
// them, or 1/P with train.shard_optimizer: shard_optimizer()), and one activation arena sized by
// reserve() (grown, with the stream drained first, if a larger micro-batch arrives);
// train.recompute shrinks the arena (recompute_ below). The arena's size grows
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
// Attention engine (train.attention): cuDNN's multi-head attention API (attention_cudnn.cu) or
// cuBLASLt + a masked softmax (attention.cu), chosen per attention group shape (B,T).
// Cut pieces (issue 23; docs/model.md, "Cut pieces"): a later part [s, s+L) of a piece takes
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
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "lib/backend/cuda_common.h"
#include "lib/backend/cuda_model.h"
#include "lib/model/attention_groups.h"
#include "lib/model/block_tensors.h"
#include "lib/backend/cuda_ops.h"
#include "lib/model/init.h"

namespace kilter::backend {

using model::Batch;
using model::GPTConfig;
namespace kc = model::cuda;

namespace {

constexpr size_t kAlignFloats = 64;  // 256-byte alignment of every arena slice

size_t align_up(size_t n) { return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }

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

// Graph replays read the loss scale from the device (kernel arguments are frozen at capture).
__global__ void store_scalar_kernel(float* dst, float value) { *dst = value; }

// Deterministic pseudo-random values in [-1, 1) (an integer hash of the index), for self-checks.
__global__ void fill_hash_kernel(float* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed ^ static_cast<uint32_t>(i >> 32);
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    h *= 0x846ca68bu;
    h ^= h >> 16;
    x[i] = static_cast<float>(h >> 8) * (2.0f / 16777216.0f) - 1.0f;
  }
}

// result[0] = max |a - b|, result[1] = max |b|, as float bits (non-negative floats order like
// their bits; a NaN difference shows as a value above every finite one).
// Each thread takes its maximum, each warp combines them, and one lane per warp does the atomics
// (blockDim.x is a multiple of 32).
__global__ void max_difference_kernel(unsigned* result, const float* a, const float* b, size_t n) {
  unsigned diff = 0, ref = 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    diff = max(diff, __float_as_uint(fabsf(a[i] - b[i])));
    ref = max(ref, __float_as_uint(fabsf(b[i])));
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    diff = max(diff, __shfl_xor_sync(0xffffffffu, diff, offset));
    ref = max(ref, __shfl_xor_sync(0xffffffffu, ref, offset));
  }
  if (threadIdx.x % 32 == 0) {
    atomicMax(&result[0], diff);
    atomicMax(&result[1], ref);
  }
}

class CudaModel final : public model::Model {
 public:
  CudaModel(const GPTConfig& cfg, size_t pad_multiple, const model::BackendOptions& options);
  ~CudaModel() override;

  std::string backend_name() const override { return "cuda"; }
  std::string describe() const override;
  const GPTConfig& config() const override { return cfg_; }
  const model::ParamLayout& layout() const override { return layout_; }

  void init_params(uint64_t seed) override;
  void set_params(const float* host) override;
  void get_params(float* host) const override;
  void get_optimizer_state(float* m, float* v) const override;
  void set_optimizer_state(const float* m, const float* v) override;
  bool supports_optimizer_shard() const override { return true; }
  void shard_optimizer(const std::vector<model::ParamRange>& owned) override;
  std::vector<model::ParamRange> optimizer_ranges() const override { return owned_; }
  void get_optimizer_shard(float* m, float* v, size_t first, size_t count) const override;

  double forward_backward(const Batch& batch, float loss_scale, const model::GradReadyFn& on_ready) override;
  double forward_loss(const Batch& batch) override;

  void zero_grads() override;
  float* grads() override { return grads_; }
  float* params() override { return params_; }
  bool params_in_host_memory() const override { return false; }
  void copy_params_to_host(float* host, size_t offset, size_t count) override {
    cuda_device_index();
    KILTER_CUDA_CHECK(cudaMemcpyAsync(host, params_ + offset, sizeof(float) * count, cudaMemcpyDeviceToHost, stream_));
    KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  double grad_norm_squared() override;
  void adamw_step(const model::AdamWParams& p) override;
  void synchronize() override { KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  void reserve(int max_tokens, int context) override;

 private:
  using BlockTensors = model::BlockTensors;
  using BlockActivations = model::BlockActivations;
  // Slices of the activation arena for one micro-batch layout.
  struct Activations {
    float* encoded;
    std::vector<BlockActivations> blocks;  // att: the groups' saved states, group after group
    float *lnf, *lnf_mean, *lnf_rstd, *logits;
    float *dresidual, *dln, *datty, *dqkv, *dfch;
    // Attention in the groups' padded layout: qkv, out / dout, dqkv; then the engine's scratch.
    float *padded_qkv, *padded_io, *padded_dqkv;
    float* attention_workspace;
    float* column_scratch;
    // One block of ints, uploaded at once: inputs (N), targets (N), cu_seqlens (pieces+1),
    // the groups' row lengths (pieces), padded_token (padded rows), pos_offset (pieces).
    int32_t *ints, *inputs, *targets, *cu_seqlens, *lengths, *padded_token, *pos_offset;
    std::vector<size_t> saved_offset;  // per group: its saved state within a block's att
    std::vector<size_t> prefixed_saved_offset;  // per later part (Layout::prefixed): its att after the groups'
  };
  // A later part of a cut piece in the current micro-batch.
  struct PrefixedPiece {
    int piece = 0, first_row = 0, offset = 0, len = 0;
  };
  // The current micro-batch's layout (host side).
  struct Layout {
    int N = 0, pieces = 0, max_len = 0;  // max_len: rows of dwpe touched (max offset + length)
    model::AttentionGroups groups;       // the pieces without a prefix
    std::vector<PrefixedPiece> prefixed;
    std::vector<char> group_cudnn;  // per group: runs on cuDNN
    std::vector<int32_t> key() const;  // N, pieces, max_len, then the groups' (B,T)
  };

  BlockTensors block_tensors(float* base, int layer) const;
  // Lays out every activation for a micro-batch layout; returns the floats used. The same
  // function measures (null base) and assigns, so they cannot disagree.
  size_t carve(ArenaCarver& carver, Activations* acts, const Layout& layout) const;
  void ensure_arena(size_t floats, const Layout& layout);
  // Attention of one block over the current layout's groups (gather, engine, scatter).
  void attention_forward_groups(const BlockActivations& a);
  void attention_backward_groups(const BlockActivations& a);
  // One layer's attention with the K/V exchange of cut pieces (kv_exchange.h's order): the groups
  // while the prefixes travel, then the later parts.
  void attention_forward_layer(int layer, const BlockActivations& a);
  // The later parts' attention of layer `layer` against their prefixes (exchange_->prefix_kv),
  // output rows into `out`, saved state into a.att.
  void attention_forward_prefixed(int layer, const BlockActivations& a, float* out);
  void attention_backward_layer(int layer, const BlockActivations& a);
  bool cudnn_for_shape(int B, int T);
  // Runs both attention engines on one pseudo-random problem of this shape (ragged rows,
  // forward and backward) and compares them: code that has never met a device must prove
  // itself before a run trusts it.
  bool cudnn_agrees(int B, int T, std::string* why, bool* retry);
  // Uploads the batch and sets the loss scale read by the cross-entropy kernel.
  void upload_batch(const Batch& batch, float dloss_scale);
  // Kernels of the forward pass and the head: logits, loss (into loss_device_, copied to the
  // host asynchronously) and dlogits in place.
  void forward_kernels();
  void backward_block_kernels(int layer);
  // Runs one segment's kernels eagerly, or as a CUDA graph of this shape (see top of file).
  template <class Body>
  void run_segment(int segment, const Body& body);
  void finish_forward();  // records loss_ready_ after the forward segment
  double read_loss();

  GPTConfig cfg_;
  model::ParamLayout layout_;
  model::BackendOptions options_;
  // train.recompute: what the forward keeps per layer (docs/model.md, "Activation recomputation").
  // gelu: the GELU output lives in one slice shared by the layers and is recomputed from fch before
  // the MLP projection's backward; attention: the attention's saved state (softmax or cuDNN's
  // statistics) is shared and the layer's attention forward reruns before its backward; block:
  // every activation of a layer but its output (residual3) is shared, and the whole block forward
  // reruns from the layer's input at the start of its backward.
  enum class Recompute { none, gelu, attention, block };
  Recompute recompute_ = Recompute::none;
  // Reruns layer l's attention forward (groups and later parts, no exchange calls: the prefixes
  // stay valid until the layer's backward_wait_add) into `out`, refilling a.att.
  void attention_recompute(int layer, const BlockActivations& a, float* out);
  // Reruns layer l's block forward into the shared slices (recompute = block).
  void block_recompute(int layer);
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t loss_ready_ = nullptr;
  std::unique_ptr<kc::Gemm> gemm_;
  std::unique_ptr<kc::CudnnAttention> cudnn_;  // null: cuBLASLt attention only
  std::string cudnn_note_;                     // why cuDNN attention is off, for describe()
  std::map<std::pair<int, int>, bool> cudnn_shapes_;  // decided group shapes: cuDNN or not
  bool batch_cudnn_ = false;                   // some group of the current micro-batch runs on cuDNN
  model::KvExchange* exchange_ = nullptr;      // the current micro-batch's (cut pieces), or null
  Layout layout_now_;                          // the current micro-batch's layout
  // The stream and GEMM engine the segment kernels go to: stream_/gemm_, or the capture pair
  // while a graph is being captured.
  cudaStream_t s_ = nullptr;
  kc::Gemm* g_ = nullptr;
  cudaStream_t capture_stream_ = nullptr;
  std::unique_ptr<kc::Gemm> gemm_capture_;
  // One segment of one batch layout. Occurrences: 1 eager (warms the capture engine), 2 eager
  // and timed, 3 captured and launched, 4 replayed and timed, 5 decided: the graph is kept only
  // if its replay took less GPU time than the eager run, else the segment stays eager.
  struct GraphEntry {
    int seen = 0;             // occurrences, counted up to 5
    bool decided = false;
    bool eager_only = false;  // capture failed, or the graph did not pay off
    cudaGraphExec_t exec = nullptr;
    cudaEvent_t timing[4] = {nullptr, nullptr, nullptr, nullptr};  // eager start/end, replay start/end
  };
  int graphs_kept_ = 0, graphs_dropped_ = 0;  // segment decisions, for describe()
  // Decides once the replay's timing is in (false while it is still running: try next time).
  bool decide_graph(GraphEntry& entry);
  cudaEvent_t to_capture_stream_ = nullptr, from_capture_stream_ = nullptr;
  std::map<std::pair<std::vector<int32_t>, int>, GraphEntry> graphs_;  // (layout key, segment)
  void drop_graphs();
  float* scale_device_ = nullptr;

  float* state_ = nullptr;  // params, grads: padded_size floats each
  float *params_ = nullptr, *grads_ = nullptr;
  // AdamW moments of the owned ranges, range after range ({[0, num_params)} unless sharded), in
  // one allocation (m, then v) made on first use, so that a sharded model never holds the full
  // moments (train.shard_optimizer, ZeRO-1: the reducer decides the ranges).
  std::vector<model::ParamRange> owned_;
  bool sharded_ = false;
  float *adam_m_ = nullptr, *adam_v_ = nullptr;
  size_t moments_held_ = 0;  // floats of each moment allocated (0: none yet)
  size_t owned_floats() const;
  void ensure_moments();
  void release_moments();
  double* range_norms_ = nullptr;  // per owned range: its squared gradient norm (device)
  size_t range_norms_capacity_ = 0;
  double* loss_device_ = nullptr;   // [0] loss sum, then the squared norms' scratch
  double* host_scalars_ = nullptr;  // pinned: [0] loss
  // Two upload slots used in turn, each a pinned host buffer and a device buffer for inputs,
  // targets and lengths: micro-batch k+1 goes up on the copy stream while micro-batch k computes;
  // the compute stream then copies it (device to device, a few hundred KB) into the arena.
  struct UploadSlot {
    int32_t* host = nullptr;
    int32_t* device = nullptr;
    size_t capacity = 0;                // ints
    cudaEvent_t copied = nullptr;       // copy stream: host -> device done
    cudaEvent_t consumed = nullptr;     // compute stream: device slot -> arena done
    bool used = false;
  };
  UploadSlot slots_[2];
  int next_slot_ = 0;

  float* arena_ = nullptr;
  size_t capacity_floats_ = 0;
  Activations acts_{};

  model::LayoutOffsets offsets_;
};

CudaModel::CudaModel(const GPTConfig& cfg, size_t pad_multiple, const model::BackendOptions& options)
    : cfg_(cfg), layout_(model::ParamLayout::build(cfg, pad_multiple)), options_(options) {
  const std::string& precision = options_.precision;
  KILTER_CHECK(precision == "fp32" || precision == "bf16",
               "train.precision=" << precision << " is not supported by the cuda backend (expected fp32 or bf16)");
  KILTER_CHECK(options_.attention == "auto" || options_.attention == "cudnn" || options_.attention == "cublaslt",
               "train.attention=" << options_.attention << " is not one of auto, cudnn, cublaslt");
  if (options_.recompute == "none") recompute_ = Recompute::none;
  else if (options_.recompute == "gelu") recompute_ = Recompute::gelu;
  else if (options_.recompute == "attention") recompute_ = Recompute::attention;
  else if (options_.recompute == "block") recompute_ = Recompute::block;
  else KILTER_FAIL("train.recompute=" << options_.recompute << " is not one of none, gelu, attention, block");
  KILTER_CHECK(cfg_.n_embd % cfg_.n_head == 0,
               "model.n_embd=" << cfg_.n_embd << " is not a multiple of model.n_head=" << cfg_.n_head);
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
  if (options_.attention != "cublaslt") {
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
  KILTER_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&state_), sizeof(float) * padded * 2));
  params_ = state_;
  grads_ = state_ + padded;
  KILTER_CUDA_CHECK(cudaMemsetAsync(state_, 0, sizeof(float) * padded * 2, stream_));
  owned_ = {{0, layout_.num_params}};
  KILTER_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&loss_device_),
                               sizeof(double) * (1 + kc::sum_of_squares_scratch_doubles())));
  KILTER_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host_scalars_), sizeof(double)));
  KILTER_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&scale_device_), sizeof(float)));

  offsets_ = model::LayoutOffsets::of(layout_, cfg_.n_layer);
  KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

CudaModel::~CudaModel() {
  // Destructors must not throw: drain and release, ignoring errors of a dying context.
  cudaStreamSynchronize(stream_);
  cudaStreamSynchronize(copy_stream_);
  drop_graphs();
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
  cudaFree(state_);
  cudaFree(adam_m_);
  cudaFree(range_norms_);
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

CudaModel::BlockTensors CudaModel::block_tensors(float* base, int layer) const {
  return model::block_tensors_at(base + offsets_.block[layer], size_t(cfg_.n_embd));
}

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
  // Slices the recompute modes share among the layers (see recompute_).
  // (Decided by flags, not by null pointers: while measuring, every slice is null.)
  const bool block = recompute_ == Recompute::block;
  const bool share_att = recompute_ == Recompute::attention, share_gelu = recompute_ == Recompute::gelu;
  float* shared_att = share_att ? carver.take(att_slice) : nullptr;
  float* shared_gelu = share_gelu ? carver.take(tokens * 4 * C) : nullptr;
  BlockActivations shared{};
  if (block) {
    shared.ln1 = carver.take(tokens * C);
    shared.ln1_mean = carver.take(tokens);
    shared.ln1_rstd = carver.take(tokens);
    shared.qkv = carver.take(tokens * 3 * C);
    shared.atty = carver.take(tokens * C);
    shared.att = carver.take(att_slice);
    shared.residual2 = carver.take(tokens * C);
    shared.ln2 = carver.take(tokens * C);
    shared.ln2_mean = carver.take(tokens);
    shared.ln2_rstd = carver.take(tokens);
    shared.fch = carver.take(tokens * 4 * C);
    shared.fch_gelu = carver.take(tokens * 4 * C);
  }
  for (BlockActivations& b : a.blocks) {
    if (block) {
      b = shared;
      b.residual3 = carver.take(tokens * C);
      continue;
    }
    b.ln1 = carver.take(tokens * C);
    b.ln1_mean = carver.take(tokens);
    b.ln1_rstd = carver.take(tokens);
    b.qkv = carver.take(tokens * 3 * C);
    b.atty = carver.take(tokens * C);
    b.att = share_att ? shared_att : carver.take(att_slice);
    b.residual2 = carver.take(tokens * C);
    b.ln2 = carver.take(tokens * C);
    b.ln2_mean = carver.take(tokens);
    b.ln2_rstd = carver.take(tokens);
    b.fch = carver.take(tokens * 4 * C);
    b.fch_gelu = share_gelu ? shared_gelu : carver.take(tokens * 4 * C);
    b.residual3 = carver.take(tokens * C);
  }
  a.lnf = carver.take(tokens * C);
  a.lnf_mean = carver.take(tokens);
  a.lnf_rstd = carver.take(tokens);
  a.logits = carver.take(tokens * V);
  a.dresidual = carver.take(tokens * C);
  a.dln = carver.take(tokens * C);
  a.datty = carver.take(tokens * C);
  a.dqkv = carver.take(tokens * 3 * C);
  a.dfch = carver.take(tokens * 4 * C);
  a.padded_qkv = carver.take(padded_rows * 3 * C);
  a.padded_io = carver.take(padded_rows * C);
  a.padded_dqkv = carver.take(padded_rows * 3 * C);
  a.attention_workspace = carver.take(workspace);
  a.column_scratch = carver.take(2 * kc::column_sum_scratch_floats(static_cast<int>(4 * C)));
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
  size_t largest = std::max({N * V, V * C, N * 4 * C});
  for (const model::AttentionGroup& group : layout.groups.groups)
    largest = std::max({largest, static_cast<size_t>(group.B) * NH * group.T * group.T,
                        kc::attention_workspace_floats(group.B, group.T, static_cast<int>(C), static_cast<int>(NH))});
  gemm_->reserve_bf16(largest);
}

bool CudaModel::cudnn_for_shape(int B, int T) {
  if (!cudnn_) return false;
  const auto decided = cudnn_shapes_.find({B, T});
  if (decided != cudnn_shapes_.end()) return decided->second;
  std::string why;
  bool retry = false;
  const bool usable = cudnn_->supports(B, T, &why, &retry) && cudnn_agrees(B, T, &why, &retry);
  // Short of memory for the trial or the self-check: cuBLASLt this time, ask again next time.
  if (!usable && retry && options_.attention == "auto") return false;
  cudnn_shapes_[{B, T}] = usable;
  if (!usable) {
    KILTER_CHECK(options_.attention != "cudnn", "train.attention=cudnn: cuDNN attention cannot be used for micro-batches of B="
                                                    << B << " T=" << T << ": " << why
                                                    << " (use train.attention=auto or cublaslt)");
    std::fprintf(stderr, "kilter: cuda backend: cuDNN attention not used for B=%d T=%d (%s); this shape uses cuBLASLt attention\n",
                 B, T, why.c_str());
  }
  return usable;
}

bool CudaModel::cudnn_agrees(int B, int T, std::string* why, bool* retry) {
  *retry = false;
#ifdef KILTER_WITH_CUDNN
  const int C = cfg_.n_embd, NH = cfg_.n_head;
  const size_t btc = static_cast<size_t>(B) * T * C, att = static_cast<size_t>(B) * NH * T * T;
  const size_t saved = align_up(std::max(att, cudnn_->reserve_floats(B, T)));
  const size_t workspace = align_up(std::max(kc::attention_workspace_floats(B, T, C, NH), cudnn_->workspace_floats(B, T)));
  // qkv (3), dout (1), out x2 (2), dqkv x2 (6) tokens*C each, then each engine's saved state,
  // one workspace, the lengths and the comparison result.
  const size_t floats = 12 * align_up(btc) + 2 * saved + workspace + align_up(B) + kAlignFloats;
  // The activation arena holds nothing between micro-batches, and this runs in stream order
  // after the previous one and before the next upload lands: borrow it when it is large enough
  // (it normally is: it holds a whole model's activations for this shape).
  float* scratch = nullptr;
  const bool borrowed = arena_ != nullptr && floats <= capacity_floats_;
  if (borrowed) {
    scratch = arena_;
  } else {
    const cudaError_t status = cudaMalloc(reinterpret_cast<void**>(&scratch), sizeof(float) * floats);
    if (status != cudaSuccess) {
      cudaGetLastError();
      *why = std::string("no device memory for the self-check (") + cudaGetErrorString(status) + ")";
      *retry = true;
      return false;
    }
  }
  ArenaCarver carver(scratch);
  float* qkv = carver.take(3 * btc);
  float* dout = carver.take(btc);
  float* out_cudnn = carver.take(btc);
  float* out_cublas = carver.take(btc);
  float* dqkv_cudnn = carver.take(3 * btc);
  float* dqkv_cublas = carver.take(3 * btc);
  float* saved_cudnn = carver.take(saved);
  float* saved_cublas = carver.take(saved);
  float* work = carver.take(workspace);
  int32_t* lengths_device = carver.take_ints(B);
  unsigned* result = reinterpret_cast<unsigned*>(carver.take(4));
  std::vector<int32_t> lengths(B);
  for (int b = 0; b < B; ++b) lengths[b] = b == 0 ? T : 1 + static_cast<int>((b * 7919L) % T);
  bool agree = false;
  unsigned host_result[4] = {0, 0, 0, 0};
  try {
    fill_hash_kernel<<<grid_for(3 * btc, 256), 256, 0, stream_>>>(qkv, 3 * btc, 12345u);
    fill_hash_kernel<<<grid_for(btc, 256), 256, 0, stream_>>>(dout, btc, 54321u);
    KILTER_CUDA_LAUNCH_CHECK();
    KILTER_CUDA_CHECK(cudaMemcpyAsync(lengths_device, lengths.data(), sizeof(int32_t) * B, cudaMemcpyHostToDevice, stream_));
    KILTER_CUDA_CHECK(cudaMemsetAsync(result, 0, sizeof(unsigned) * 4, stream_));
    cudnn_->forward(out_cudnn, saved_cudnn, qkv, lengths.data(), lengths_device, B, T, work);
    cudnn_->backward(dqkv_cudnn, dout, qkv, saved_cudnn, lengths.data(), lengths_device, B, T, work, false);
    kc::attention_forward(*gemm_, out_cublas, saved_cublas, qkv, lengths_device, B, T, C, NH, work);
    kc::attention_backward(*gemm_, dqkv_cublas, dout, qkv, saved_cublas, lengths_device, B, T, C, NH, work, false);
    max_difference_kernel<<<grid_for(btc, 256), 256, 0, stream_>>>(result, out_cudnn, out_cublas, btc);
    max_difference_kernel<<<grid_for(3 * btc, 256), 256, 0, stream_>>>(result + 2, dqkv_cudnn, dqkv_cublas, 3 * btc);
    KILTER_CUDA_LAUNCH_CHECK();
    KILTER_CUDA_CHECK(cudaMemcpyAsync(host_result, result, sizeof(host_result), cudaMemcpyDeviceToHost, stream_));
    KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));
    agree = true;
  } catch (const Error& e) {
    *why = std::string("self-check failed to run: ") + e.what();
    cudaStreamSynchronize(stream_);  // queued kernels may still use the scratch
    cudaGetLastError();
  }
  if (!borrowed) cudaFree(scratch);
  if (!agree) return false;
  // fp32: both engines run IEEE fp32 products; bf16: bf16 GEMMs against TF32 products.
  const float tolerance = options_.precision == "bf16" ? 5e-2f : 1e-3f;
  auto as_float = [](unsigned bits) {
    float value;
    std::memcpy(&value, &bits, sizeof(value));
    return value;
  };
  const float out_error = as_float(host_result[0]) / std::max(as_float(host_result[1]), 1e-20f);
  const float grad_error = as_float(host_result[2]) / std::max(as_float(host_result[3]), 1e-20f);
  if (!(out_error <= tolerance && grad_error <= tolerance)) {
    char text[200];
    std::snprintf(text, sizeof(text), "self-check against cuBLASLt attention: relative difference %.3g in out, %.3g in dqkv (limit %.0e)",
                  out_error, grad_error, tolerance);
    *why = text;
    return false;
  }
  return true;
#else
  (void)B;
  (void)T;
  *retry = false;
  *why = "built without cuDNN";
  return false;
#endif
}

void CudaModel::drop_graphs() {
  for (auto& entry : graphs_) {
    if (entry.second.exec != nullptr) cudaGraphExecDestroy(entry.second.exec);
    for (cudaEvent_t event : entry.second.timing)
      if (event != nullptr) cudaEventDestroy(event);
  }
  graphs_.clear();
  graphs_kept_ = graphs_dropped_ = 0;
}

std::string CudaModel::describe() const {
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, device_);
  std::string text = "cuda device " + std::to_string(device_) + " (" + prop.name + "), GEMMs " +
                     (options_.precision == "bf16" ? "bf16 tensor cores, fp32 accumulation" : "fp32") +
                     " on cuBLASLt, attention ";
#ifdef KILTER_WITH_CUDNN
  if (cudnn_) text += cudnn_->description();
#endif
  if (!cudnn_) text += "cuBLASLt + masked softmax" + (cudnn_note_.empty() ? "" : " (cuDNN: " + cudnn_note_ + ")");
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
  layout.groups.build(batch.cu_seqlens.data(), layout.pieces, cfg_.block_size,
                      batch.pos_offset.empty() ? nullptr : batch.pos_offset.data());
  // Each group's engine (cuDNN's per-shape trial and self-check run here, before any kernel of
  // this micro-batch is queued).
  const size_t num_groups = layout.groups.groups.size();
  layout.group_cudnn.assign(num_groups, 0);
  batch_cudnn_ = false;
  for (size_t g = 0; g < num_groups; ++g) {
    layout.group_cudnn[g] = cudnn_for_shape(layout.groups.groups[g].B, layout.groups.groups[g].T);
    batch_cudnn_ = batch_cudnn_ || layout.group_cudnn[g];
  }
  {
    ArenaCarver measure(nullptr);
    ensure_arena(carve(measure, nullptr, layout), layout);
    ArenaCarver carver(arena_);
    carve(carver, &acts_, layout);
  }
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

template <class Body>
void CudaModel::run_segment(int segment, const Body& body) {
  if (!options_.cuda_graphs || batch_cudnn_ || exchange_ != nullptr) {
    body();
    return;
  }
  GraphEntry& entry = graphs_[std::make_pair(layout_now_.key(), segment)];
  const int occurrence = entry.seen < 5 ? ++entry.seen : entry.seen;
  if (occurrence == 5 && !entry.decided) entry.decided = decide_graph(entry);
  if (entry.eager_only) {
    body();
    return;
  }
  if (entry.exec != nullptr) {
    if (occurrence == 4) KILTER_CUDA_CHECK(cudaEventRecord(entry.timing[2], stream_));
    KILTER_CUDA_CHECK(cudaGraphLaunch(entry.exec, stream_));
    if (occurrence == 4) KILTER_CUDA_CHECK(cudaEventRecord(entry.timing[3], stream_));
    return;
  }
  // Work for the capture engine, on its stream, ordered after the compute stream and before
  // whatever the compute stream does next.
  auto on_capture_engine = [&](const auto& work) {
    s_ = capture_stream_;
    g_ = gemm_capture_.get();
    try {
      work();
    } catch (...) {
      s_ = stream_;
      g_ = gemm_.get();
      throw;
    }
    s_ = stream_;
    g_ = gemm_.get();
  };
  if (occurrence <= 2) {
    // Eager through the capture engine, so that its cuBLASLt descriptors and algorithms are
    // chosen now and not inside the capture, and the graph uses the same ones. The second run,
    // warm, is timed against the graph's replay.
    KILTER_CUDA_CHECK(cudaEventRecord(to_capture_stream_, stream_));
    KILTER_CUDA_CHECK(cudaStreamWaitEvent(capture_stream_, to_capture_stream_, 0));
    if (occurrence == 2) {
      for (cudaEvent_t& event : entry.timing) KILTER_CUDA_CHECK(cudaEventCreate(&event));
      KILTER_CUDA_CHECK(cudaEventRecord(entry.timing[0], capture_stream_));
    }
    on_capture_engine(body);
    if (occurrence == 2) KILTER_CUDA_CHECK(cudaEventRecord(entry.timing[1], capture_stream_));
    KILTER_CUDA_CHECK(cudaEventRecord(from_capture_stream_, capture_stream_));
    KILTER_CUDA_CHECK(cudaStreamWaitEvent(stream_, from_capture_stream_, 0));
    return;
  }
  // Third occurrence: capture, instantiate, launch. A failure leaves this segment of this shape
  // eager from then on (said once) and runs it eagerly now: the captured work never ran.
  cudaGraph_t graph = nullptr;
  std::string failure;
  cudaError_t status = cudaStreamBeginCapture(capture_stream_, cudaStreamCaptureModeThreadLocal);
  if (status == cudaSuccess) {
    try {
      on_capture_engine(body);
    } catch (const std::exception& e) {
      failure = e.what();
    }
    status = cudaStreamEndCapture(capture_stream_, &graph);
    if (failure.empty() && status != cudaSuccess) failure = cudaGetErrorString(status);
    if (failure.empty()) {
      status = cudaGraphInstantiate(&entry.exec, graph, 0);
      if (status != cudaSuccess) {
        failure = cudaGetErrorString(status);
        entry.exec = nullptr;
      }
    }
    if (graph != nullptr) cudaGraphDestroy(graph);
  } else {
    failure = cudaGetErrorString(status);
  }
  if (!failure.empty()) {
    cudaGetLastError();
    entry.eager_only = true;
    ++graphs_dropped_;
    std::fprintf(stderr, "kilter: cuda backend: CUDA graph capture of segment %d for N=%d (%d pieces) failed (%s); it runs eagerly\n",
                 segment, layout_now_.N, layout_now_.pieces, failure.c_str());
    body();
    return;
  }
  KILTER_CUDA_CHECK(cudaGraphLaunch(entry.exec, stream_));
}

// Keeps the graph if its replay (occurrence 4) took at least 3% less GPU time than the warm
// eager run (occurrence 2); a tie stays eager, the simpler path. Never blocks on the timing.
bool CudaModel::decide_graph(GraphEntry& entry) {
  if (entry.eager_only || entry.exec == nullptr) return true;
  const cudaError_t ready = cudaEventQuery(entry.timing[3]);
  if (ready == cudaErrorNotReady) return false;
  KILTER_CUDA_CHECK(ready);
  float eager_ms = 0.0f, graph_ms = 0.0f;
  KILTER_CUDA_CHECK(cudaEventElapsedTime(&eager_ms, entry.timing[0], entry.timing[1]));
  KILTER_CUDA_CHECK(cudaEventElapsedTime(&graph_ms, entry.timing[2], entry.timing[3]));
  for (cudaEvent_t& event : entry.timing) {
    cudaEventDestroy(event);
    event = nullptr;
  }
  if (graph_ms < 0.97f * eager_ms) {
    ++graphs_kept_;
    return true;
  }
  KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the graph may still be queued
  cudaGraphExecDestroy(entry.exec);
  entry.exec = nullptr;
  entry.eager_only = true;
  ++graphs_dropped_;
  return true;
}

void CudaModel::attention_forward_groups(const BlockActivations& a) {
  const int C = cfg_.n_embd, NH = cfg_.n_head;
  const Activations& x = acts_;
  const model::AttentionGroups& groups = layout_now_.groups;
  kc::gather_padded_rows(x.padded_qkv, a.qkv, x.padded_token, groups.padded_rows(), 3 * C, s_);
  for (size_t g = 0; g < groups.groups.size(); ++g) {
    const model::AttentionGroup& group = groups.groups[g];
    float* out = x.padded_io + group.first_row * C;
    float* saved = a.att + x.saved_offset[g];
    const float* qkv = x.padded_qkv + group.first_row * 3 * C;
    const int32_t* lengths = x.lengths + group.first_length;
#ifdef KILTER_WITH_CUDNN
    if (layout_now_.group_cudnn[g]) {
      cudnn_->forward(out, saved, qkv, groups.lengths.data() + group.first_length, lengths, group.B, group.T,
                      x.attention_workspace);
      continue;
    }
#endif
    kc::attention_forward(*g_, out, saved, qkv, lengths, group.B, group.T, C, NH, x.attention_workspace);
  }
  kc::scatter_padded_rows(a.atty, x.padded_io, x.padded_token, groups.padded_rows(), C, /*accumulate=*/false, s_);
}

void CudaModel::attention_backward_groups(const BlockActivations& a) {
  const int C = cfg_.n_embd, NH = cfg_.n_head;
  const Activations& x = acts_;
  const model::AttentionGroups& groups = layout_now_.groups;
  kc::gather_padded_rows(x.padded_qkv, a.qkv, x.padded_token, groups.padded_rows(), 3 * C, s_);
  kc::gather_padded_rows(x.padded_io, x.datty, x.padded_token, groups.padded_rows(), C, s_);
  for (size_t g = 0; g < groups.groups.size(); ++g) {
    const model::AttentionGroup& group = groups.groups[g];
    float* dqkv = x.padded_dqkv + group.first_row * 3 * C;
    const float* dout = x.padded_io + group.first_row * C;
    float* saved = a.att + x.saved_offset[g];
    const float* qkv = x.padded_qkv + group.first_row * 3 * C;
    const int32_t* lengths = x.lengths + group.first_length;
#ifdef KILTER_WITH_CUDNN
    if (layout_now_.group_cudnn[g]) {
      cudnn_->backward(dqkv, dout, qkv, saved, groups.lengths.data() + group.first_length, lengths, group.B, group.T,
                       x.attention_workspace, /*accumulate=*/false);
      continue;
    }
#endif
    kc::attention_backward(*g_, dqkv, dout, qkv, saved, lengths, group.B, group.T, C, NH, x.attention_workspace,
                           /*accumulate=*/false);
  }
  kc::scatter_padded_rows(x.dqkv, x.padded_dqkv, x.padded_token, groups.padded_rows(), 3 * C, /*accumulate=*/false,
                          s_);
}

void CudaModel::attention_forward_layer(int layer, const BlockActivations& a) {
  if (exchange_ == nullptr) {
    attention_forward_groups(a);
    return;
  }
  // The exchange reads qkv from its own stream or the host side: the rows must be final.
  KILTER_CUDA_CHECK(cudaStreamSynchronize(s_));
  exchange_->forward_send(layer, a.qkv);
  attention_forward_groups(a);
  exchange_->forward_wait(layer);
  attention_forward_prefixed(layer, a, a.atty);
}

void CudaModel::attention_forward_prefixed(int layer, const BlockActivations& a, float* out) {
  const int C = cfg_.n_embd, NH = cfg_.n_head;
  const std::vector<PrefixedPiece>& prefixed = layout_now_.prefixed;
  for (size_t k = 0; k < prefixed.size(); ++k) {
    const PrefixedPiece& part = prefixed[k];
    kc::attention_prefix_forward(*g_, out + static_cast<size_t>(part.first_row) * C,
                                 a.att + acts_.prefixed_saved_offset[k],
                                 a.qkv + static_cast<size_t>(part.first_row) * 3 * C,
                                 exchange_->prefix_kv(layer, part.piece), part.offset, part.len, C, NH,
                                 acts_.attention_workspace);
  }
}

void CudaModel::attention_backward_layer(int layer, const BlockActivations& a) {
  if (exchange_ == nullptr) {
    attention_backward_groups(a);
    return;
  }
  const int C = cfg_.n_embd, NH = cfg_.n_head;
  const Activations& x = acts_;
  // The later parts first (their rows of dqkv are not written by the groups' scatter: zero them),
  // then their prefixes' dK/dV go back while the groups run.
  const std::vector<PrefixedPiece>& prefixed = layout_now_.prefixed;
  for (size_t k = 0; k < prefixed.size(); ++k) {
    const PrefixedPiece& part = prefixed[k];
    float* dqkv = x.dqkv + static_cast<size_t>(part.first_row) * 3 * C;
    KILTER_CUDA_CHECK(cudaMemsetAsync(dqkv, 0, sizeof(float) * part.len * 3 * C, s_));
    kc::attention_prefix_backward(*g_, dqkv, exchange_->prefix_dkv(layer, part.piece),
                                  x.datty + static_cast<size_t>(part.first_row) * C,
                                  a.qkv + static_cast<size_t>(part.first_row) * 3 * C,
                                  exchange_->prefix_kv(layer, part.piece), a.att + x.prefixed_saved_offset[k],
                                  part.offset, part.len, C, NH, x.attention_workspace);
  }
  KILTER_CUDA_CHECK(cudaStreamSynchronize(s_));
  exchange_->backward_send(layer);
  attention_backward_groups(a);
  // The groups' scatter overwrites their rows of dqkv: it must be done before the exchange adds.
  KILTER_CUDA_CHECK(cudaStreamSynchronize(s_));
  exchange_->backward_wait_add(layer, x.dqkv);
}

void CudaModel::attention_recompute(int layer, const BlockActivations& a, float* out) {
  BlockActivations into = a;
  into.atty = out;
  attention_forward_groups(into);
  attention_forward_prefixed(layer, a, out);
}

void CudaModel::block_recompute(int l) {
  const int C = cfg_.n_embd;
  const int N = layout_now_.N;
  const BlockTensors p = block_tensors(params_, l);
  const BlockActivations& a = acts_.blocks[l];
  const float* residual = l == 0 ? acts_.encoded : acts_.blocks[l - 1].residual3;
  // The forward's kernels in its order, but for the output projection (residual3 is kept).
  kc::layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, residual, p.ln1_w, p.ln1_b, N, C, s_);
  kc::matmul_forward(*g_, a.qkv, a.ln1, p.qkv_w, p.qkv_b, N, C, 3 * C);
  attention_recompute(l, a, a.atty);
  kc::matmul_forward_residual(*g_, a.residual2, a.atty, p.attproj_w, p.attproj_b, residual, N, C, C);
  kc::layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2, p.ln2_w, p.ln2_b, N, C, s_);
  kc::matmul_forward(*g_, a.fch, a.ln2, p.fc_w, p.fc_b, N, C, 4 * C);
  kc::gelu_forward(a.fch_gelu, a.fch, static_cast<size_t>(N) * 4 * C, s_);
}

void CudaModel::forward_kernels() {
  const int C = cfg_.n_embd, V = cfg_.vocab_size;
  const int N = layout_now_.N;
  kc::encoder_forward(acts_.encoded, acts_.inputs, params_ + offsets_.wte, params_ + offsets_.wpe, acts_.cu_seqlens,
                      layout_now_.pieces, N, C, s_, acts_.pos_offset);
  const float* residual = acts_.encoded;
  for (int l = 0; l < cfg_.n_layer; ++l) {
    const BlockTensors p = block_tensors(params_, l);
    const BlockActivations& a = acts_.blocks[l];
    kc::layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, residual, p.ln1_w, p.ln1_b, N, C, s_);
    kc::matmul_forward(*g_, a.qkv, a.ln1, p.qkv_w, p.qkv_b, N, C, 3 * C);
    attention_forward_layer(l, a);
    kc::matmul_forward_residual(*g_, a.residual2, a.atty, p.attproj_w, p.attproj_b, residual, N, C, C);
    kc::layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2, p.ln2_w, p.ln2_b, N, C, s_);
    kc::matmul_forward(*g_, a.fch, a.ln2, p.fc_w, p.fc_b, N, C, 4 * C);
    kc::gelu_forward(a.fch_gelu, a.fch, static_cast<size_t>(N) * 4 * C, s_);
    kc::matmul_forward_residual(*g_, a.residual3, a.fch_gelu, p.fcproj_w, p.fcproj_b, a.residual2, N, 4 * C, C);
    residual = a.residual3;
  }
  kc::layernorm_forward(acts_.lnf, acts_.lnf_mean, acts_.lnf_rstd, residual, params_ + offsets_.lnf_w,
                        params_ + offsets_.lnf_b, N, C, s_);
  // Head: every row's logits (rows without a target get a zero gradient; the CPU gathers target
  // rows instead, which gives the same loss and gradients), then the loss and dlogits in place,
  // scaled by the device-side loss scale.
  kc::matmul_forward(*g_, acts_.logits, acts_.lnf, params_ + offsets_.wte, nullptr, N, C, V);
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
  run_segment(0, [&] { forward_kernels(); });
  finish_forward();
  return read_loss();
}

void CudaModel::backward_block_kernels(int l) {
  const int C = cfg_.n_embd;
  const int N = layout_now_.N;
  float* scratch = acts_.column_scratch;
  const Activations& a = acts_;
  const BlockTensors p = block_tensors(params_, l);
  const BlockTensors g = block_tensors(grads_, l);
  const BlockActivations& act = a.blocks[l];
  const float* residual_in = l == 0 ? a.encoded : a.blocks[l - 1].residual3;
  if (recompute_ == Recompute::block) block_recompute(l);
  if (recompute_ == Recompute::gelu) kc::gelu_forward(act.fch_gelu, act.fch, static_cast<size_t>(N) * 4 * C, s_);
  kc::matmul_backward(*g_, a.dfch, g.fcproj_w, g.fcproj_b, a.dresidual, act.fch_gelu, p.fcproj_w, N, 4 * C, C,
                      scratch, false);
  kc::gelu_backward(a.dfch, act.fch, a.dfch, static_cast<size_t>(N) * 4 * C, s_, /*accumulate=*/false);
  kc::matmul_backward(*g_, a.dln, g.fc_w, g.fc_b, a.dfch, act.ln2, p.fc_w, N, C, 4 * C, scratch, false);
  kc::layernorm_backward(a.dresidual, g.ln2_w, g.ln2_b, a.dln, act.residual2, p.ln2_w, act.ln2_mean, act.ln2_rstd,
                         N, C, scratch, s_);
  kc::matmul_backward(*g_, a.datty, g.attproj_w, g.attproj_b, a.dresidual, act.atty, p.attproj_w, N, C, C, scratch,
                      false);
  // dln is free from the layernorm backward above until the QKV projection's backward: the
  // recomputed attention output (equal to act.atty, not needed) lands there.
  if (recompute_ == Recompute::attention) attention_recompute(l, act, a.dln);
  attention_backward_layer(l, act);
  kc::matmul_backward(*g_, a.dln, g.qkv_w, g.qkv_b, a.dqkv, act.ln1, p.qkv_w, N, C, 3 * C, scratch, false);
  kc::layernorm_backward(a.dresidual, g.ln1_w, g.ln1_b, a.dln, residual_in, p.ln1_w, act.ln1_mean, act.ln1_rstd, N,
                         C, scratch, s_);
}

double CudaModel::forward_backward(const Batch& batch, float loss_scale, const model::GradReadyFn& on_ready) {
  upload_batch(batch, loss_scale);
  const int N = batch.N, C = cfg_.n_embd, V = cfg_.vocab_size;
  const size_t NC = static_cast<size_t>(N) * C;
  const Activations& a = acts_;
  run_segment(0, [&] { forward_kernels(); });
  finish_forward();
  if (backward_start_hook_) backward_start_hook_();

  // LM head (tied to wte): dlnf = dlogits @ wte; dwte += dlogits^T @ lnf; then ln_f.
  run_segment(1, [&] {
    kc::matmul_backward(*g_, a.dln, grads_ + offsets_.wte, nullptr, a.logits, a.lnf, params_ + offsets_.wte, N, C, V,
                        a.column_scratch, /*accumulate_dinp=*/false);
    KILTER_CUDA_CHECK(cudaMemsetAsync(a.dresidual, 0, sizeof(float) * NC, s_));
    kc::layernorm_backward(a.dresidual, grads_ + offsets_.lnf_w, grads_ + offsets_.lnf_b, a.dln,
                           a.blocks[cfg_.n_layer - 1].residual3, params_ + offsets_.lnf_w, a.lnf_mean, a.lnf_rstd, N,
                           C, a.column_scratch, s_);
  });
  // Reported ranges are final in stream order: the NCCL communicator waits on this stream.
  if (on_ready) on_ready(offsets_.lnf_w, layout_.padded_size - offsets_.lnf_w);

  for (int l = cfg_.n_layer - 1; l >= 0; --l) {
    run_segment(2 + (cfg_.n_layer - 1 - l), [&] { backward_block_kernels(l); });
    if (on_ready) on_ready(offsets_.block[l], offsets_.block_floats);
  }

  run_segment(cfg_.n_layer + 2, [&] {
    kc::encoder_backward(grads_ + offsets_.wte, grads_ + offsets_.wpe, a.dresidual, a.inputs, a.cu_seqlens,
                         layout_now_.pieces, N, layout_now_.max_len, C, s_, a.pos_offset);
  });
  if (on_ready) on_ready(offsets_.wte, offsets_.block[0] - offsets_.wte);
  return read_loss();
}

void CudaModel::init_params(uint64_t seed) {
  std::vector<float> host(layout_.padded_size, 0.0f);
  model::init_gpt2_params(host.data(), layout_, cfg_, seed);
  cuda_device_index();
  KILTER_CUDA_CHECK(cudaMemcpyAsync(params_, host.data(), sizeof(float) * layout_.padded_size, cudaMemcpyHostToDevice,
                                    stream_));
  if (moments_held_ > 0) KILTER_CUDA_CHECK(cudaMemsetAsync(adam_m_, 0, sizeof(float) * 2 * moments_held_, stream_));
  KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));  // `host` goes out of scope
}

void CudaModel::set_params(const float* host) {
  cuda_device_index();
  KILTER_CUDA_CHECK(cudaMemcpyAsync(params_, host, sizeof(float) * layout_.num_params, cudaMemcpyHostToDevice, stream_));
  KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaModel::get_params(float* host) const {
  cuda_device_index();
  KILTER_CUDA_CHECK(cudaMemcpyAsync(host, params_, sizeof(float) * layout_.num_params, cudaMemcpyDeviceToHost, stream_));
  KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

size_t CudaModel::owned_floats() const {
  size_t total = 0;
  for (const model::ParamRange& r : owned_) total += r.count;
  return total;
}

void CudaModel::ensure_moments() {
  const size_t total = owned_floats();
  if (moments_held_ == total && adam_m_ != nullptr) return;
  release_moments();
  float* moments = nullptr;
  const cudaError_t status = cudaMalloc(reinterpret_cast<void**>(&moments), sizeof(float) * 2 * std::max<size_t>(total, 1));
  if (status != cudaSuccess) {
    cudaGetLastError();
    KILTER_FAIL("cuda backend: cannot allocate the AdamW moments (" << (sizeof(float) * 2 * total >> 20) << " MiB) on device "
                << device_ << " (" << cudaGetErrorString(status) << "); set train.shard_optimizer = true to hold "
                << "1/world_size of them per rank, or use more ranks");
  }
  KILTER_CUDA_CHECK(cudaMemsetAsync(moments, 0, sizeof(float) * 2 * total, stream_));
  adam_m_ = moments;
  adam_v_ = moments + total;
  moments_held_ = total;
}

void CudaModel::release_moments() {
  if (adam_m_ == nullptr) return;
  KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));
  cudaFree(adam_m_);
  adam_m_ = adam_v_ = nullptr;
  moments_held_ = 0;
}

void CudaModel::get_optimizer_state(float* m, float* v) const {
  KILTER_CHECK(!sharded_, "CudaModel::get_optimizer_state: the optimizer is sharded; use get_optimizer_shard");
  get_optimizer_shard(m, v, 0, layout_.num_params);
}

void CudaModel::get_optimizer_shard(float* m, float* v, size_t first, size_t count) const {
  const size_t total = owned_floats();
  KILTER_CHECK(first + count <= total, "CudaModel::get_optimizer_shard: [" << first << ", " << first + count
                                                                           << ") beyond the " << total << " held");
  if (adam_m_ == nullptr) {  // no step taken yet
    std::fill(m, m + count, 0.0f);
    std::fill(v, v + count, 0.0f);
    return;
  }
  cuda_device_index();
  KILTER_CUDA_CHECK(cudaMemcpyAsync(m, adam_m_ + first, sizeof(float) * count, cudaMemcpyDeviceToHost, stream_));
  KILTER_CUDA_CHECK(cudaMemcpyAsync(v, adam_v_ + first, sizeof(float) * count, cudaMemcpyDeviceToHost, stream_));
  KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

// m and v: num_params floats each (the full moments, as a checkpoint holds them); this rank
// keeps its owned ranges of them.
void CudaModel::set_optimizer_state(const float* m, const float* v) {
  cuda_device_index();
  ensure_moments();
  size_t dst = 0;
  for (const model::ParamRange& r : owned_) {
    // Only the first num_params floats exist in m and v; the padding's moments stay 0.
    const size_t end = std::min(r.offset + r.count, layout_.num_params);
    if (r.offset < end) {
      KILTER_CUDA_CHECK(cudaMemcpyAsync(adam_m_ + dst, m + r.offset, sizeof(float) * (end - r.offset),
                                        cudaMemcpyHostToDevice, stream_));
      KILTER_CUDA_CHECK(cudaMemcpyAsync(adam_v_ + dst, v + r.offset, sizeof(float) * (end - r.offset),
                                        cudaMemcpyHostToDevice, stream_));
    }
    dst += r.count;
  }
  KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaModel::shard_optimizer(const std::vector<model::ParamRange>& owned) {
  for (const model::ParamRange& r : owned)
    KILTER_CHECK(r.offset + r.count <= layout_.padded_size, "CudaModel::shard_optimizer: range [" << r.offset << ", "
                                                                << r.offset + r.count << ") beyond the buffer ("
                                                                << layout_.padded_size << ")");
  cuda_device_index();
  // Keep what is held for the new ranges (a resume that loaded the full moments first): through
  // the host, once, at setup.
  std::vector<float> held_m, held_v;
  const std::vector<model::ParamRange> held_ranges = owned_;
  if (adam_m_ != nullptr) {
    held_m.resize(moments_held_);
    held_v.resize(moments_held_);
    get_optimizer_shard(held_m.data(), held_v.data(), 0, moments_held_);
  }
  release_moments();
  owned_ = owned;
  sharded_ = true;
  if (held_m.empty()) return;  // nothing held yet: allocated on first use
  std::vector<float> m(owned_floats(), 0.0f), v(m.size(), 0.0f);
  model::copy_range_overlap(held_ranges, held_m.data(), owned_, m.data());
  model::copy_range_overlap(held_ranges, held_v.data(), owned_, v.data());
  ensure_moments();
  KILTER_CUDA_CHECK(cudaMemcpyAsync(adam_m_, m.data(), sizeof(float) * m.size(), cudaMemcpyHostToDevice, stream_));
  KILTER_CUDA_CHECK(cudaMemcpyAsync(adam_v_, v.data(), sizeof(float) * v.size(), cudaMemcpyHostToDevice, stream_));
  KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaModel::zero_grads() {
  cuda_device_index();
  KILTER_CUDA_CHECK(cudaMemsetAsync(grads_, 0, sizeof(float) * layout_.padded_size, stream_));
}

double CudaModel::grad_norm_squared() {
  cuda_device_index();
  // Per owned range (a deterministic device sum each), then over the ranges on the host in order
  // (unsharded: one range, the same sum as ever).
  const size_t ranges = owned_.size();
  if (ranges > range_norms_capacity_) {
    KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));
    cudaFree(range_norms_);
    range_norms_ = nullptr;
    range_norms_capacity_ = 0;
    KILTER_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&range_norms_), sizeof(double) * ranges));
    range_norms_capacity_ = ranges;
  }
  // A range wholly in the padding has no gradient: its sum stays 0.
  KILTER_CUDA_CHECK(cudaMemsetAsync(range_norms_, 0, sizeof(double) * ranges, stream_));
  for (size_t i = 0; i < ranges; ++i) {
    const size_t end = std::min(owned_[i].offset + owned_[i].count, layout_.num_params);
    if (owned_[i].offset < end)
      kc::sum_of_squares_async(range_norms_ + i, grads_ + owned_[i].offset, end - owned_[i].offset, loss_device_ + 1,
                               stream_);
  }
  std::vector<double> norms(ranges);
  KILTER_CUDA_CHECK(cudaMemcpyAsync(norms.data(), range_norms_, sizeof(double) * ranges, cudaMemcpyDeviceToHost, stream_));
  KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));
  double total = 0.0;
  for (double norm : norms) total += norm;
  return total;
}

void CudaModel::adamw_step(const model::AdamWParams& p) {
  cuda_device_index();
  ensure_moments();
  // Every tensor's part inside every owned range (unsharded: every tensor whole), one launch per
  // run of consecutive parts that share the decay flag (the layout alternates 2-D weights and 1-D
  // biases, so runs are short, but this keeps the formula per tensor exact).
  size_t base = 0;
  for (const model::ParamRange& r : owned_) {
    size_t run_lo = 0, run_hi = 0;
    bool run_decay = false;
    auto flush = [&] {
      if (run_hi > run_lo) {
        const size_t k = base + (run_lo - r.offset);
        kc::adamw_update(params_ + run_lo, grads_ + run_lo, adam_m_ + k, adam_v_ + k, run_hi - run_lo, p.lr, p.beta1,
                         p.beta2, p.eps, run_decay ? p.weight_decay : 0.0f, p.grad_scale, p.t, stream_);
      }
      run_lo = run_hi = 0;
    };
    for (const model::ParamTensor& tensor : layout_.tensors) {
      const size_t lo = std::max(r.offset, tensor.offset), hi = std::min(r.offset + r.count, tensor.offset + tensor.size);
      if (lo >= hi) continue;
      if (run_hi > run_lo && (tensor.decay != run_decay || lo != run_hi)) flush();
      if (run_hi == run_lo) run_lo = lo, run_decay = tensor.decay;
      run_hi = hi;
    }
    flush();
    base += r.count;
  }
}

}  // namespace

std::unique_ptr<model::Model> make_cuda_model(const GPTConfig& cfg, size_t pad_multiple,
                                              const model::BackendOptions& options) {
  return std::make_unique<CudaModel>(cfg, pad_multiple, options);
}

std::unique_ptr<model::Model> make_cuda_model(const GPTConfig& cfg, size_t pad_multiple, const std::string& precision) {
  model::BackendOptions options;
  options.precision = precision;
  return make_cuda_model(cfg, pad_multiple, options);
}

}  // namespace kilter::backend
