// The CudaModel class (cuda_model.h makes it): shared by the files that implement it, one concept
// each: cuda_model.cu (the model: set-up, the fp32-storage forward and backward kernels in
// CpuModel's order), cuda_optimizer.cu (AdamW, the norm, the moments, the bf16 weight copy),
// cuda_datapath_bf16.cu (the bf16-storage datapath,
// train.bf16_storage), cuda_self_check.cu (that datapath's runtime check against the CPU oracle),
// cuda_arena.cu (the activation arena of either datapath), cuda_graphs.cu (the CUDA-graph cache)
// and cuda_attention_choice.cu (which attention engine runs a shape, and its self-check). CUDA
// C++: only .cu files include it. cuda_attention_sdpa.cu: the cuDNN SDPA path of both datapaths.
#pragma once
#include <cuda_runtime.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "io/base/cuda_common.h"
#include "lib/backend/cuda_memory.h"
#include "lib/backend/cuda_model.h"
#include "lib/model/cuda_ops.h"
#include "lib/backend/model_base.h"
#include "lib/model/attention_groups.h"
#include "lib/model/block_names.h"
#include "lib/model/block_schedule.h"
#include "lib/model/layout.h"

namespace kilter::model {
struct SdpaCall;
}

namespace kilter::backend {

// The cuDNN SDPA path's state (cuda_attention_sdpa.cu, where it is complete).
struct SdpaState;
struct SdpaStateDeleter {
  void operator()(SdpaState* state) const;
};

using model::Batch;
using model::ModelSpec;
namespace kc = model::cuda;

constexpr size_t kAlignFloats = 64;  // 256-byte alignment of every arena slice

inline size_t align_up(size_t n) { return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }

// Deterministic pseudo-random values in [-1, 1) from an integer hash of the index, on the host or
// the device: the inputs of the attention engines' self-checks.
__host__ __device__ inline float hash_unit(size_t i, uint32_t seed) {
  uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed ^ static_cast<uint32_t>(i >> 32);
  h ^= h >> 16;
  h *= 0x7feb352du;
  h ^= h >> 15;
  h *= 0x846ca68bu;
  h ^= h >> 16;
  return static_cast<float>(h >> 8) * (2.0f / 16777216.0f) - 1.0f;
}

// The engines' self-checks compare on the device (cuda_attention_choice.cu): result[0] and
// result[1] (zeroed first) receive max |a - b| and max |b| over n floats, as float bits (a NaN
// difference orders above every finite one); relative_difference_of reads the ratio back from
// the host copy of the pair.
void max_difference_on_device(unsigned* result, const float* a, const float* b, size_t n, cudaStream_t stream);
float relative_difference_of(const unsigned* result);

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

class CudaModel final : public ModelBase {
 public:
  CudaModel(const ModelSpec& cfg, size_t pad_multiple, const model::BackendOptions& options);
  ~CudaModel() override;

  std::string backend_name() const override { return "cuda"; }
  std::string describe() const override;

  void init_params(uint64_t seed) override;
  void set_params(const float* host) override;
  void get_params(float* host) const override;

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
  // Fully sharded parameters (train.shard = parameters): the hooks are called in CpuModel's order,
  // with the next unit's gather asked for early (prefetch) so that it overlaps this unit's kernels.
  bool supports_param_units() const override { return true; }
  void set_param_units(model::ParamUnitHooks* hooks) override;

