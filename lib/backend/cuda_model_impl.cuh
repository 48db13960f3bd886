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

#include <algorithm>
#include <array>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "io/base/cuda_common.h"
#include "lib/backend/cuda_arena_layout.h"
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

// The engines' self-checks compare on the device (cuda_attention_choice.cu): result[0] and
// result[1] (zeroed first) receive max |a - b| and max |b| over n floats, as float bits (a NaN
// difference orders above every finite one); relative_difference_of reads the ratio back from
// the host copy of the pair.
void max_difference_on_device(unsigned* result, const float* a, const float* b, size_t n, cudaStream_t stream);
float relative_difference_of(const unsigned* result);

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
  void copy_params_to_host(float* host, size_t offset, size_t count) override;  // cuda_optimizer.cu
  void round_grads_bf16(size_t offset, size_t count) override;
  // The distributed optimizer (bf16 storage under a sharded optimizer, cuda_optimizer.cu).
  void shard_optimizer(const std::vector<model::ParamRange>& owned) override;
  // Under train.shard = parameters nothing is gathered whole after a step: the holder gathers the
  // working copy unit by unit (copy_gathered_).
  uint16_t* gathered_working_copy() override {
    return master_sharded_ && !copy_gathered_ ? reinterpret_cast<uint16_t*>(params_bf16_) : nullptr;
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
  // The arena's slices and a micro-batch's layout (cuda_arena_layout.h).
  using Activations = ArenaActivations;
  using BlockBf16 = ArenaBlockBf16<kc::bf16>;
  using ActivationsBf16 = ArenaActivationsBf16<kc::bf16>;
  using Layout = ArenaLayout;

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
  // What the arena's carving reads of this model (its kernels' scratch sizes, its cuDNN engine),
  // and the floats the current datapath's carving takes for a layout.
  ArenaModel arena_model() const;
  size_t measure_arena(const Layout& layout) const;
  // Measures the current datapath's layout, grows the arena to it and assigns acts_ (and bacts_).
  void lay_out_arena(const Layout& layout);
  void ensure_arena(size_t floats, const Layout& layout);
  // The block schedule's op tables of the two datapaths (cuda_model.cu, cuda_datapath_bf16.cu),
  // made per segment over the arena's current slices; the schedule makes the K/V exchange's calls.
  template <typename T>
  class DeviceOps;  // what the two share (below)
  class Fp32Ops;
  class Bf16Ops;
  model::BlockMemoryOf<float> memory_;       // the fp32 datapath's slices, as Fp32Ops resolves the names
  model::BlockMemoryOf<kc::bf16> memory_bf16_;  // the bf16 datapath's, as Bf16Ops does
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
  bool state_borrowed_ = false;      // params_ and grads_ are the parameter holder's (set_param_units)
  // bf16 storage under a holder that gathers the working copy (train.shard = parameters): the fp32
  // master is the distributed optimizer's (master_, this rank's chunks), params_ is backed at the
  // norms' tensors only, and a unit gathered refreshes what derives from its copy (unit_copy_derived).
  bool copy_gathered_ = false;
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
    if (copy_gathered_) return;  // each unit's gather refreshes what derives from it
    if (master_sharded_)
      working_copy_gathered();
    else if (bf16_storage_)
      refresh_working_copy();
  }

 private:
  // Runs one segment's kernels eagerly, or as a CUDA graph of this shape (see top of file).
  void run_segment(int segment, const std::function<void()>& body);
  void finish_forward();  // records loss_ready_ after the forward segment
  double read_loss();

  model::BackendOptions options_;
  using Recompute = model::Recompute;
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

  // params, grads: padded_size floats each. params_ is allocated by the first whole write
  // (init_params, set_params: ensure_params), so that a distributed optimizer set up before it
  // never holds the whole fp32 master on the device.
  float *params_ = nullptr, *grads_ = nullptr;
  void ensure_params();
  // The distributed optimizer (Megatron's: train.shard = optimizer under bf16 storage): master_
  // holds the fp32 master of the owned ranges only, indexed as the moments (segments_host_'s
  // `moment`); the working copy params_bf16_ is written from it by AdamW and all-gathered; and
  // params_ becomes a managed allocation, untouched (no device pages) but for the norms' weights,
  // widened from the working copy at their offsets for the kernels that take fp32 norm weights.
  // The op tables still resolve every weight against params_ (working() maps into the copy).
  bool master_sharded_ = false;
  float* master_ = nullptr;
  std::vector<model::ParamRange> norm_ranges_;
  std::vector<kc::AdamWSegment> segments_host_;  // segments_ on the host
  void widen_norms();           // the norms' fp32 weights in params_ from params_bf16_
  void working_copy_gathered();  // after the all-gather: the norms and the head's padded copy
  // The same for the working copy's range r alone (a unit just gathered): its norms' fp32 weights,
  // and the head's padded copy where the head lies in r.
  void unit_copy_derived(const model::ParamRange& r);
  // A whole host buffer (count floats, the rest zero) as the parameters: its owned ranges into
  // master_ and every value rounded into the working copy (staged through grads_, free then);
  // under copy_gathered_ the owned ranges only (load_owned_master).
  void load_sharded_master(const float* host, size_t count);
  void load_owned_master(const float* host, size_t count);
  // Refuses what reads or writes the whole parameters under copy_gathered_, naming train.shard.
  void check_not_unit_wise(const char* what) const;
  void read_working_copy(float* host) const;  // get_params: the weights the forward computes with
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

