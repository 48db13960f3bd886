// CudaModel: the GPT-2 model on one CUDA device, composed from the CUDA twins of the CPU ops
// (lib/backend/cuda_ops.h) in exactly CpuModel's order, so the CPU backend is its oracle
// (tests/gpu/). fp32 master weights, gradients, AdamW moments and activations; precision "bf16"
// switches the GEMMs to bf16 tensor-core math with fp32 accumulation. Device memory: one
// persistent state allocation (params, grads, m, v) and one activation arena sized by reserve()
// (grown, with the stream drained first, if a larger micro-batch arrives). Capacity is kept as
// tokens (B*T) and attention floats (B*NH*T*T), so reserve(max_tokens / block_size, block_size)
// covers every micro-batch of at most max_tokens padded tokens, whatever its row count. Every
// kernel runs on cuda_compute_stream(); inputs go up on a separate copy stream, ordered by events.
#include <algorithm>
#include <cstring>
#include <vector>

#include "lib/backend/cuda_common.h"
#include "lib/backend/cuda_model.h"
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

class CudaModel final : public model::Model {
 public:
  CudaModel(const GPTConfig& cfg, size_t pad_multiple, const std::string& precision);
  ~CudaModel() override;

  std::string backend_name() const override { return "cuda"; }
  const GPTConfig& config() const override { return cfg_; }
  const model::ParamLayout& layout() const override { return layout_; }

  void init_params(uint64_t seed) override;
  void set_params(const float* host) override;
  void get_params(float* host) const override;
  void get_optimizer_state(float* m, float* v) const override;
  void set_optimizer_state(const float* m, const float* v) override;

  double forward_backward(const Batch& batch, float loss_scale, const model::GradReadyFn& on_ready) override;
  double forward_loss(const Batch& batch) override;

