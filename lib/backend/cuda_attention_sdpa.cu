// The CUDA model's cuDNN SDPA path (train.attention = sdpa, or auto with train.precision = bf16;
// cuda_model_impl.cuh): a micro-batch's attention through lib/model/attention_sdpa.h on the
// packed rows, in place of the padded groups. sdpa_for_batch (from upload_batch) plans the batch
// (lib/model/sdpa_plan.h) and decides each shape bucket once, as the cuDNN engine's shapes are
// decided (cuda_attention_choice.cu): the graphs are built, then a trial run on pseudo-random rows
// of this very batch layout is compared with the cuBLASLt engine (whole pieces, and later parts of
// cut pieces against attention_prefix_*: the bottom-right case). A bucket that fails runs on the
// other engines with one line on stderr, or is an error naming train.attention under "sdpa".
//
// The activations are fp32 today, and cuDNN's SDPA takes bf16: each call converts qkv (and dout)
// to bf16 rows, and the output (and dqkv) back (describe() says so). The forward keeps cuDNN's
// Stats per layer ((N, n_head) floats) for the backward; O is re-rounded from the kept fp32
// output, which holds bf16 values exactly. Later parts' K/V rows are staged (their prefix from
// the exchange, then their own rows) and their dK/dV unstaged, in kv_exchange.h's call order.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <vector>

#include "lib/backend/cuda_model_impl.cuh"
#include "lib/model/attention_sdpa.h"
#include "lib/model/sdpa_plan.h"

namespace kilter::backend {

namespace {

// A device allocation that only grows (between micro-batches: the stream is drained first).
struct DeviceScratch {
  void* ptr = nullptr;
  size_t bytes = 0;
  void ensure(size_t want, cudaStream_t stream) {
    if (want <= bytes) return;
    KILTER_CUDA_CHECK(cudaStreamSynchronize(stream));
    cudaFree(ptr);
    ptr = nullptr;
    bytes = 0;
    KILTER_CUDA_CHECK(cudaMalloc(&ptr, want));
    bytes = want;
  }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr); }
  ~DeviceScratch() { cudaFree(ptr); }
};

// Pseudo-random values in [-1, 1) for the self-check (an integer hash of the index).
std::vector<float> hash_floats(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = hash_unit(i, seed);
  return v;
}

// max |a - b| / max |b| (NaN in a counts as infinitely far).
double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0.0, scale = 1e-20;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    diff = std::isnan(d) ? INFINITY : std::max(diff, d);
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return diff / scale;
}

std::vector<float> download_floats(const float* device, size_t n) {
  std::vector<float> host(n);
  KILTER_CUDA_CHECK(cudaMemcpy(host.data(), device, sizeof(float) * n, cudaMemcpyDeviceToHost));
  return host;
}

}  // namespace

struct SdpaState {
  std::unique_ptr<kc::SdpaAttention> engine;
  model::SdpaPlan plan;
  std::map<model::SdpaBucket, std::string> decided;  // per bucket: "" usable, else why not
  // bf16 rows of the calls, shared by the layers; stats: per layer, kept from forward to backward.
  DeviceScratch qkv16, out16, dout16, dqkv16, staged, staged_grad, stats, workspace, descriptors;
  size_t stats_rows = 0;  // rows of every layer's slice of `stats`
  int32_t* host_descriptors = nullptr;  // pinned
  size_t host_descriptor_ints = 0;
  cudaEvent_t descriptors_copied = nullptr;
  bool descriptors_pending = false;
  ~SdpaState() {
    if (descriptors_copied != nullptr) cudaEventDestroy(descriptors_copied);
    cudaFreeHost(host_descriptors);
  }
  const int32_t* whole_descriptors() const { return descriptors.as<int32_t>(); }
  const int32_t* later_descriptors() const {
    return descriptors.as<int32_t>() + model::SdpaCall::descriptor_ints(plan.whole.bucket.batch);
  }
  float* layer_stats(int layer) const { return stats.as<float>() + layer * stats_rows * plan.shape.n_head; }
  const int32_t* descriptors_of(const model::SdpaCall& call) const {
    return &call == &plan.whole ? whole_descriptors() : later_descriptors();
  }
  // One call's forward and backward on the shared bf16 rows (keys: qkv16, or the staged rows).
  void forward(const model::SdpaCall& call, float* call_stats, cudaStream_t stream) {
    const kc::bf16* keys = call.keys == model::SdpaKeyRows::staged ? staged.as<kc::bf16>() : qkv16.as<kc::bf16>();
    engine->forward(call, descriptors_of(call), qkv16.as<kc::bf16>(), keys, out16.as<kc::bf16>(), call_stats,
                    workspace.ptr, stream);
  }
  void backward(const model::SdpaCall& call, const float* call_stats, cudaStream_t stream) {
    const bool staged_keys = call.keys == model::SdpaKeyRows::staged;
    const kc::bf16* keys = staged_keys ? staged.as<kc::bf16>() : qkv16.as<kc::bf16>();
    kc::bf16* dkeys = staged_keys ? staged_grad.as<kc::bf16>() : dqkv16.as<kc::bf16>();
    engine->backward(call, descriptors_of(call), qkv16.as<kc::bf16>(), keys, out16.as<kc::bf16>(),
                     dout16.as<kc::bf16>(), call_stats, dqkv16.as<kc::bf16>(), dkeys, workspace.ptr, stream);
  }
};