 private:
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
    float* dact = nullptr;  // llama: SwiGLU's output gradient (N, ffn_width)
  };
  // The bf16-storage datapath's slices (cuda_datapath_bf16.cu): every activation bf16 but the
  // norms' statistics, laid out from the same activation layout; the ints stay in Activations.
  struct BlockBf16 {
    kc::bf16 *ln1 = nullptr, *qkv = nullptr, *atty = nullptr, *att = nullptr, *residual2 = nullptr;
    kc::bf16 *ln2 = nullptr, *fch = nullptr, *fch_act = nullptr, *residual3 = nullptr;
    float *ln1_mean = nullptr, *ln1_rstd = nullptr, *ln2_mean = nullptr, *ln2_rstd = nullptr;
    float* stats = nullptr;  // a batch on SDPA: cuDNN's Stats (N x n_head) in att's slice; else null
  };
  struct ActivationsBf16 {
    kc::bf16* encoded = nullptr;
    std::vector<BlockBf16> blocks;  // att: the groups' saved softmax, group after group, then later parts'
    kc::bf16* lnf = nullptr;
    float *lnf_mean = nullptr, *lnf_rstd = nullptr;
    kc::bf16* projection = nullptr;  // a Linear's output before the fused residual add and norm
    kc::bf16* logits = nullptr;      // one chunk of the classifier: classifier_rows x vocab_padded
    int classifier_rows = 0;
    float* row_losses = nullptr;     // N
    float* dresidual = nullptr;      // the residual stream's gradient, fp32
    kc::bf16 *dresidual_bf16 = nullptr, *dln = nullptr, *datty = nullptr, *dqkv = nullptr;
    kc::bf16 *dfch = nullptr, *dact = nullptr;
    kc::bf16 *padded_qkv = nullptr, *padded_io = nullptr, *padded_dqkv = nullptr;
    void* attention_workspace = nullptr;
    float* column_scratch = nullptr;
    float *exchange_qkv = nullptr, *exchange_dqkv = nullptr;  // fp32 rows for the K/V exchange (cut pieces)
    // A batch on SDPA with later parts: their staged K/V rows and those rows' dK/dV (kv_width wide).
    kc::bf16 *sdpa_staged = nullptr, *sdpa_staged_grad = nullptr;
    std::vector<size_t> saved_offset, prefixed_saved_offset;  // in bf16 elements
  };
  // A later part of a cut piece in the current micro-batch.
  struct PrefixedPiece {
    int piece = 0, first_row = 0, offset = 0, len = 0;
  };
  // The current micro-batch's layout (host side).
  struct Layout {
    int N = 0, pieces = 0, max_len = 0;  // max_len: rows of dwpe touched (max offset + length)
    bool exchange = false;               // the batch has cut pieces (bf16 storage stages their K/V)
    model::AttentionGroups groups;       // the pieces without a prefix
    std::vector<PrefixedPiece> prefixed;
    std::vector<char> group_cudnn;  // per group: runs on cuDNN
    // bf16 storage with the batch on SDPA: no groups' softmax, padded rows or group workspace, but
    // cuDNN's Stats per layer and the later parts' staged K/V rows (sdpa_staged_rows of them).
    bool sdpa = false;
    int sdpa_staged_rows = 0;
    std::vector<int32_t> key() const;  // N, pieces, max_len, then the groups' (B,T)
  };

  // RoPE (llama) in place on the q and k heads of the micro-batch's q|k|v rows (or their
  // gradients: its backward); fp32 or bf16 rows.
  template <typename T>
  void rope(T* rows, bool backward) {
    if (backward)
      kc::rope_backward(rows, acts_.cu_seqlens, acts_.pos_offset, layout_now_.pieces, layout_now_.N, cfg_.n_head,
                        cfg_.kv_heads(), cfg_.head_dim(), rope_cos_, rope_sin_, s_);
    else
      kc::rope_forward(rows, acts_.cu_seqlens, acts_.pos_offset, layout_now_.pieces, layout_now_.N, cfg_.n_head,
                       cfg_.kv_heads(), cfg_.head_dim(), rope_cos_, rope_sin_, s_);
  }
  // Lays out every activation for a micro-batch layout; returns the floats used. The same
  // function measures (null base) and assigns, so they cannot disagree.
  size_t carve(ArenaCarver& carver, Activations* acts, const Layout& layout) const;
  // The bf16 datapath's layout (into bacts, the ints into acts); the same contract.
  size_t carve_bf16(ArenaCarver& carver, ActivationsBf16* bacts, Activations* acts, const Layout& layout) const;
  // Measures the current datapath's layout, grows the arena to it and assigns acts_ (and bacts_).
  void lay_out_arena(const Layout& layout);
  void ensure_arena(size_t floats, const Layout& layout);
  // The block schedule's op tables of the two datapaths (cuda_model.cu, cuda_datapath_bf16.cu),
  // made per segment over the arena's current slices; the schedule makes the K/V exchange's calls.
  class Fp32Ops;
  class Bf16Ops;
  model::BlockSchedule schedule_;
  model::BlockMemory memory_;  // the fp32 datapath's slices, as Fp32Ops resolves the names
  // Attention of one block over the current layout's groups (gather, engine, scatter), output
  // rows into a.atty.
  void attention_forward_groups(const BlockActivations& a);
  void attention_backward_groups(const BlockActivations& a);
  // The later parts' attention of layer `layer` against their prefixes (exchange_->prefix_kv),
  // output rows into `out`, saved state into a.att; the backward's rows of dqkv and their
  // prefixes' dK/dV (into the exchange).
  void attention_forward_prefixed(int layer, const BlockActivations& a, float* out);
  void attention_backward_prefixed(int layer, const BlockActivations& a);
  bool cudnn_for_shape(int B, int T);
  // The cuDNN SDPA path (cuda_attention_sdpa.cu): train.attention = sdpa, or auto in bf16. The
  // constructor calls sdpa_init; upload_batch calls sdpa_for_batch, which plans the micro-batch
  // and decides each new shape bucket once (graphs, trial run, self-check against cuBLASLt);
  // when it returns true the layers' attention runs through sdpa_forward_layer/sdpa_backward_layer
  // (the schedule's pieces: the whole pieces, then the later parts; all, both).
  void sdpa_init();
  bool sdpa_for_batch(const Batch& batch);
  bool sdpa_bucket_usable(const model::SdpaCall& call);
  // No device memory for SDPA's `what`: false (this micro-batch on the other engines) with one
  // warning per `what` under auto; an error naming train.attention under sdpa.
  bool sdpa_short_of_memory(const std::string& what);