  void zero_grads() override;
  float* grads() override { return grads_; }
  float* params() override { return params_; }
  double grad_norm_squared() override;
  void adamw_step(const model::AdamWParams& p) override;
  void synchronize() override { KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  void reserve(int max_B, int max_T) override;

 private:
  using BlockTensors = model::BlockTensors;
  struct BlockActivations {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *residual2;
    float *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu, *residual3;
  };
  // Slices of the activation arena for one (B,T) micro-batch.
  struct Activations {
    float* encoded;
    std::vector<BlockActivations> blocks;
    float *lnf, *lnf_mean, *lnf_rstd, *logits;
    float *dresidual, *dln, *datty, *dqkv, *dfch;
    float* attention_workspace;
    float* column_scratch;
    int32_t *inputs, *targets, *lengths;
  };

  BlockTensors block_tensors(float* base, int layer) const;
  size_t carve(ArenaCarver& carver, Activations* acts, size_t tokens, size_t att_floats) const;
  void validate(const Batch& batch) const;
  void upload_batch(const Batch& batch);
  void forward(const Batch& batch);
  // Logits, loss (added into loss_device_) and dlogits in place; the loss is copied to the host
  // asynchronously (loss_ready_ marks it).
  void head_forward(const Batch& batch, float dloss_scale);
  double read_loss();

  GPTConfig cfg_;
  model::ParamLayout layout_;
  std::string precision_;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t upload_done_ = nullptr, compute_done_ = nullptr, loss_ready_ = nullptr;
  std::unique_ptr<kc::Gemm> gemm_;

  float* state_ = nullptr;  // params, grads, m, v: padded_size floats each
  float *params_ = nullptr, *grads_ = nullptr, *adam_m_ = nullptr, *adam_v_ = nullptr;
  double* loss_device_ = nullptr;   // [0] loss sum, [1] squared norm, then norm scratch
  double* host_scalars_ = nullptr;  // pinned: [0] loss, [1] squared norm
  int32_t* host_batch_ = nullptr;   // pinned staging for inputs, targets, lengths
  size_t host_batch_capacity_ = 0;

  float* arena_ = nullptr;
  size_t capacity_tokens_ = 0, capacity_att_ = 0;
  Activations acts_{};
  int acts_B_ = -1, acts_T_ = -1;

  size_t wte_offset_ = 0, wpe_offset_ = 0, lnf_w_offset_ = 0, lnf_b_offset_ = 0;
  std::vector<size_t> block_offset_;
  size_t block_size_floats_ = 0;
};

CudaModel::CudaModel(const GPTConfig& cfg, size_t pad_multiple, const std::string& precision)
    : cfg_(cfg), layout_(model::ParamLayout::build(cfg, pad_multiple)), precision_(precision) {
  KILTER_CHECK(precision == "fp32" || precision == "bf16",
               "train.precision=" << precision << " is not supported by the cuda backend (expected fp32 or bf16)");
  KILTER_CHECK(cfg_.n_embd % cfg_.n_head == 0,
               "model.n_embd=" << cfg_.n_embd << " is not a multiple of model.n_head=" << cfg_.n_head);
  device_ = cuda_device_index();
  stream_ = cuda_compute_stream();
  KILTER_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  KILTER_CUDA_CHECK(cudaEventCreateWithFlags(&upload_done_, cudaEventDisableTiming));
  KILTER_CUDA_CHECK(cudaEventCreateWithFlags(&compute_done_, cudaEventDisableTiming));
  KILTER_CUDA_CHECK(cudaEventCreateWithFlags(&loss_ready_, cudaEventDisableTiming));
  gemm_ = std::make_unique<kc::Gemm>(stream_, precision == "bf16" ? kc::GemmMath::bf16 : kc::GemmMath::fp32);

  const size_t padded = align_up(layout_.padded_size);
  KILTER_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&state_), sizeof(float) * padded * 4));
  params_ = state_;
  grads_ = state_ + padded;
  adam_m_ = state_ + 2 * padded;
  adam_v_ = state_ + 3 * padded;
  KILTER_CUDA_CHECK(cudaMemsetAsync(state_, 0, sizeof(float) * padded * 4, stream_));
  KILTER_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&loss_device_),
                               sizeof(double) * (2 + kc::sum_of_squares_scratch_doubles())));
  KILTER_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host_scalars_), sizeof(double) * 2));

  wte_offset_ = layout_.find("transformer.wte.weight").offset;
  wpe_offset_ = layout_.find("transformer.wpe.weight").offset;
  lnf_w_offset_ = layout_.find("transformer.ln_f.weight").offset;
  lnf_b_offset_ = layout_.find("transformer.ln_f.bias").offset;
  for (int l = 0; l < cfg_.n_layer; ++l)
    block_offset_.push_back(layout_.find("transformer.h." + std::to_string(l) + ".ln_1.weight").offset);
  block_size_floats_ = (cfg_.n_layer > 1 ? block_offset_[1] : lnf_w_offset_) - block_offset_[0];
  KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

CudaModel::~CudaModel() {
  // Destructors must not throw: drain and release, ignoring errors of a dying context.
  cudaStreamSynchronize(stream_);
  cudaStreamSynchronize(copy_stream_);
  gemm_.reset();
  cudaFree(arena_);
  cudaFree(state_);
  cudaFree(loss_device_);
  cudaFreeHost(host_scalars_);
  cudaFreeHost(host_batch_);
  cudaEventDestroy(upload_done_);
  cudaEventDestroy(compute_done_);
  cudaEventDestroy(loss_ready_);
  cudaStreamDestroy(copy_stream_);
}

CudaModel::BlockTensors CudaModel::block_tensors(float* base, int layer) const {
  return model::block_tensors_at(base + block_offset_[layer], size_t(cfg_.n_embd));
}