void SdpaStateDeleter::operator()(SdpaState* state) const { delete state; }

void CudaModel::sdpa_init() {
  const bool wanted = options_.attention == "sdpa" || (options_.attention == "auto" && options_.precision == "bf16");
  if (!wanted) return;
#ifdef KILTER_WITH_SDPA
  try {
    std::unique_ptr<SdpaState, SdpaStateDeleter> state(new SdpaState);
    state->engine = std::make_unique<kc::SdpaAttention>(model::AttentionShape{cfg_.n_head, cfg_.kv_heads(), cfg_.head_dim()});
    KILTER_CUDA_CHECK(cudaEventCreateWithFlags(&state->descriptors_copied, cudaEventDisableTiming));
    sdpa_ = std::move(state);
  } catch (const Error& e) {
    KILTER_CHECK(options_.attention != "sdpa", "train.attention=sdpa: cuDNN SDPA attention cannot be used on device "
                                                   << device_ << ": " << e.what()
                                                   << " (use train.attention=auto, cudnn or cublaslt)");
    sdpa_note_ = e.what();
    std::fprintf(stderr, "kilter: cuda backend: cuDNN SDPA attention unavailable (%s)\n", sdpa_note_.c_str());
  }
#else
  KILTER_CHECK(options_.attention != "sdpa",
               "train.attention=sdpa: this kilter was built without cuDNN SDPA (the cudnn-frontend headers: run "
               "scripts/install-deps.sh and rebuild with -DENABLE_SDPA=ON), use train.attention=auto, cudnn or cublaslt");
  sdpa_note_ = "built without cudnn-frontend";
#endif
}

std::string CudaModel::sdpa_description() const {
  if (!sdpa_) return sdpa_note_.empty() ? "" : "cuDNN SDPA off (" + sdpa_note_ + "); ";
  int usable = 0, refused = 0;
  for (const auto& [bucket, why] : sdpa_->decided) (why.empty() ? usable : refused) += 1;
  return sdpa_->engine->description() + " on the packed rows (" + std::to_string(usable) + " shape buckets passed " +
         "the self-check, " + std::to_string(refused) + " fell back; fp32 activations rounded to bf16 for each call " +
         "and back), else ";
}

