// The model as the trainer sees it (docs/design.md, "Model"), whatever the backend and the
// architecture its description (spec.h) gives. Parameters, gradients and AdamW moments live in
// flat float buffers on the backend's device, laid out by ParamLayout (layout.h): the embeddings,
// then each block's tensors contiguous (h.0 .. h.{L-1}), then the final norm. Backward finishes
// blocks from the last to the first, so gradient buckets become ready from high offsets to low;
// the embeddings are ready last.
// Owner: model; the CUDA backend implements the same interface.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lib/model/kv_exchange.h"
#include "lib/model/layout.h"
#include "lib/model/spec.h"

namespace kilter::model {

// One micro-batch as the model sees it: PACKED. The tokens of its pieces are concatenated into
// one N-row token matrix and cu_seqlens marks where each piece starts (FlashAttention's varlen /
// cuDNN's ragged layout). Positions restart at 0 in every piece; attention is causal inside a
// piece and never crosses pieces; every other op runs on the N rows. There is no padding: the
// naive baseline's padding is a piece's tail of real computed positions whose targets are -1.
struct Batch {
  int N = 0;                        // tokens in the micro-batch
  std::vector<int32_t> inputs;      // N token ids: the pieces concatenated
  std::vector<int32_t> targets;     // N; -1 = no target
  std::vector<int32_t> cu_seqlens;  // pieces + 1 offsets: [0] = 0, back() = N, strictly increasing
  int64_t num_targets = 0;          // targets != -1
  // Per piece: tokens of its piece held before it by other ranks (a later part of a cut piece:
  // context parallelism): its positions start there and its queries also attend to those tokens' K/V,
  // which `exchange` delivers. Empty, or all 0: no piece has a prefix.
  std::vector<int32_t> pos_offset;
  // Non-null when a piece of this batch is part of a cut piece (as a later part, or as an
  // earlier part whose K/V others need); not owned. See lib/model/kv_exchange.h.
  KvExchange* exchange = nullptr;