// Lays out every activation for `tokens` = B*T rows and `att_floats` = B*NH*T*T; returns the
// floats used. The same function measures (null base) and assigns, so they cannot disagree.
size_t CudaModel::carve(ArenaCarver& carver, Activations* acts, size_t tokens, size_t att_floats) const {
  const size_t C = cfg_.n_embd, V = cfg_.vocab_size;
  Activations a;
  a.encoded = carver.take(tokens * C);
  a.blocks.resize(cfg_.n_layer);
  for (BlockActivations& b : a.blocks) {
    b.ln1 = carver.take(tokens * C);
    b.ln1_mean = carver.take(tokens);
    b.ln1_rstd = carver.take(tokens);
    b.qkv = carver.take(tokens * 3 * C);
    b.atty = carver.take(tokens * C);
    b.att = carver.take(att_floats);
    b.residual2 = carver.take(tokens * C);
    b.ln2 = carver.take(tokens * C);
    b.ln2_mean = carver.take(tokens);
    b.ln2_rstd = carver.take(tokens);
    b.fch = carver.take(tokens * 4 * C);
    b.fch_gelu = carver.take(tokens * 4 * C);
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
  a.attention_workspace = carver.take(7 * tokens * C + att_floats);
  a.column_scratch = carver.take(2 * kc::column_sum_scratch_floats(static_cast<int>(4 * C)));
  a.inputs = carver.take_ints(tokens);
  a.targets = carver.take_ints(tokens);
  a.lengths = carver.take_ints(tokens);  // B <= B*T: any batch that fits in tokens fits here
  if (acts != nullptr) *acts = std::move(a);
  return carver.used();
}

void CudaModel::reserve(int max_B, int max_T) {
  KILTER_CHECK(max_B > 0 && max_T > 0, "CudaModel::reserve: B and T must be positive, got " << max_B << ", " << max_T);
  const size_t tokens = static_cast<size_t>(max_B) * max_T;
  const size_t att = static_cast<size_t>(max_B) * cfg_.n_head * max_T * max_T;
  if (tokens <= capacity_tokens_ && att <= capacity_att_) return;
  const size_t new_tokens = std::max(tokens, capacity_tokens_);
  const size_t new_att = std::max(att, capacity_att_);
  ArenaCarver measure(nullptr);
  const size_t floats = carve(measure, nullptr, new_tokens, new_att);
  // The old arena may still be read by queued kernels.
  KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));
  KILTER_CUDA_CHECK(cudaStreamSynchronize(copy_stream_));
  cudaFree(arena_);
  arena_ = nullptr;
  const cudaError_t status = cudaMalloc(reinterpret_cast<void**>(&arena_), sizeof(float) * floats);
  if (status != cudaSuccess) {
    cudaGetLastError();
    capacity_tokens_ = capacity_att_ = 0;
    KILTER_FAIL("cuda backend: cannot allocate the activation arena of " << (sizeof(float) * floats >> 20)
                << " MiB for micro-batches up to B=" << max_B << " T=" << max_T << " on device " << device_
                << " (" << cudaGetErrorString(status) << "); lower data.max_tokens or model.block_size");
  }
  capacity_tokens_ = new_tokens;
  capacity_att_ = new_att;
  acts_B_ = acts_T_ = -1;  // slices are re-carved for the next batch shape
}

void CudaModel::validate(const Batch& batch) const {
  const int B = batch.B, T = batch.T, V = cfg_.vocab_size;
  KILTER_CHECK(B > 0 && T > 0, "model batch: B and T must be positive, got B=" << B << " T=" << T);
  KILTER_CHECK(T <= cfg_.block_size, "model batch: T=" << T << " exceeds model.block_size=" << cfg_.block_size);
  const size_t BT = static_cast<size_t>(B) * T;
  KILTER_CHECK(batch.inputs.size() == BT && batch.targets.size() == BT && batch.lengths.size() == static_cast<size_t>(B),
               "model batch: expected " << BT << " inputs/targets and " << B << " lengths, got "
                                        << batch.inputs.size() << "/" << batch.targets.size() << " and "
                                        << batch.lengths.size());
  // Ids index device tables: an out-of-range one would read out of bounds there, so refuse it here.
  for (int b = 0; b < B; ++b) {
    const int length = batch.lengths[b];
    KILTER_CHECK(length >= 0 && length <= T,
                 "model batch: row " << b << " has length " << length << " outside [0, " << T << "]");
    for (int t = 0; t < T; ++t) {
      const size_t i = static_cast<size_t>(b) * T + t;
      const int32_t input = batch.inputs[i], target = batch.targets[i];
      KILTER_CHECK(input >= (t < length ? 0 : -1) && input < V,
                   "model batch: token id " << input << " at row " << b << " position " << t << " is outside the vocabulary [0, " << V << ")");
      KILTER_CHECK(target >= -1 && target < V && (t < length || target == -1),
                   "model batch: target " << target << " at row " << b << " position " << t << " (length " << length
                                          << ") is invalid");
    }
  }
}