bool CudaModel::sdpa_for_batch(const Batch& batch) {
  if (!sdpa_) return false;
  SdpaState& st = *sdpa_;
  model::plan_sdpa(st.plan, batch.cu_seqlens.data(), batch.num_pieces(),
                   batch.pos_offset.empty() ? nullptr : batch.pos_offset.data(),
                   model::AttentionShape{cfg_.n_head, cfg_.kv_heads(), cfg_.head_dim()});
  // Buffers first: the self-check of a new bucket runs on them.
  const model::AttentionShape& shape = st.plan.shape;
  const size_t N = batch.N, W = shape.row_width(), C = shape.q_width(), R = st.plan.staged_rows;
  st.qkv16.ensure(sizeof(kc::bf16) * N * W, stream_);
  st.dqkv16.ensure(sizeof(kc::bf16) * N * W, stream_);
  st.out16.ensure(sizeof(kc::bf16) * N * C, stream_);
  st.dout16.ensure(sizeof(kc::bf16) * N * C, stream_);
  st.staged.ensure(sizeof(kc::bf16) * std::max<size_t>(R, 1) * shape.kv_width(), stream_);
  st.staged_grad.ensure(sizeof(kc::bf16) * std::max<size_t>(R, 1) * shape.kv_width(), stream_);
  if (N > st.stats_rows) {
    st.stats.ensure(sizeof(float) * cfg_.n_layer * N * shape.n_head, stream_);
    st.stats_rows = N;
  }
  const std::vector<int32_t> whole = st.plan.whole.descriptor_block(), later = st.plan.later.descriptor_block();
  st.descriptors.ensure(sizeof(int32_t) * (whole.size() + later.size()), stream_);
  for (const model::SdpaCall* call : {&st.plan.whole, &st.plan.later}) {
    if (call->empty()) continue;
    if (!sdpa_bucket_usable(*call)) return false;
    st.workspace.ensure(std::max<size_t>(st.engine->workspace_bytes(*call), 1), stream_);
  }
  // The descriptors go up on the compute stream, after the previous micro-batch's kernels read
  // theirs; the pinned buffer is rewritten only once its previous copy has left it.
  if (st.descriptors_pending) KILTER_CUDA_CHECK(cudaEventSynchronize(st.descriptors_copied));
  if (whole.size() + later.size() > st.host_descriptor_ints) {
    cudaFreeHost(st.host_descriptors);
    st.host_descriptors = nullptr;
    st.host_descriptor_ints = 0;
    KILTER_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&st.host_descriptors), sizeof(int32_t) * (whole.size() + later.size())));
    st.host_descriptor_ints = whole.size() + later.size();
  }
  std::copy(later.begin(), later.end(), std::copy(whole.begin(), whole.end(), st.host_descriptors));
  KILTER_CUDA_CHECK(cudaMemcpyAsync(st.descriptors.ptr, st.host_descriptors, sizeof(int32_t) * (whole.size() + later.size()),
                                    cudaMemcpyHostToDevice, stream_));
  KILTER_CUDA_CHECK(cudaEventRecord(st.descriptors_copied, stream_));
  st.descriptors_pending = true;
  return true;
}

bool CudaModel::sdpa_bucket_usable(const model::SdpaCall& call) {
  SdpaState& st = *sdpa_;
  const auto decided = st.decided.find(call.bucket);
  if (decided != st.decided.end()) return decided->second.empty();
  std::string why;
  bool retry = false;
  const bool usable = st.engine->prepare(call, &why) && sdpa_agrees(call, &why, &retry);
  // Short of memory for the self-check: the other engines this time, ask again next time.
  if (!usable && retry && options_.attention == "auto") return false;
  st.decided[call.bucket] = usable ? "" : (why.empty() ? "unknown" : why);
  if (!usable) {
    KILTER_CHECK(options_.attention != "sdpa", "train.attention=sdpa: cuDNN SDPA attention cannot be used for "
                                                   << call.bucket.text() << ": " << why
                                                   << " (use train.attention=auto, cudnn or cublaslt)");
    std::fprintf(stderr, "kilter: cuda backend: cuDNN SDPA attention not used for %s (%s); such micro-batches use the "
                 "other attention engines\n", call.bucket.text().c_str(), why.c_str());
  }
  return usable;
}