// What the two datapaths' op tables share: the names resolved into the arena's slices of T
// (BlockNames over `memory`: x is acts_ or bacts_, grads its gradients by model::Grad), the
// entries whose kernels take either type, and the K/V exchange's calls that need no conversion.
template <typename T>
class CudaModel::DeviceOps : public model::BlockOps, protected model::BlockNames<T> {
 public:
  template <typename Slices>
  DeviceOps(CudaModel& m, model::BlockMemoryOf<T>& memory, const Slices& x, const std::array<T*, 6>& grads)
      : model::BlockNames<T>(m.cfg_, memory), m_(m) {
    memory.activations = [&blocks = x.blocks](int layer, int) { return blocks[size_t(layer)]; };
    memory.embeddings = x.encoded;
    memory.lnf = x.lnf, memory.lnf_mean = x.lnf_mean, memory.lnf_rstd = x.lnf_rstd;
    memory.params = m.params_, memory.grads = m.grads_, memory.offsets = &m.offsets_;
    memory.rows = m.layout_now_.N;
    std::copy(grads.begin(), grads.end(), memory.grad);
  }
  void weights_needed(int layer) override {
    if (m_.units_) m_.forward_units(layer);
  }
  void gelu(const model::ActivationArgs& a) override {
    kc::gelu_forward(act(a.layer, a.out), act(a.layer, a.in), static_cast<size_t>(rows()) * spec_.ffn_width(), m_.s_);
  }
  void swiglu(const model::ActivationArgs& a) override {
    kc::swiglu_forward(act(a.layer, a.out), act(a.layer, a.in), rows(), spec_.ffn_width(), m_.s_);
  }
  void rope(const model::LayerArgs& a) override { m_.rope(act(a.layer, model::Act::qkv), false); }
  bool exchanging() const override { return m_.exchange_ != nullptr; }
  void kv_wait(const model::LayerArgs& a) override { m_.exchange_->forward_wait(a.layer); }
  void swiglu_backward(const model::ActivationBackwardArgs& a) override {
    kc::swiglu_backward(grad(a.dinp), grad(a.dout), act(a.layer, a.in), rows(), spec_.ffn_width(), m_.s_);
  }
  void rope_backward(const model::LayerArgs&) override { m_.rope(grad(model::Grad::dqkv), true); }
  void kv_send_grads(const model::LayerArgs& a) override {
    KILTER_CUDA_CHECK(cudaStreamSynchronize(m_.s_));
    m_.exchange_->backward_send(a.layer);
  }

 protected:
  using model::BlockNames<T>::act, model::BlockNames<T>::grad, model::BlockNames<T>::rows, model::BlockNames<T>::spec_;
  CudaModel& m_;
};

}  // namespace kilter::backend