void CudaModel::upload_batch(const Batch& batch) {
  validate(batch);
  reserve(batch.B, batch.T);
  const int B = batch.B, T = batch.T;
  const size_t BT = static_cast<size_t>(B) * T;
  if (B != acts_B_ || T != acts_T_) {
    ArenaCarver carver(arena_);
    carve(carver, &acts_, BT, static_cast<size_t>(B) * cfg_.n_head * T * T);
    acts_B_ = B;
    acts_T_ = T;
  }
  const size_t ints = 2 * BT + B;
  // The staging buffer and the device batch slots are reused: the previous upload must have
  // left the staging buffer, and the previous step's kernels must be done with the slots.
  KILTER_CUDA_CHECK(cudaEventSynchronize(upload_done_));
  if (ints > host_batch_capacity_) {
    cudaFreeHost(host_batch_);
    host_batch_ = nullptr;
    KILTER_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host_batch_), sizeof(int32_t) * ints));
    host_batch_capacity_ = ints;
  }
  std::memcpy(host_batch_, batch.inputs.data(), sizeof(int32_t) * BT);
  std::memcpy(host_batch_ + BT, batch.targets.data(), sizeof(int32_t) * BT);
  std::memcpy(host_batch_ + 2 * BT, batch.lengths.data(), sizeof(int32_t) * B);
  KILTER_CUDA_CHECK(cudaEventRecord(compute_done_, stream_));
  KILTER_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, compute_done_, 0));
  KILTER_CUDA_CHECK(cudaMemcpyAsync(acts_.inputs, host_batch_, sizeof(int32_t) * BT, cudaMemcpyHostToDevice, copy_stream_));
  KILTER_CUDA_CHECK(cudaMemcpyAsync(acts_.targets, host_batch_ + BT, sizeof(int32_t) * BT, cudaMemcpyHostToDevice,
                                    copy_stream_));
  KILTER_CUDA_CHECK(cudaMemcpyAsync(acts_.lengths, host_batch_ + 2 * BT, sizeof(int32_t) * B, cudaMemcpyHostToDevice,
                                    copy_stream_));
  KILTER_CUDA_CHECK(cudaEventRecord(upload_done_, copy_stream_));
  KILTER_CUDA_CHECK(cudaStreamWaitEvent(stream_, upload_done_, 0));
}

void CudaModel::forward(const Batch& batch) {
  cuda_device_index();  // current device on this thread
  upload_batch(batch);
  const int B = batch.B, T = batch.T, C = cfg_.n_embd, NH = cfg_.n_head;
  const int BT = B * T;
  kc::encoder_forward(acts_.encoded, acts_.inputs, params_ + wte_offset_, params_ + wpe_offset_, B, T, C, stream_);
  const float* residual = acts_.encoded;
  for (int l = 0; l < cfg_.n_layer; ++l) {
    const BlockTensors p = block_tensors(params_, l);
    const BlockActivations& a = acts_.blocks[l];
    kc::layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, residual, p.ln1_w, p.ln1_b, BT, C, stream_);
    kc::matmul_forward(*gemm_, a.qkv, a.ln1, p.qkv_w, p.qkv_b, BT, C, 3 * C);
    kc::attention_forward(*gemm_, a.atty, a.att, a.qkv, acts_.lengths, B, T, C, NH, acts_.attention_workspace);
    kc::matmul_forward_residual(*gemm_, a.residual2, a.atty, p.attproj_w, p.attproj_b, residual, BT, C, C);
    kc::layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2, p.ln2_w, p.ln2_b, BT, C, stream_);
    kc::matmul_forward(*gemm_, a.fch, a.ln2, p.fc_w, p.fc_b, BT, C, 4 * C);
    kc::gelu_forward(a.fch_gelu, a.fch, static_cast<size_t>(BT) * 4 * C, stream_);
    kc::matmul_forward_residual(*gemm_, a.residual3, a.fch_gelu, p.fcproj_w, p.fcproj_b, a.residual2, BT, 4 * C, C);
    residual = a.residual3;
  }
  kc::layernorm_forward(acts_.lnf, acts_.lnf_mean, acts_.lnf_rstd, residual, params_ + lnf_w_offset_,
                        params_ + lnf_b_offset_, BT, C, stream_);
}