 public:
  model::EngineBuildStats engine_build_stats() const override;

 private:
  bool sdpa_agrees(const model::SdpaCall& call, std::string* why, bool* retry);
  void sdpa_forward_layer(int layer, const BlockActivations& a, float* out, model::AttentionPieces which);
  void sdpa_backward_layer(int layer, const BlockActivations& a, model::AttentionPieces which);
  // The same on the bf16-storage datapath's rows (its op table's attention entries, for a batch on
  // SDPA): out (N, C) bf16, Stats in a.stats, later parts staged in the arena.
  void sdpa_forward_bf16(int layer, const BlockBf16& a, kc::bf16* out, model::AttentionPieces which);
  void sdpa_backward_bf16(int layer, const BlockBf16& a, model::AttentionPieces which);
  int sdpa_staged_rows() const;          // the current plan's staged K/V rows (later parts)
  std::string sdpa_description() const;  // "" when SDPA was not asked for
  // Runs both attention engines on one pseudo-random problem of this shape (ragged rows,
  // forward and backward) and compares them: code that has never met a device must prove
  // itself before a run trusts it.
  bool cudnn_agrees(int B, int T, std::string* why, bool* retry);
  // Uploads the batch and sets the loss scale read by the cross-entropy kernel.
  void upload_batch(const Batch& batch, float dloss_scale);
  // Kernels of the forward pass (the embeddings, the blocks through the schedule) and the head:
  // logits, loss (into loss_device_, copied to the host asynchronously) and dlogits in place.
  void forward_kernels();
  void head_backward();  // the head's gradients into dln, then ln_f's backward
  // ---- sharded parameters (set_param_units) -------------------------------------------------
  model::ParamUnitHooks* units_ = nullptr;  // null: every parameter is always there
  bool bf16_copy_borrowed_ = false;        // params_bf16_ is the hooks' (not freed here)
  std::vector<model::ParamRange> unit_ranges_;
  // need(unit); a unit gathered just now refreshes its part of the bf16 working copy.
  void unit_needed(int unit);
  // The forward schedule's weights_needed(layer): the unit after block layer - 1 (block `layer`, or
  // the final norm) now, the one after it prefetched, block layer - 2's released.
  void forward_units(int layer);
  // ---- the bf16-storage datapath (cuda_datapath_bf16.cu) --------------------------------------
  bool bf16_storage_ = false;          // decided at construction (train.bf16_storage)
  std::string storage_note_;           // why bf16 storage is off, or how it was checked, for describe()
  ActivationsBf16 bacts_;
  kc::bf16* params_bf16_ = nullptr;    // the working copy of every parameter (AdamW writes it)
  kc::bf16* head_bf16_ = nullptr;      // the head's copy with its vocabulary padded (vocab_padded_ rows)
  int vocab_padded_ = 0;               // the vocabulary rounded up to a multiple of 128
  size_t score_budget_ = kAttentionScoreBudgetFloats;  // fp32 attention scores of one chunk (floats)
  size_t classifier_bytes_ = kClassifierChunkBytes;    // one chunk of bf16 logits
  const kc::bf16* working(const float* param) const {
    return param == nullptr ? nullptr : params_bf16_ + (param - params_);
  }
  void refresh_working_copy();  // params_bf16_ and head_bf16_ from params_
  // Sets bf16_storage_ from train.precision and train.bf16_storage (auto: the self-check below).
  void choose_storage();
  void forward_kernels_bf16(bool with_loss);
  void head_backward_bf16();
  void bf16_ops_backward(int layer);  // the schedule's backward of block `layer` on Bf16Ops
  void add_exchange_dqkv_bf16(int layer);  // the K/V exchange's dK/dV of this batch's rows, into bacts_.dqkv