bool CudaModel::sdpa_agrees(const model::SdpaCall& call, std::string* why, bool* retry) {
  *retry = false;
  SdpaState& st = *sdpa_;
  const model::SdpaPlan& plan = st.plan;
  const int C = cfg_.n_embd, NH = cfg_.n_head, NKV = cfg_.kv_heads(), W = cfg_.qkv_width(), kv = plan.shape.kv_width();
  const size_t N = plan.tokens, R = std::max(plan.staged_rows, 1);
  const bool later = call.keys == model::SdpaKeyRows::staged;
  // The cuBLASLt engine's scratch for the largest entry: its saved softmax and workspace.
  size_t att = 1, work = 1;
  for (int e = 0; e < call.entries; ++e) {
    const int L = call.seq_len_q[e], s = call.seq_len_kv[e] - L;
    att = std::max(att, static_cast<size_t>(NH) * L * (s + L));
    work = std::max(work, later ? kc::attention_prefix_workspace_floats(s, L, C, NH) : kc::attention_workspace_floats(1, L, C, NH));
  }
  // qkv, dqkv x2 (W per row), dout, out x2 (C per row), prefix rows and their dK/dV x2, the rest.
  const size_t floats = 3 * align_up(N * W) + 3 * align_up(N * C) + 3 * align_up(R * kv) + align_up(att) +
                        align_up(work) + align_up(call.entries);
  float* scratch = nullptr;
  const cudaError_t status = cudaMalloc(reinterpret_cast<void**>(&scratch), sizeof(float) * floats);
  if (status != cudaSuccess) {
    cudaGetLastError();
    *why = std::string("no device memory for the self-check (") + cudaGetErrorString(status) + ")";
    *retry = true;
    return false;
  }
  ArenaCarver carver(scratch);
  float* qkv = carver.take(N * W);
  float* dqkv_sdpa = carver.take(N * W);
  float* dqkv_ref = carver.take(N * W);
  float* dout = carver.take(N * C);
  float* out_sdpa = carver.take(N * C);
  float* out_ref = carver.take(N * C);
  float* prefix_rows = carver.take(R * kv);
  float* prefix_dkv_sdpa = carver.take(R * kv);
  float* prefix_dkv_ref = carver.take(R * kv);
  float* saved = carver.take(att);
  float* workspace = carver.take(work);
  int32_t* lengths = carver.take_ints(call.entries);
  // Each later part's prefix rows and their dK/dV sit at its staged rows (the staging map's).
  const int pieces = static_cast<int>(layout_now_.pieces);
  std::vector<const float*> prefix_kv(pieces, nullptr);
  std::vector<float*> dkv_sdpa(pieces, nullptr), dkv_ref(pieces, nullptr);
  for (const model::SdpaStagedRows& run : plan.staging)
    if (run.from_prefix) {
      prefix_kv[run.piece] = prefix_rows + static_cast<size_t>(run.staged_row) * kv;
      dkv_sdpa[run.piece] = prefix_dkv_sdpa + static_cast<size_t>(run.staged_row) * kv;
      dkv_ref[run.piece] = prefix_dkv_ref + static_cast<size_t>(run.staged_row) * kv;
    }
  const model::AttentionPrefix prefix_sdpa{nullptr, prefix_kv.data(), dkv_sdpa.data()};
  bool ran = false;
  double out_error = 0.0, grad_error = 0.0, prefix_error = 0.0;
  try {
    // The previous micro-batch's kernels may still read the descriptors rewritten below.
    KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));
    const std::vector<float> qkv_host = hash_floats(N * W, 12345u), dout_host = hash_floats(N * C, 54321u),
                             prefix_host = hash_floats(R * kv, 777u);
    KILTER_CUDA_CHECK(cudaMemcpyAsync(qkv, qkv_host.data(), sizeof(float) * qkv_host.size(), cudaMemcpyHostToDevice, stream_));
    KILTER_CUDA_CHECK(cudaMemcpyAsync(dout, dout_host.data(), sizeof(float) * dout_host.size(), cudaMemcpyHostToDevice, stream_));
    KILTER_CUDA_CHECK(cudaMemcpyAsync(prefix_rows, prefix_host.data(), sizeof(float) * prefix_host.size(), cudaMemcpyHostToDevice, stream_));
    // Rows outside the call stay 0 on both sides.
    for (float* zeroed : {dqkv_sdpa, dqkv_ref, out_sdpa, out_ref})
      KILTER_CUDA_CHECK(cudaMemsetAsync(zeroed, 0, sizeof(float) * (zeroed == out_sdpa || zeroed == out_ref ? N * C : N * W), stream_));
    KILTER_CUDA_CHECK(cudaMemsetAsync(prefix_dkv_sdpa, 0, sizeof(float) * R * kv, stream_));
    KILTER_CUDA_CHECK(cudaMemsetAsync(prefix_dkv_ref, 0, sizeof(float) * R * kv, stream_));
    KILTER_CUDA_CHECK(cudaMemsetAsync(st.out16.ptr, 0, st.out16.bytes, stream_));
    KILTER_CUDA_CHECK(cudaMemsetAsync(st.dqkv16.ptr, 0, st.dqkv16.bytes, stream_));
    // The descriptors of this batch, now (sdpa_for_batch uploads them again after the decisions).
    const std::vector<int32_t> whole_block = plan.whole.descriptor_block(), later_block = plan.later.descriptor_block();
    KILTER_CUDA_CHECK(cudaMemcpy(st.descriptors.ptr, whole_block.data(), sizeof(int32_t) * whole_block.size(), cudaMemcpyHostToDevice));
    KILTER_CUDA_CHECK(cudaMemcpy(const_cast<int32_t*>(st.later_descriptors()), later_block.data(),
                                 sizeof(int32_t) * later_block.size(), cudaMemcpyHostToDevice));
    st.workspace.ensure(std::max<size_t>(st.engine->workspace_bytes(call), 1), stream_);
    // SDPA, as the layers run it.
    kc::rows_to_bf16(st.qkv16.as<kc::bf16>(), W, qkv, W, N, W, stream_);
    kc::rows_to_bf16(st.dout16.as<kc::bf16>(), C, dout, C, N, C, stream_);
    if (later) kc::sdpa_stage_keys(plan, prefix_sdpa, qkv, st.staged.as<kc::bf16>(), stream_);
    float* stats = st.layer_stats(0);
    st.forward(call, stats, stream_);
    st.backward(call, stats, stream_);
    kc::rows_to_fp32(out_sdpa, C, st.out16.as<kc::bf16>(), C, N, C, false, stream_);
    kc::rows_to_fp32(dqkv_sdpa, W, st.dqkv16.as<kc::bf16>(), W, N, W, false, stream_);
    if (later) kc::sdpa_unstage_key_grads(plan, prefix_sdpa, st.staged_grad.as<kc::bf16>(), dqkv_sdpa, stream_);
    // cuBLASLt, entry by entry: a whole piece is a (1, L) batch on its own rows; a later part runs
    // against its prefix (attention_prefix_*, bottom-right).
    std::vector<int32_t> entry_lengths(call.seq_len_q.begin(), call.seq_len_q.begin() + call.entries);
    KILTER_CUDA_CHECK(cudaMemcpy(lengths, entry_lengths.data(), sizeof(int32_t) * call.entries, cudaMemcpyHostToDevice));
    for (int e = 0; e < call.entries; ++e) {
      const int piece = call.piece[e], L = call.seq_len_q[e], s = call.seq_len_kv[e] - L;
      const size_t row = static_cast<size_t>(call.offset_o[e]) / C;
      if (later) {
        kc::attention_prefix_forward(*gemm_, out_ref + row * C, saved, qkv + row * W, prefix_kv[piece], s, L, C, NH, workspace,
                                     NKV);
        kc::attention_prefix_backward(*gemm_, dqkv_ref + row * W, dkv_ref[piece], dout + row * C, qkv + row * W,
                                      prefix_kv[piece], saved, s, L, C, NH, workspace, NKV);
      } else {
        kc::attention_forward(*gemm_, out_ref + row * C, saved, qkv + row * W, lengths + e, 1, L, C, NH, workspace, NKV);
        kc::attention_backward(*gemm_, dqkv_ref + row * W, dout + row * C, qkv + row * W, saved, lengths + e, 1,
                               L, C, NH, workspace, /*accumulate=*/false, NKV);
      }
    }
    KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));
    out_error = relative_difference(download_floats(out_sdpa, N * C), download_floats(out_ref, N * C));
    grad_error = relative_difference(download_floats(dqkv_sdpa, N * W), download_floats(dqkv_ref, N * W));
    if (later) prefix_error = relative_difference(download_floats(prefix_dkv_sdpa, R * kv), download_floats(prefix_dkv_ref, R * kv));
    ran = true;
  } catch (const Error& e) {
    *why = std::string("self-check failed to run: ") + e.what();
    cudaStreamSynchronize(stream_);  // queued kernels may still use the scratch
    cudaGetLastError();
  }
  cudaFree(scratch);
  if (!ran) return false;
  // bf16 inputs, probabilities and outputs against fp32 (or fast-bf16) cuBLASLt products.
  const double tolerance = 5e-2;
  if (out_error <= tolerance && grad_error <= tolerance && prefix_error <= tolerance) return true;
  char text[240];
  std::snprintf(text, sizeof(text), "self-check against cuBLASLt attention: relative difference %.3g in out, %.3g in dqkv, "
                "%.3g in the prefixes' dK/dV (limit %.0e)", out_error, grad_error, prefix_error, tolerance);
  *why = text;
  return false;
}