void CudaModel::head_forward(const Batch& batch, float dloss_scale) {
  const int BT = batch.B * batch.T, C = cfg_.n_embd, V = cfg_.vocab_size;
  // Every row's logits (padding rows too: they have no target and get a zero gradient); the
  // CPU gathers target rows instead, which gives the same loss and gradients.
  kc::matmul_forward(*gemm_, acts_.logits, acts_.lnf, params_ + wte_offset_, nullptr, BT, C, V);
  KILTER_CUDA_CHECK(cudaMemsetAsync(loss_device_, 0, sizeof(double), stream_));
  kc::crossentropy_forward_backward_async(acts_.logits, acts_.logits, acts_.targets, BT, V, dloss_scale, loss_device_,
                                          /*accumulate=*/false, stream_);
  KILTER_CUDA_CHECK(cudaMemcpyAsync(host_scalars_, loss_device_, sizeof(double), cudaMemcpyDeviceToHost, stream_));
  KILTER_CUDA_CHECK(cudaEventRecord(loss_ready_, stream_));
}

double CudaModel::read_loss() {
  KILTER_CUDA_CHECK(cudaEventSynchronize(loss_ready_));
  return host_scalars_[0];
}

double CudaModel::forward_loss(const Batch& batch) {
  forward(batch);
  head_forward(batch, 0.0f);
  return read_loss();
}

double CudaModel::forward_backward(const Batch& batch, float loss_scale, const model::GradReadyFn& on_ready) {
  forward(batch);
  head_forward(batch, loss_scale);
  const int B = batch.B, T = batch.T, C = cfg_.n_embd, V = cfg_.vocab_size, NH = cfg_.n_head;
  const int BT = B * T;
  const size_t BTC = static_cast<size_t>(BT) * C;
  float* scratch = acts_.column_scratch;
  const Activations& a = acts_;

  // LM head (tied to wte): dlnf = dlogits @ wte; dwte += dlogits^T @ lnf.
  kc::matmul_backward(*gemm_, a.dln, grads_ + wte_offset_, nullptr, a.logits, a.lnf, params_ + wte_offset_, BT, C, V,
                      scratch, /*accumulate_dinp=*/false);
  KILTER_CUDA_CHECK(cudaMemsetAsync(a.dresidual, 0, sizeof(float) * BTC, stream_));
  kc::layernorm_backward(a.dresidual, grads_ + lnf_w_offset_, grads_ + lnf_b_offset_, a.dln,
                         a.blocks[cfg_.n_layer - 1].residual3, params_ + lnf_w_offset_, a.lnf_mean, a.lnf_rstd, BT, C,
                         scratch, stream_);
  // Reported ranges are final in stream order: the NCCL communicator waits on this stream.
  if (on_ready) on_ready(lnf_w_offset_, layout_.padded_size - lnf_w_offset_);

  for (int l = cfg_.n_layer - 1; l >= 0; --l) {
    const BlockTensors p = block_tensors(params_, l);
    const BlockTensors g = block_tensors(grads_, l);
    const BlockActivations& act = a.blocks[l];
    const float* residual_in = l == 0 ? a.encoded : a.blocks[l - 1].residual3;
    kc::matmul_backward(*gemm_, a.dfch, g.fcproj_w, g.fcproj_b, a.dresidual, act.fch_gelu, p.fcproj_w, BT, 4 * C, C,
                        scratch, false);
    kc::gelu_backward(a.dfch, act.fch, a.dfch, static_cast<size_t>(BT) * 4 * C, stream_, /*accumulate=*/false);
    kc::matmul_backward(*gemm_, a.dln, g.fc_w, g.fc_b, a.dfch, act.ln2, p.fc_w, BT, C, 4 * C, scratch, false);
    kc::layernorm_backward(a.dresidual, g.ln2_w, g.ln2_b, a.dln, act.residual2, p.ln2_w, act.ln2_mean, act.ln2_rstd,
                           BT, C, scratch, stream_);
    kc::matmul_backward(*gemm_, a.datty, g.attproj_w, g.attproj_b, a.dresidual, act.atty, p.attproj_w, BT, C, C,
                        scratch, false);
    kc::attention_backward(*gemm_, a.dqkv, a.datty, act.qkv, act.att, a.lengths, B, T, C, NH, a.attention_workspace,
                           /*accumulate=*/false);
    kc::matmul_backward(*gemm_, a.dln, g.qkv_w, g.qkv_b, a.dqkv, act.ln1, p.qkv_w, BT, C, 3 * C, scratch, false);
    kc::layernorm_backward(a.dresidual, g.ln1_w, g.ln1_b, a.dln, residual_in, p.ln1_w, act.ln1_mean, act.ln1_rstd, BT,
                           C, scratch, stream_);
    if (on_ready) on_ready(block_offset_[l], block_size_floats_);
  }

  kc::encoder_backward(grads_ + wte_offset_, grads_ + wpe_offset_, a.dresidual, a.inputs, a.lengths, B, T, C, stream_);
  if (on_ready) on_ready(wte_offset_, block_offset_[0] - wte_offset_);
  (void)V;
  return read_loss();
}