 public:
  // The runtime check of train.bf16_storage = auto (cuda_self_check.cu): one forward, backward,
  // AdamW step and forward_loss of a small model of this architecture through the bf16 datapath on
  // this device, against the CPU oracle (CpuModel with bf16_storage) from the same weights. Empty
  // when they agree within its tolerance, else what differed (or failed).
  static std::string bf16_storage_self_check(const ModelSpec& cfg, const model::BackendOptions& options);
  // Smaller chunks than the defaults (the self-check and the tests: several chunks on small shapes).
  void set_chunk_budgets(size_t score_floats, size_t classifier_bytes) {
    score_budget_ = score_floats;
    classifier_bytes_ = classifier_bytes;
  }
  bool bf16_storage() const { return bf16_storage_; }
  void params_changed() override {
    if (bf16_storage_) refresh_working_copy();
  }

 private:
  // Runs one segment's kernels eagerly, or as a CUDA graph of this shape (see top of file).
  void run_segment(int segment, const std::function<void()>& body);
  void finish_forward();  // records loss_ready_ after the forward segment
  double read_loss();

  model::BackendOptions options_;
  // train.recompute: what the forward keeps per layer (docs/model.md, "Activation recomputation").
  // gelu: the GELU output lives in one slice shared by the layers and is recomputed from fch before
  // the MLP projection's backward; attention: the attention's saved state (softmax or cuDNN's
  // statistics) is shared and the layer's attention forward reruns before its backward; block:
  // every activation of a layer but its output (residual3) is shared, and the whole block forward
  // reruns from the layer's input at the start of its backward.
  using Recompute = model::Recompute;
  Recompute recompute_ = Recompute::none;
  model::ActivationLayout plan_;  // the activation layout of the model description (spec.h)
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t loss_ready_ = nullptr;
  std::unique_ptr<kc::Gemm> gemm_;
  std::unique_ptr<kc::CudnnAttention> cudnn_;  // null: cuBLASLt attention only
  std::string cudnn_note_;                     // why cuDNN attention is off, for describe()
  std::map<std::pair<int, int>, bool> cudnn_shapes_;  // decided group shapes: cuDNN or not
  bool batch_cudnn_ = false;                   // some group of the current micro-batch runs on cuDNN
  std::unique_ptr<SdpaState, SdpaStateDeleter> sdpa_;  // null: no SDPA path
  std::string sdpa_note_;                      // why SDPA is off, for describe()
  bool batch_sdpa_ = false;                    // the current micro-batch's attention runs on SDPA
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
  // ModelBase's copy policy: the AdamW moments in device memory, copied on the compute stream.
  float* allocate_moments(size_t floats) override;
  void free_moments(float* moments) override;
  void upload(float* to, const float* host, size_t count) override;
  void download(float* host, const float* from, size_t count) const override;
  void zero(float* to, size_t count) override;
  void finish_copies() const override;
  // The owned ranges' parts as the one-launch AdamW and norm take them (rebuilt when they change).
  kc::AdamWSegment* segments_ = nullptr;
  int segment_count_ = 0;
  uint64_t segment_total_ = 0;
  std::vector<model::ParamRange> segments_for_;
  void ensure_segments();
  unsigned* norm_counter_ = nullptr;  // the one-launch norm's last-block counter
  // RoPE (llama): model::RopeTable's cos and sin for the context, on the device.
  float *rope_cos_ = nullptr, *rope_sin_ = nullptr;
  double* loss_device_ = nullptr;   // [0] loss sum, [1] squared norm, then the squared norms' scratch
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
};

}  // namespace kilter::backend