void CudaModel::sdpa_forward_layer(int layer, const BlockActivations& a, float* out, bool exchange_calls) {
  SdpaState& st = *sdpa_;
  const int C = cfg_.n_embd, W = cfg_.qkv_width(), N = layout_now_.N;
  const bool exchange = exchange_ != nullptr;
  if (exchange && exchange_calls) {
    KILTER_CUDA_CHECK(cudaStreamSynchronize(s_));  // the exchange reads the rows from elsewhere
    exchange_->forward_send(layer, a.qkv);
  }
  kc::rows_to_bf16(st.qkv16.as<kc::bf16>(), W, a.qkv, W, N, W, s_);
  float* stats = st.layer_stats(layer);
  if (!st.plan.whole.empty()) st.forward(st.plan.whole, stats, s_);
  if (!st.plan.later.empty()) {
    if (exchange_calls) exchange_->forward_wait(layer);
    std::vector<const float*> prefix_kv(layout_now_.pieces, nullptr);
    for (int piece : st.plan.later.piece) prefix_kv[piece] = exchange_->prefix_kv(layer, piece);
    kc::sdpa_stage_keys(st.plan, {nullptr, prefix_kv.data(), nullptr}, a.qkv, st.staged.as<kc::bf16>(), s_);
    st.forward(st.plan.later, stats, s_);
  } else if (exchange && exchange_calls) {
    exchange_->forward_wait(layer);
  }
  kc::rows_to_fp32(out, C, st.out16.as<kc::bf16>(), C, N, C, false, s_);
}