  int num_pieces() const { return cu_seqlens.empty() ? 0 : static_cast<int>(cu_seqlens.size()) - 1; }
  int piece_len(int p) const { return cu_seqlens[p + 1] - cu_seqlens[p]; }
  int piece_offset(int p) const { return pos_offset.empty() ? 0 : pos_offset[p]; }
  double attention_work() const;  // sum over pieces of len * (len + 2 offset) (what attention costs)
  // Empties the batch, keeping its buffers' capacity.
  void clear();
  // Appends one piece of `len` tokens with their targets (targets may be null: all -1) and
  // `padding` more positions of input 0 and target -1 in the same piece (the naive baseline).
  // offset: the piece's pos_offset (a later part of a cut piece; 0 otherwise).
  void append_piece(const int32_t* piece_inputs, const int32_t* piece_targets, int len, int padding = 0,
                    int offset = 0);
};

struct AdamWParams {
  float lr = 3e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
  float grad_scale = 1.0f;   // gradients are multiplied by this first (global-norm clipping)
  int64_t t = 1;             // 1-based step for bias correction
};

// Called during backward when grads[offset, offset+count) are final for this micro-batch.
using GradReadyFn = std::function<void(size_t offset, size_t count)>;

// How a backend runs the model ([train] keys precision, attention, cuda_graphs). The CPU backend
// takes only the defaults; anything else is refused naming the key.
struct BackendOptions {
  std::string precision = "fp32";  // fp32 | bf16
  std::string attention = "auto";  // auto | sdpa | cudnn | cublaslt (CUDA backend)
  bool cuda_graphs = false;        // replay each micro-batch shape's kernels as CUDA graphs
  std::string recompute = "none";  // none | gelu | attention | block (train.recompute; cpu backend)
  // train.bf16_storage, with precision bf16: auto | on | off. CUDA: on stores every activation in
  // bf16 (the fused bf16 datapath), off keeps them fp32 (bf16 GEMM math only), auto takes bf16
  // storage where its runtime self-check against the CPU oracle passes on this device. CPU: on
  // runs the oracle of the CUDA bf16 storage (CpuModel), auto and off the CPU's own bf16.
  std::string bf16_storage = "auto";
  // bf16_storage on or off as the trainer resolved auto: every rank ran datapath_self_check and
  // they agreed (MPI), so that no rank trains on another datapath than the others.
  bool bf16_storage_checked = false;
  // Why cuDNN SDPA attention must not be used here ("" none): it failed its engine probe in a
  // child process (lib/backend/probed_engines.h). The model then runs attention on cuBLASLt.
  std::string sdpa_refused;
  // Why SDPA must not run later parts of cut pieces ("" none): their probe failed. Those buckets
  // then run on the other engines; whole pieces stay on SDPA.
  std::string sdpa_cut_refused;
  // train.shard = parameters where a holder keeps the parameters, gradients and working copy
  // (ParamUnitHooks::params_storage): the model allocates none of them, and takes the holder's
  // in set_param_units before anything reads them (whole buffers would not fit where sharding
  // is needed).
  bool params_held_elsewhere = false;
};

// Graphs an attention engine built (cuDNN SDPA: forward and backward count one each, per shape
// bucket) and the host seconds it took: the cost a new shape bucket adds to a step.
struct EngineBuildStats {
  int graphs = 0;
  double seconds = 0.0;
};

// Fully sharded parameters (train.shard = parameters, ZeRO-3): the model says when it needs a
// unit's parameters and when a unit's gradients are final; whoever holds the shards gathers,
// reduce-scatters and frees. Units: 0 = the embeddings (with a tied head), 1 + l = block l,
// n_layer + 1 = the final norm and an untied head (layout order; unit_range gives each's floats).
class ParamUnitHooks {
 public:
  virtual ~ParamUnitHooks() = default;
  // The unit's parameters must be whole in params() from now on; true where they were gathered
  // just now (the model refreshes what it derives from them).
  virtual bool need(int unit) = 0;
  // The unit will be needed soon: a holder that gathers in the background (a device's NCCL
  // stream) may start now, so that the gather overlaps the compute before it. need() still comes
  // before any use. Out-of-range units are ignored.
  virtual void prefetch(int unit) { (void)unit; }
  // Buffers the holder keeps itself, which the model then uses for its parameters and gradients
  // (padded_size floats each; a device's sparsely backed ranges); null: the model's own.
  virtual float* params_storage() { return nullptr; }
  virtual float* grads_storage() { return nullptr; }
  // Likewise for a working copy of the parameters in `element_bytes` elements (a bf16 copy the
  // kernels read) where the model keeps the fp32 master of this rank's chunks itself (a
  // distributed optimizer's, which writes the chunks' working copy): the holder then gathers the
  // working copy alone, unit by unit, and backs of params_storage() only the pages of
  // `fp32_ranges` (the few fp32 tensors the model derives from the copy, for good); the model
  // refreshes those and anything else it derives from a unit whenever need() says the unit was
  // gathered just now. null: the holder gathers the parameters themselves.
  virtual void* working_copy_storage(size_t element_bytes, const std::vector<ParamRange>& fp32_ranges) {
    (void)element_bytes, (void)fp32_ranges;
    return nullptr;
  }
  // The forward is done with the unit (it may be freed until the backward needs it again; the
  // embeddings, unit 0, until a tied head needs them: need(0) again).
  virtual void forward_done(int unit) = 0;
  // The unit's gradients are final for this micro-batch (reduce-scatter them; the unit above it,
  // which the backward kept, may be freed).
  virtual void grads_final(int unit) = 0;
  // The pass is over: everything gathered may be freed.
  virtual void pass_done() = 0;
  // A tied head is done with the embeddings (unit 0) in this pass: the head's part of their
  // gradient is final (it may be reduce-scattered; the token embedding's backward adds its own
  // part later, before grads_final(0)), and the embeddings may be freed, as the backward of the
  // blocks and the embeddings reads none of them.
  virtual void head_done() {}
};

// The units' ranges of the padded buffer, in layout order (ParamUnitHooks numbers them).
std::vector<ParamRange> param_unit_ranges(const ParamLayout& layout);
// The norms' weight and bias tensors (each block's two norms and the final one), in layout order:
// what a distributed optimizer widens from the bf16 working copy for the fp32 norm kernels.
std::vector<ParamRange> norm_tensor_ranges(const ParamLayout& layout);

class Model {
 public:
  virtual ~Model() = default;
  virtual std::string backend_name() const = 0;
  // One line for logs: the backend and how it computes (engines, precision).
  virtual std::string describe() const { return backend_name(); }
  // The attention engines' graph builds so far (none on backends that build no graphs).
  virtual EngineBuildStats engine_build_stats() const { return {}; }
  virtual const ModelSpec& config() const = 0;
  virtual const ParamLayout& layout() const = 0;