void CudaModel::init_params(uint64_t seed) {
  std::vector<float> host(layout_.padded_size, 0.0f);
  model::init_gpt2_params(host.data(), layout_, cfg_, seed);
  cuda_device_index();
  KILTER_CUDA_CHECK(cudaMemcpyAsync(params_, host.data(), sizeof(float) * layout_.padded_size, cudaMemcpyHostToDevice,
                                    stream_));
  KILTER_CUDA_CHECK(cudaMemsetAsync(adam_m_, 0, sizeof(float) * layout_.padded_size, stream_));
  KILTER_CUDA_CHECK(cudaMemsetAsync(adam_v_, 0, sizeof(float) * layout_.padded_size, stream_));
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

void CudaModel::get_optimizer_state(float* m, float* v) const {
  cuda_device_index();
  KILTER_CUDA_CHECK(cudaMemcpyAsync(m, adam_m_, sizeof(float) * layout_.num_params, cudaMemcpyDeviceToHost, stream_));
  KILTER_CUDA_CHECK(cudaMemcpyAsync(v, adam_v_, sizeof(float) * layout_.num_params, cudaMemcpyDeviceToHost, stream_));
  KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaModel::set_optimizer_state(const float* m, const float* v) {
  cuda_device_index();
  KILTER_CUDA_CHECK(cudaMemcpyAsync(adam_m_, m, sizeof(float) * layout_.num_params, cudaMemcpyHostToDevice, stream_));
  KILTER_CUDA_CHECK(cudaMemcpyAsync(adam_v_, v, sizeof(float) * layout_.num_params, cudaMemcpyHostToDevice, stream_));
  KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaModel::zero_grads() {
  cuda_device_index();
  KILTER_CUDA_CHECK(cudaMemsetAsync(grads_, 0, sizeof(float) * layout_.padded_size, stream_));
}

double CudaModel::grad_norm_squared() {
  cuda_device_index();
  kc::sum_of_squares_async(loss_device_ + 1, grads_, layout_.num_params, loss_device_ + 2, stream_);
  KILTER_CUDA_CHECK(cudaMemcpyAsync(host_scalars_ + 1, loss_device_ + 1, sizeof(double), cudaMemcpyDeviceToHost, stream_));
  KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return host_scalars_[1];
}

void CudaModel::adamw_step(const model::AdamWParams& p) {
  cuda_device_index();
  // One launch per run of consecutive tensors that share the decay flag (the layout alternates
  // 2-D weights and 1-D biases, so runs are short, but this keeps the formula per tensor exact).
  const auto& tensors = layout_.tensors;
  for (size_t i = 0; i < tensors.size();) {
    size_t j = i + 1;
    while (j < tensors.size() && tensors[j].decay == tensors[i].decay &&
           tensors[j].offset == tensors[j - 1].offset + tensors[j - 1].size)
      ++j;
    const size_t offset = tensors[i].offset;
    const size_t count = tensors[j - 1].offset + tensors[j - 1].size - offset;
    kc::adamw_update(params_ + offset, grads_ + offset, adam_m_ + offset, adam_v_ + offset, count, p.lr, p.beta1,
                     p.beta2, p.eps, tensors[i].decay ? p.weight_decay : 0.0f, p.grad_scale, p.t, stream_);
    i = j;
  }
}

}  // namespace

std::unique_ptr<model::Model> make_cuda_model(const GPTConfig& cfg, size_t pad_multiple, const std::string& precision) {
  return std::make_unique<CudaModel>(cfg, pad_multiple, precision);
}

}  // namespace kilter::backend