void CudaModel::sdpa_backward_layer(int layer, const BlockActivations& a) {
  SdpaState& st = *sdpa_;
  const int C = cfg_.n_embd, W = cfg_.qkv_width(), N = layout_now_.N;
  float* dqkv = acts_.dqkv;
  const float* stats = st.layer_stats(layer);
  kc::rows_to_bf16(st.qkv16.as<kc::bf16>(), W, a.qkv, W, N, W, s_);
  kc::rows_to_bf16(st.out16.as<kc::bf16>(), C, a.atty, C, N, C, s_);  // exact: a.atty holds bf16 values
  kc::rows_to_bf16(st.dout16.as<kc::bf16>(), C, acts_.datty, C, N, C, s_);
  std::vector<const float*> prefix_kv(layout_now_.pieces, nullptr);
  std::vector<float*> prefix_dkv(layout_now_.pieces, nullptr);
  const model::AttentionPrefix prefix{nullptr, prefix_kv.data(), prefix_dkv.data()};
  // The later parts first, so that their prefixes' dK/dV travel while the whole pieces run.
  if (!st.plan.later.empty()) {
    for (int piece : st.plan.later.piece) {
      prefix_kv[piece] = exchange_->prefix_kv(layer, piece);
      prefix_dkv[piece] = exchange_->prefix_dkv(layer, piece);
    }
    kc::sdpa_stage_keys(st.plan, prefix, a.qkv, st.staged.as<kc::bf16>(), s_);
    st.backward(st.plan.later, stats, s_);
    kc::sdpa_unstage_key_grads(st.plan, prefix, st.staged_grad.as<kc::bf16>(), dqkv, s_, kc::SdpaUnstage::prefix_rows);
  }
  if (exchange_ != nullptr) {
    KILTER_CUDA_CHECK(cudaStreamSynchronize(s_));
    exchange_->backward_send(layer);
  }
  if (!st.plan.whole.empty()) st.backward(st.plan.whole, stats, s_);
  // dQ of every row and dK/dV of the whole pieces' rows, then the later parts' own dK/dV.
  kc::rows_to_fp32(dqkv, W, st.dqkv16.as<kc::bf16>(), W, N, W, false, s_);
  if (!st.plan.later.empty())
    kc::sdpa_unstage_key_grads(st.plan, prefix, st.staged_grad.as<kc::bf16>(), dqkv, s_, kc::SdpaUnstage::own_rows);
  if (exchange_ != nullptr) {
    KILTER_CUDA_CHECK(cudaStreamSynchronize(s_));  // the exchange adds into dqkv from elsewhere
    exchange_->backward_wait_add(layer, dqkv);
  }
}

}  // namespace kilter::backend