  // The parameter table's initialization (spec.h: TensorInit), deterministic from the seed and
  // independent of the backend (init.h).
  virtual void init_params(uint64_t seed) = 0;
  virtual void set_params(const float* host) = 0;  // num_params floats in layout order
  virtual void get_params(float* host) const = 0;
  // AdamW moments (for checkpoints), num_params floats each. A model with a sharded optimizer
  // keeps from set_optimizer_state only its own ranges, and get_optimizer_state throws (use
  // get_optimizer_shard).
  virtual void get_optimizer_state(float* m, float* v) const = 0;
  virtual void set_optimizer_state(const float* m, const float* v) = 0;

  // ZeRO-1 (train.shard_optimizer). After shard_optimizer(owned) this rank keeps AdamW moments
  // only for `owned` (disjoint ranges of the padded buffer: what the gradient reducer leaves
  // reduced here), adamw_step updates only the parameters there, and grad_norm_squared sums only
  // there (the caller sums over ranks). Moments already held are kept for the owned part. The
  // other parameters are the caller's to fill (all-gather), then params_changed().
  virtual bool supports_optimizer_shard() const { return false; }
  virtual void shard_optimizer(const std::vector<ParamRange>& owned) {  // throws unless supported
    (void)owned;
    shard_optimizer_unsupported();
  }
  // The ranges whose moments this rank holds ({[0, num_params)} unless sharded), and `count` of
  // those moments from the `first`-th on, counting range after range (a checkpoint streams them in
  // pieces, so that no rank copies a whole shard). Only a sharded backend implements it.
  virtual std::vector<ParamRange> optimizer_ranges() const { return {{0, layout().num_params}}; }
  virtual void get_optimizer_shard(float* m, float* v, size_t first, size_t count) const {
    (void)m, (void)v, (void)first, (void)count;
    shard_optimizer_unsupported();
  }
  // The distributed optimizer (Megatron's; train.shard = optimizer where the forward reads a bf16
  // working copy of the weights: the CPU backend's bf16 storage): after shard_optimizer this rank
  // keeps the fp32 master only for its owned ranges (params() is valid there only), adamw_step
  // writes the working copy of those ranges from the master, and the caller all-gathers the
  // working copy, the buffer returned here (padded_size bf16 values laid out as the parameters),
  // instead of params(): half the bytes. params_changed() and params_arriving then concern it.
  // null: the parameters themselves are gathered.
  virtual uint16_t* gathered_working_copy() { return nullptr; }
  // params() changed outside the model (the sharded step's all-gather): refresh what the backend
  // derives from them (the CPU backend's bf16 copy).
  virtual void params_changed() {}
  // The sharded step's all-gather may still be arriving (lib/train/train_step.cpp, comm.overlap =
  // thread): wait(end) blocks until params()[0, end) has arrived. A backend that takes it calls
  // wait before it reads a range (its forward layer by layer, so that the gather overlaps the
  // forward; any other use of the parameters all of them first), refreshes what it derives from
  // the range, and drops `wait` once everything has arrived. The default takes none: the caller
  // gathers first and calls params_changed().
  virtual bool takes_arriving_params() const { return false; }
  virtual void params_arriving(std::function<void(size_t end)> wait) { (void)wait; }
  // Waits for every parameter still arriving (a no-op when none is).
  virtual void finish_arriving_params() {}
  [[noreturn]] void shard_optimizer_unsupported() const;
  // ZeRO-3: the hooks (not owned; null: every parameter is always there). A backend without it
  // returns false from supports_param_units.
  virtual bool supports_param_units() const { return false; }
  virtual void set_param_units(ParamUnitHooks* hooks) { (void)hooks; }

  // Forward + backward of one micro-batch. Returns the SUM over real targets of the
  // cross-entropy; gradients of (sum * loss_scale) ACCUMULATE into grads(). The trainer passes
  // loss_scale = 1 / (target tokens of the whole global step) so that reduced gradients are those
  // of the global token-mean loss. on_ready (may be empty) reports finished gradient ranges.
  virtual double forward_backward(const Batch& batch, float loss_scale, const GradReadyFn& on_ready) = 0;
  // Forward only: the summed cross-entropy over real targets.
  virtual double forward_loss(const Batch& batch) = 0;

  virtual void zero_grads() = 0;
  virtual float* grads() = 0;        // device pointer, layout().padded_size floats
  // train.grad_dtype = bf16: grads()[offset, offset + count) rounded to bf16 where they live, as
  // the backward finishes them (the micro-batches accumulate in bf16). Host backends round in
  // place on the host; a device backend on its stream, before the reduction reads them.
  virtual void round_grads_bf16(size_t offset, size_t count);
  virtual float* params() = 0;       // device pointer
  // Whether params() is host memory (the CPU backend) or a device's (CUDA).
  virtual bool params_in_host_memory() const { return true; }
  // params()[offset, offset + count) (within padded_size) into host memory: a checkpoint writes a
  // sharded device rank's ranges piece by piece through it. Host backends copy from params(); a
  // device backend copies from the device.
  virtual void copy_params_to_host(float* host, size_t offset, size_t count) {
    const float* from = params() + offset;
    std::copy(from, from + count, host);
  }
  virtual double grad_norm_squared() = 0;  // over num_params (over the owned ranges, sharded)
  // Whether grads()[offset, offset+count) holds only finite values. Called on this rank's own
  // gradient before it is reduced, to name the rank a non-finite gradient came from; a backend
  // that cannot check cheaply returns true (the reduced gradient norm still catches it, unnamed).
  virtual bool grads_finite(size_t offset, size_t count) { (void)offset, (void)count; return true; }
  virtual void adamw_step(const AdamWParams& p) = 0;
  virtual void synchronize() {}
  // Called by forward_backward when the forward pass is done and backward begins (for the
  // per-phase timers). Backends that do not call it leave the split to the first on_ready call.
  virtual void set_backward_start_hook(std::function<void()> hook) { backward_start_hook_ = std::move(hook); }

 protected:
  std::function<void()> backward_start_hook_;

 public:
  // The largest micro-batch planned for: max_tokens tokens in pieces of at most `context`
  // tokens (so attention holds at most max_tokens * context scores per head). Backends may
  // preallocate from it; a larger batch still runs (the buffers grow).
  virtual void reserve(int max_tokens, int context) { (void)max_tokens; (void)context; }
};

// Checks a micro-batch against the model: N > 0, sizes, cu_seqlens (starts at 0, strictly
// increasing, ends at N), every piece within model.block_size (a later part of a cut piece:
// offset + len <= block_size, and `exchange` set), input ids in the vocabulary, targets in
// [-1, vocab). Throws kilter::Error naming the piece and the position in it. Every backend calls
// it before using a batch.
void validate_batch(const Batch& batch, const ModelSpec& cfg);
// What Model::forward_loss (evaluation) takes on top: no part of a cut piece (no offset, no
// exchange); throws kilter::Error naming the piece otherwise. Every backend calls it.
void check_evaluation_batch(const Batch& batch);

// The start-up self-check of the datapath `options` would give a model on `backend` (CUDA,
// precision bf16, bf16_storage auto: the bf16-storage datapath against its CPU oracle on this
// device): "" where it passes or nothing needs checking, else why it failed. Collective callers
// (the trainer) agree on the result and pass bf16_storage on or off with bf16_storage_checked.
std::string datapath_self_check(const std::string& backend, const ModelSpec& cfg, const BackendOptions& options);

// The one place that picks a backend ("cpu" | "cuda"); throws if it was not compiled in.
std::unique_ptr<Model> make_model(const std::string& backend, const ModelSpec& cfg,
                                  size_t pad_multiple, const BackendOptions& options);
std::unique_ptr<Model> make_model(const std::string& backend, const ModelSpec& cfg,
                                  size_t pad_multiple, const std::string& precision);
// Backends compiled in and usable on this machine ("cuda" only when a device is present).
bool cuda_available();
// This process's device (backend::cuda_device_index()): its free and total memory, after the CUDA
// context is made. False when no CUDA device is usable (or CUDA is not compiled in).
bool cuda_device_memory(uint64_t* free_bytes, uint64_t* total_bytes);

}  // namespace kilter::model
