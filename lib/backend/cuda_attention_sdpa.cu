// The CUDA model's cuDNN SDPA path (train.attention = sdpa, or auto with train.precision = bf16;
// cuda_model_impl.cuh): a micro-batch's attention through lib/model/attention_sdpa.h on the
// packed rows, in place of the padded groups. sdpa_for_batch (from upload_batch) plans the batch
// (lib/model/sdpa_plan.h: its calls within the score budget of the batch's size) and decides each
// shape bucket once, as the cuDNN engine's shapes are decided (cuda_attention_choice.cu): the
// graphs are built, then a trial run on pseudo-random rows of this very batch layout is compared
// with the cuBLASLt engine (whole pieces, and later parts of cut pieces against
// attention_prefix_*: the bottom-right case). A bucket that fails runs on the other engines with
// one line on stderr, or is an error naming train.attention under "sdpa".
//
// Both datapaths, one engine. The bf16-storage datapath (sdpa_forward_bf16/sdpa_backward_bf16)
// hands the engine its own bf16 rows: qkv in, O straight into atty, dO from datty, dQ/dK/dV
// straight into dqkv; cuDNN's Stats ((N, n_head) floats per layer, or one slice the layers share
// under recompute attention/block), and the staged K/V of later parts, are slices of its arena
// (carve_arena). The fp32-activation datapath (sdpa_forward_layer/sdpa_backward_layer) converts
// qkv (and dout) to bf16 rows for each call and the output (and dqkv) back, and keeps the Stats
// of every layer here; its O for the backward is re-rounded from the kept fp32 output, which holds
// bf16 values exactly. Later parts' K/V rows are staged (their prefix from the exchange, fp32 rows
// that hold bf16 values, then their own rows) and their dK/dV unstaged, in kv_exchange.h's order.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "lib/backend/cuda_model_impl.cuh"
#include "lib/model/attention_sdpa.h"
#include "lib/model/attention_self_check.h"
#include "lib/model/sdpa_plan.h"

namespace kilter::backend {

namespace {

// A device allocation that only grows (between micro-batches: the stream is drained first).
// Rows SDPA reads get `tail` bytes of slack (kSdpaTailRows rows), and a new allocation is zeroed
// whole: a tile past the last row reads zeros, never memory nothing wrote.
// try_ensure: false, the error cleared, where the device has no memory for it (an allocation
// failure is not sticky); any other failure throws.
struct DeviceScratch {
  void* ptr = nullptr;
  size_t bytes = 0;
  bool try_ensure(size_t want, cudaStream_t stream, size_t tail = 0) {
    if (want <= bytes) return true;
    KILTER_CUDA_CHECK(cudaStreamSynchronize(stream));
    cudaFree(ptr);
    ptr = nullptr;
    bytes = 0;
    const cudaError_t status = cudaMalloc(&ptr, want + tail);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      ptr = nullptr;
      return false;
    }
    KILTER_CUDA_CHECK(status);
    KILTER_CUDA_CHECK(cudaMemsetAsync(ptr, 0, want + tail, stream));
    bytes = want;
    return true;
  }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr); }
  ~DeviceScratch() { cudaFree(ptr); }
};

}  // namespace

// Where one layer's calls read and write: bf16 rows (the bf16-storage datapath's own, or the fp32
// datapath's conversions) and the layer's Stats.
struct SdpaRows {
  const kc::bf16* qkv = nullptr;     // (N, row_width)
  const kc::bf16* staged = nullptr;  // the later parts' staged K/V rows
  kc::bf16* out = nullptr;           // (N, q_width): O, written by the forward, read by the backward
  const kc::bf16* dout = nullptr;    // (N, q_width)
  kc::bf16* dqkv = nullptr;          // (N, row_width)
  kc::bf16* staged_grad = nullptr;   // the staged rows' dK/dV
  float* stats = nullptr;            // (N, n_head)
};

// The exchange's rows of the prefixes the plan's later calls read, per piece: their K/V, and
// backward (grads) where their dK/dV go; `view()` is what the staging reads.
struct LaterPrefixes {
  std::vector<const float*> kv;
  std::vector<float*> dkv;
  LaterPrefixes(const model::SdpaPlan& plan, model::KvExchange* exchange, int layer, int pieces, bool grads)
      : kv(size_t(pieces), nullptr), dkv(grads ? size_t(pieces) : 0, nullptr) {
    for (const model::SdpaCall& call : plan.later)
      for (int piece : call.piece) {
        kv[size_t(piece)] = exchange->prefix_kv(layer, piece);
        if (grads) dkv[size_t(piece)] = exchange->prefix_dkv(layer, piece);
      }
  }
  model::AttentionPrefix view() const { return {nullptr, kv.data(), dkv.empty() ? nullptr : dkv.data()}; }
};

struct SdpaState {
  std::unique_ptr<kc::SdpaAttention> engine;
  model::SdpaPlan plan;
  std::map<model::SdpaBucket, std::string> decided;  // per bucket: "" usable, else why not
  std::set<std::string> short_of_memory;              // what was warned about once (a bucket, the rows)
  // The fp32-activation datapath's bf16 rows, shared by the layers, and its Stats per layer (the
  // bf16-storage datapath keeps its Stats and staging in the arena and needs no conversions).
  DeviceScratch qkv16, out16, dout16, dqkv16, staged, staged_grad, stats;
  size_t stats_rows = 0;  // rows of every layer's slice of `stats`
  // A layer's backward: the later parts' prefixes, taken with the later parts (before
  // backward_send, after which the exchange hands out no dK/dV rows) for the whole pieces' turn.
  std::optional<LaterPrefixes> backward_prefixes;
  // Both datapaths: cuDNN's workspace (the largest call's so far) and the calls' descriptor blocks.
  DeviceScratch workspace, descriptors;
  std::vector<size_t> descriptor_offsets;  // per call of plan.calls(), in ints
  int32_t* host_descriptors = nullptr;  // pinned
  size_t host_descriptor_ints = 0;
  cudaEvent_t descriptors_copied = nullptr;
  bool descriptors_pending = false;
  ~SdpaState() {
    if (descriptors_copied != nullptr) cudaEventDestroy(descriptors_copied);
    cudaFreeHost(host_descriptors);
  }
  float* layer_stats(int layer) const { return stats.as<float>() + layer * stats_rows * plan.shape.n_head; }
  const int32_t* descriptors_of(const model::SdpaCall& call) const {
    const std::vector<const model::SdpaCall*> calls = plan.calls();
    const size_t index = static_cast<size_t>(std::find(calls.begin(), calls.end(), &call) - calls.begin());
    KILTER_CHECK(index < descriptor_offsets.size(), "SDPA attention: a call outside the micro-batch's plan");
    return descriptors.as<int32_t>() + descriptor_offsets[index];
  }
  // The fp32 datapath's rows for `layer`.
  SdpaRows fp32_datapath_rows(int layer) const {
    return {qkv16.as<kc::bf16>(), staged.as<kc::bf16>(), out16.as<kc::bf16>(), dout16.as<kc::bf16>(),
            dqkv16.as<kc::bf16>(), staged_grad.as<kc::bf16>(), layer_stats(layer)};
  }
  // One call's forward and backward (keys: the qkv rows, or the staged rows).
  void forward(const model::SdpaCall& call, const SdpaRows& rows, cudaStream_t stream) {
    const kc::bf16* keys = call.keys == model::SdpaKeyRows::staged ? rows.staged : rows.qkv;
    engine->forward(call, descriptors_of(call), rows.qkv, keys, rows.out, rows.stats, workspace.ptr, stream);
  }
  void backward(const model::SdpaCall& call, const SdpaRows& rows, cudaStream_t stream) {
    const bool staged_keys = call.keys == model::SdpaKeyRows::staged;
    engine->backward(call, descriptors_of(call), rows.qkv, staged_keys ? rows.staged : rows.qkv, rows.out, rows.dout,
                     rows.stats, rows.dqkv, staged_keys ? rows.staged_grad : rows.dqkv, workspace.ptr, stream);
  }
  void forward_all(const std::vector<model::SdpaCall>& calls, const SdpaRows& rows, cudaStream_t stream) {
    for (const model::SdpaCall& call : calls) forward(call, rows, stream);
  }
  void backward_all(const std::vector<model::SdpaCall>& calls, const SdpaRows& rows, cudaStream_t stream) {
    for (const model::SdpaCall& call : calls) backward(call, rows, stream);
  }
};

void SdpaStateDeleter::operator()(SdpaState* state) const { delete state; }

void CudaModel::sdpa_init() {
  const bool wanted = options_.attention == "sdpa" || (options_.attention == "auto" && options_.precision == "bf16");
  if (!wanted) return;
  if (!options_.sdpa_refused.empty()) {  // its engine probe failed (probed_engines.h)
    KILTER_CHECK(options_.attention != "sdpa", "train.attention=sdpa: cuDNN SDPA attention failed its probe on device "
                                                   << device_ << ": " << options_.sdpa_refused
                                                   << " (use train.attention=auto or cublaslt)");
    sdpa_note_ = "it failed its probe: " + options_.sdpa_refused;
    return;
  }
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
         "the self-check, " + std::to_string(refused) + " fell back; workspace " +
         std::to_string(sdpa_->workspace.bytes >> 20) + " MiB; " +
         (bf16_storage_ ? "on the bf16 rows of the datapath" : "fp32 activations rounded to bf16 for each call and back") +
         "), else ";
}

int CudaModel::sdpa_staged_rows() const { return sdpa_ ? sdpa_->plan.staged_rows : 0; }

model::EngineBuildStats CudaModel::engine_build_stats() const {
  if (!sdpa_) return {};
  const kc::SdpaBuildStats stats = sdpa_->engine->build_stats();
  return {stats.graphs, stats.seconds};
}

bool CudaModel::sdpa_for_batch(const Batch& batch) {
  if (!sdpa_) return false;
  SdpaState& st = *sdpa_;
  const model::AttentionShape shape{cfg_.n_head, cfg_.kv_heads(), cfg_.head_dim()};
  model::plan_sdpa(st.plan, batch.cu_seqlens.data(), batch.num_pieces(),
                   batch.pos_offset.empty() ? nullptr : batch.pos_offset.data(), shape,
                   model::sdpa_score_budget(batch.N, cfg_.block_size));
  // Buffers first: the self-check of a new bucket runs on them. The bf16-storage datapath's
  // rows, Stats and staging are its arena's (carve_arena).
  const size_t N = batch.N, W = shape.row_width(), C = shape.q_width(), R = st.plan.staged_rows;
  if (!bf16_storage_) {
    const size_t tail = model::kSdpaTailRows, KV = shape.kv_width();
    const bool rows = st.qkv16.try_ensure(sizeof(kc::bf16) * N * W, stream_, sizeof(kc::bf16) * tail * W) &&
                      st.dqkv16.try_ensure(sizeof(kc::bf16) * N * W, stream_, sizeof(kc::bf16) * tail * W) &&
                      st.out16.try_ensure(sizeof(kc::bf16) * N * C, stream_, sizeof(kc::bf16) * tail * C) &&
                      st.dout16.try_ensure(sizeof(kc::bf16) * N * C, stream_, sizeof(kc::bf16) * tail * C) &&
                      st.staged.try_ensure(sizeof(kc::bf16) * std::max<size_t>(R, 1) * KV, stream_,
                                           sizeof(kc::bf16) * tail * KV) &&
                      st.staged_grad.try_ensure(sizeof(kc::bf16) * std::max<size_t>(R, 1) * KV, stream_,
                                                sizeof(kc::bf16) * tail * KV);
    if (!rows) return sdpa_short_of_memory("its bf16 rows for micro-batches of " + std::to_string(N) + " tokens");
    if (N > st.stats_rows) {
      if (!st.stats.try_ensure(sizeof(float) * cfg_.n_layer * N * shape.n_head, stream_,
                               sizeof(float) * tail * shape.n_head))
        return sdpa_short_of_memory("its Stats for micro-batches of " + std::to_string(N) + " tokens");
      st.stats_rows = N;
    }
  }
  const std::vector<int32_t> blocks = st.plan.descriptor_blocks(&st.descriptor_offsets);
  if (!st.descriptors.try_ensure(sizeof(int32_t) * std::max<size_t>(blocks.size(), 1), stream_))
    return sdpa_short_of_memory("its call descriptors");
  for (const model::SdpaCall* call : st.plan.calls()) {
    if (!sdpa_bucket_usable(*call)) return false;
    if (!st.workspace.try_ensure(std::max<size_t>(st.engine->workspace_bytes(*call), 1), stream_))
      return sdpa_short_of_memory("cuDNN's workspace for " + call->bucket.text());
  }
  // The descriptors go up on the compute stream, after the previous micro-batch's kernels read
  // theirs; the pinned buffer is rewritten only once its previous copy has left it.
  if (st.descriptors_pending) KILTER_CUDA_CHECK(cudaEventSynchronize(st.descriptors_copied));
  if (blocks.size() > st.host_descriptor_ints) {
    cudaFreeHost(st.host_descriptors);
    st.host_descriptors = nullptr;
    st.host_descriptor_ints = 0;
    KILTER_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&st.host_descriptors), sizeof(int32_t) * blocks.size()));
    st.host_descriptor_ints = blocks.size();
  }
  std::copy(blocks.begin(), blocks.end(), st.host_descriptors);
  KILTER_CUDA_CHECK(cudaMemcpyAsync(st.descriptors.ptr, st.host_descriptors, sizeof(int32_t) * blocks.size(),
                                    cudaMemcpyHostToDevice, stream_));
  KILTER_CUDA_CHECK(cudaEventRecord(st.descriptors_copied, stream_));
  st.descriptors_pending = true;
  return true;
}

bool CudaModel::sdpa_short_of_memory(const std::string& what) {
  KILTER_CHECK(options_.attention != "sdpa", "train.attention=sdpa: no device memory on device "
                                                 << device_ << " for cuDNN SDPA attention's " << what
                                                 << " (lower data.max_tokens, or use train.attention=auto)");
  // Under auto: this micro-batch runs on the other attention engines, and a later one asks again.
  if (sdpa_->short_of_memory.insert(what).second)
    std::fprintf(stderr, "kilter: cuda backend: warning: no device memory for cuDNN SDPA attention's %s; such "
                 "micro-batches use the other attention engines until it fits\n", what.c_str());
  return false;
}

bool CudaModel::sdpa_bucket_usable(const model::SdpaCall& call) {
  SdpaState& st = *sdpa_;
  const auto decided = st.decided.find(call.bucket);
  if (decided != st.decided.end()) return decided->second.empty();
  std::string why;
  bool retry = false;
  const bool cut_refused = call.keys == model::SdpaKeyRows::staged && !options_.sdpa_cut_refused.empty();
  if (cut_refused) why = "its probe on later parts of cut pieces failed: " + options_.sdpa_cut_refused;
  const bool usable = !cut_refused && st.engine->prepare(call, &why) && sdpa_agrees(call, &why, &retry);
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

namespace {

// The self-check's problem and both engines' answers, carved from one scratch allocation: fp32
// rows (the cuBLASLt engine's, and the SDPA answers converted back), the SDPA engine's bf16 rows
// and Stats, and the cuBLASLt engine's saved softmax and workspace for its largest entry.
struct SelfCheckScratch {
  float *qkv, *dout, *prefix_rows;
  float *out_sdpa, *dqkv_sdpa, *prefix_dkv_sdpa, *out_ref, *dqkv_ref, *prefix_dkv_ref;
  float *saved, *workspace;
  int32_t* lengths;
  unsigned* result;  // the comparisons' maxima, three pairs (max_difference_on_device)
  kc::bf16 *qkv16, *dout16, *staged16;  // what SDPA reads, converted from the fp32 rows
  SdpaRows rows;                        // SDPA's bf16 rows and Stats
  std::vector<const float*> prefix_kv;  // per piece: its prefix rows (later parts), else null
  std::vector<float*> dkv_sdpa, dkv_ref;

  size_t carve(ArenaCarver& carver, const model::SdpaPlan& plan, int pieces, size_t att, size_t work, int entries) {
    const model::AttentionShape& shape = plan.shape;
    const size_t N = plan.tokens, W = shape.row_width(), C = shape.q_width(), kv = shape.kv_width();
    const size_t R = std::max(plan.staged_rows, 1);
    auto take_bf16 = [&](size_t elements) { return reinterpret_cast<kc::bf16*>(carver.take((elements + 1) / 2)); };
    qkv = carver.take(N * W), dout = carver.take(N * C), prefix_rows = carver.take(R * kv);
    out_sdpa = carver.take(N * C), dqkv_sdpa = carver.take(N * W), prefix_dkv_sdpa = carver.take(R * kv);
    out_ref = carver.take(N * C), dqkv_ref = carver.take(N * W), prefix_dkv_ref = carver.take(R * kv);
    saved = carver.take(att), workspace = carver.take(work), lengths = carver.take_ints(entries);
    result = reinterpret_cast<unsigned*>(carver.take(6));
    qkv16 = take_bf16(N * W), dout16 = take_bf16(N * C), staged16 = take_bf16(R * kv);
    rows = {qkv16, staged16, take_bf16(N * C), dout16, take_bf16(N * W), take_bf16(R * kv), carver.take(N * shape.n_head)};
    // Each later part's prefix rows and their dK/dV sit at its staged rows (the staging map's).
    prefix_kv.assign(pieces, nullptr), dkv_sdpa.assign(pieces, nullptr), dkv_ref.assign(pieces, nullptr);
    for (const model::SdpaStagedRows& run : plan.staging)
      if (run.from_prefix && prefix_rows != nullptr) {
        const size_t at = static_cast<size_t>(run.staged_row) * kv;
        prefix_kv[run.piece] = prefix_rows + at, dkv_sdpa[run.piece] = prefix_dkv_sdpa + at;
        dkv_ref[run.piece] = prefix_dkv_ref + at;
      }
    return carver.used();
  }
};

// The problem's rows (attention_self_check.h: bf16 values, each of the call's rows seeing its own
// key first, so that a mask off by one key shows), and every answer zeroed (rows outside a call
// stay 0 on both sides).
void self_check_inputs(const SelfCheckScratch& x, const model::SdpaPlan& plan, const model::SdpaCall& call,
                       cudaStream_t stream) {
  const model::AttentionShape& shape = plan.shape;
  const size_t N = plan.tokens, W = shape.row_width(), C = shape.q_width(), kv = shape.kv_width();
  const size_t R = std::max(plan.staged_rows, 1);
  std::vector<model::RowSpan> spans;
  for (int e = 0; e < call.entries; ++e)
    spans.push_back({static_cast<int>(call.offset_o[e] / static_cast<int32_t>(C)), call.seq_len_q[e]});
  const std::vector<float> qkv = model::self_check_qkv(N, shape, spans, 12345u),
                           dout = model::self_check_rows(N * C, 54321u), prefix = model::self_check_rows(R * kv, 777u);
  KILTER_CUDA_CHECK(cudaMemcpyAsync(x.qkv, qkv.data(), sizeof(float) * qkv.size(), cudaMemcpyHostToDevice, stream));
  KILTER_CUDA_CHECK(cudaMemcpyAsync(x.dout, dout.data(), sizeof(float) * dout.size(), cudaMemcpyHostToDevice, stream));
  KILTER_CUDA_CHECK(cudaMemcpyAsync(x.prefix_rows, prefix.data(), sizeof(float) * prefix.size(), cudaMemcpyHostToDevice,
                                    stream));
  for (float* rows : {x.out_sdpa, x.out_ref}) KILTER_CUDA_CHECK(cudaMemsetAsync(rows, 0, sizeof(float) * N * C, stream));
  for (float* rows : {x.dqkv_sdpa, x.dqkv_ref}) KILTER_CUDA_CHECK(cudaMemsetAsync(rows, 0, sizeof(float) * N * W, stream));
  for (float* rows : {x.prefix_dkv_sdpa, x.prefix_dkv_ref})
    KILTER_CUDA_CHECK(cudaMemsetAsync(rows, 0, sizeof(float) * R * kv, stream));
  KILTER_CUDA_CHECK(cudaMemsetAsync(x.rows.out, 0, sizeof(kc::bf16) * N * C, stream));
  KILTER_CUDA_CHECK(cudaMemsetAsync(x.rows.dqkv, 0, sizeof(kc::bf16) * N * W, stream));
  KILTER_CUDA_CHECK(cudaMemsetAsync(x.rows.staged_grad, 0, sizeof(kc::bf16) * R * kv, stream));
}

// The cuBLASLt engine, entry by entry: a whole piece is a (1, L) batch on its own rows; a later
// part runs against its prefix (attention_prefix_*, bottom-right).
void self_check_reference(kc::Gemm& gemm, const model::SdpaCall& call, const model::SdpaPlan& plan,
                          const SelfCheckScratch& x, cudaStream_t stream) {
  const model::AttentionShape& shape = plan.shape;
  const int C = shape.q_width(), W = shape.row_width(), NH = shape.n_head, NKV = shape.n_kv_head;
  const bool later = call.keys == model::SdpaKeyRows::staged;
  std::vector<int32_t> entry_lengths(call.seq_len_q.begin(), call.seq_len_q.begin() + call.entries);
  KILTER_CUDA_CHECK(cudaMemcpyAsync(x.lengths, entry_lengths.data(), sizeof(int32_t) * call.entries,
                                    cudaMemcpyHostToDevice, stream));
  KILTER_CUDA_CHECK(cudaStreamSynchronize(stream));  // entry_lengths leaves scope
  for (int e = 0; e < call.entries; ++e) {
    const int piece = call.piece[e], L = call.seq_len_q[e], s = call.seq_len_kv[e] - L;
    const size_t row = static_cast<size_t>(call.offset_o[e]) / C;
    if (later) {
      kc::attention_prefix_forward(gemm, x.out_ref + row * C, x.saved, x.qkv + row * W, x.prefix_kv[piece], s, L, C,
                                   NH, x.workspace, NKV);
      kc::attention_prefix_backward(gemm, x.dqkv_ref + row * W, x.dkv_ref[piece], x.dout + row * C, x.qkv + row * W,
                                    x.prefix_kv[piece], x.saved, s, L, C, NH, x.workspace, NKV);
    } else {
      kc::attention_forward(gemm, x.out_ref + row * C, x.saved, x.qkv + row * W, x.lengths + e, 1, L, C, NH,
                            x.workspace, NKV);
      kc::attention_backward(gemm, x.dqkv_ref + row * W, x.dout + row * C, x.qkv + row * W, x.saved, x.lengths + e, 1,
                             L, C, NH, x.workspace, /*accumulate=*/false, NKV);
    }
  }
}

}  // namespace

bool CudaModel::sdpa_agrees(const model::SdpaCall& call, std::string* why, bool* retry) {
  *retry = false;
  SdpaState& st = *sdpa_;
  const model::SdpaPlan& plan = st.plan;
  const model::AttentionShape& shape = plan.shape;
  const int C = shape.q_width(), NH = shape.n_head, W = shape.row_width(), kv = shape.kv_width();
  const size_t N = plan.tokens, R = std::max(plan.staged_rows, 1);
  const bool later = call.keys == model::SdpaKeyRows::staged;
  // The cuBLASLt engine's scratch for the largest entry: its saved softmax and workspace.
  size_t att = 1, work = 1;
  for (int e = 0; e < call.entries; ++e) {
    const int L = call.seq_len_q[e], s = call.seq_len_kv[e] - L;
    att = std::max(att, static_cast<size_t>(NH) * L * (s + L));
    work = std::max(work, later ? kc::attention_prefix_workspace_floats(s, L, C, NH) : kc::attention_workspace_floats(1, L, C, NH));
  }
  SelfCheckScratch x;
  ArenaCarver measure(nullptr);
  // The tail: rows of slack past the last slice; the whole scratch is zeroed below, so that no
  // tile past a slice's last row reads memory nothing wrote.
  const size_t floats = x.carve(measure, plan, layout_now_.pieces, att, work, call.entries) +
                        static_cast<size_t>(model::kSdpaTailRows) * W;
  float* scratch = nullptr;
  const cudaError_t status = cudaMalloc(reinterpret_cast<void**>(&scratch), sizeof(float) * floats);
  if (status != cudaSuccess) {
    cudaGetLastError();
    *why = std::string("no device memory for the self-check (") + cudaGetErrorString(status) + ")";
    *retry = true;
    return false;
  }
  ArenaCarver carver(scratch);
  x.carve(carver, plan, layout_now_.pieces, att, work, call.entries);
  const model::AttentionPrefix prefix_sdpa{nullptr, x.prefix_kv.data(), x.dkv_sdpa.data()};
  bool ran = false;
  double out_error = 0.0, grad_error = 0.0, prefix_error = 0.0;
  try {
    KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the previous micro-batch may still read the descriptors
    KILTER_CUDA_CHECK(cudaMemsetAsync(scratch, 0, sizeof(float) * floats, stream_));
    self_check_inputs(x, plan, call, stream_);
    std::vector<size_t> offsets;
    const std::vector<int32_t> blocks = plan.descriptor_blocks(&offsets);
    KILTER_CUDA_CHECK(cudaMemcpyAsync(st.descriptors.ptr, blocks.data(), sizeof(int32_t) * blocks.size(),
                                      cudaMemcpyHostToDevice, stream_));
    KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));  // `blocks` leaves scope
    if (!st.workspace.try_ensure(std::max<size_t>(st.engine->workspace_bytes(call), 1), stream_)) {
      *why = "no device memory for cuDNN's workspace";
      *retry = true;
      cudaFree(scratch);
      return false;
    }
    // SDPA, as the layers run it.
    kc::rows_to_bf16(x.qkv16, W, x.qkv, W, N, W, stream_);
    kc::rows_to_bf16(x.dout16, C, x.dout, C, N, C, stream_);
    if (later) kc::sdpa_stage_keys(plan, prefix_sdpa, x.qkv, x.staged16, stream_);
    st.forward(call, x.rows, stream_);
    st.backward(call, x.rows, stream_);
    kc::rows_to_fp32(x.out_sdpa, C, x.rows.out, C, N, C, false, stream_);
    kc::rows_to_fp32(x.dqkv_sdpa, W, x.rows.dqkv, W, N, W, false, stream_);
    if (later) kc::sdpa_unstage_key_grads(plan, prefix_sdpa, x.rows.staged_grad, x.dqkv_sdpa, stream_);
    self_check_reference(*gemm_, call, plan, x, stream_);
    // Compared on the device: 24 bytes come back, not the rows.
    KILTER_CUDA_CHECK(cudaMemsetAsync(x.result, 0, sizeof(unsigned) * 6, stream_));
    max_difference_on_device(x.result, x.out_sdpa, x.out_ref, N * C, stream_);
    max_difference_on_device(x.result + 2, x.dqkv_sdpa, x.dqkv_ref, N * W, stream_);
    if (later) max_difference_on_device(x.result + 4, x.prefix_dkv_sdpa, x.prefix_dkv_ref, R * kv, stream_);
    unsigned maxima[6] = {0, 0, 0, 0, 0, 0};
    KILTER_CUDA_CHECK(cudaMemcpyAsync(maxima, x.result, sizeof(maxima), cudaMemcpyDeviceToHost, stream_));
    KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));
    out_error = relative_difference_of(maxima);
    grad_error = relative_difference_of(maxima + 2);
    prefix_error = later ? relative_difference_of(maxima + 4) : 0.0;
    ran = true;
  } catch (const Error& e) {
    *why = std::string("self-check failed to run: ") + e.what();
    cudaStreamSynchronize(stream_);  // queued kernels may still use the scratch
    cudaGetLastError();
  }
  cudaFree(scratch);
  if (!ran) return false;
  const double tolerance = model::kAttentionSelfCheckTolerance;
  if (out_error <= tolerance && grad_error <= tolerance && prefix_error <= tolerance) return true;
  char text[240];
  std::snprintf(text, sizeof(text), "self-check against cuBLASLt attention: relative difference %.3g in out, %.3g in dqkv, "
                "%.3g in the prefixes' dK/dV (limit %.0e)", out_error, grad_error, prefix_error, tolerance);
  *why = text;
  return false;
}

// The schedule's pieces (block_schedule.h): without_prefix runs the whole pieces, with_prefix the
// later parts (their prefixes staged) and what follows them; all, both. The exchange's calls sit
// between them, in the schedule.
void CudaModel::sdpa_forward_layer(int layer, const BlockActivations& a, float* out, model::AttentionPieces which) {
  SdpaState& st = *sdpa_;
  const int C = cfg_.n_embd, W = cfg_.qkv_width(), N = layout_now_.N;
  const SdpaRows rows = st.fp32_datapath_rows(layer);
  if (which != model::AttentionPieces::with_prefix) {
    kc::rows_to_bf16(st.qkv16.as<kc::bf16>(), W, a.qkv, W, N, W, s_);
    st.forward_all(st.plan.whole, rows, s_);
  }
  if (which == model::AttentionPieces::without_prefix) return;
  if (!st.plan.later.empty()) {
    const LaterPrefixes prefixes(st.plan, exchange_, layer, layout_now_.pieces, /*grads=*/false);
    kc::sdpa_stage_keys(st.plan, prefixes.view(), a.qkv, st.staged.as<kc::bf16>(), s_);
    st.forward_all(st.plan.later, rows, s_);
  }
  kc::rows_to_fp32(out, C, st.out16.as<kc::bf16>(), C, N, C, false, s_);
}

void CudaModel::sdpa_backward_layer(int layer, const BlockActivations& a, model::AttentionPieces which) {
  SdpaState& st = *sdpa_;
  const int C = cfg_.n_embd, W = cfg_.qkv_width(), N = layout_now_.N;
  float* dqkv = acts_.dqkv;
  const SdpaRows rows = st.fp32_datapath_rows(layer);
  if (which != model::AttentionPieces::without_prefix)
    st.backward_prefixes.emplace(st.plan, exchange_, layer, layout_now_.pieces, /*grads=*/true);
  const model::AttentionPrefix prefix = st.backward_prefixes->view();
  // The later parts first, so that their prefixes' dK/dV travel while the whole pieces run.
  if (which != model::AttentionPieces::without_prefix) {
    kc::rows_to_bf16(st.qkv16.as<kc::bf16>(), W, a.qkv, W, N, W, s_);
    kc::rows_to_bf16(st.out16.as<kc::bf16>(), C, a.atty, C, N, C, s_);  // exact: a.atty holds bf16 values
    kc::rows_to_bf16(st.dout16.as<kc::bf16>(), C, acts_.datty, C, N, C, s_);
    if (!st.plan.later.empty()) {
      kc::sdpa_stage_keys(st.plan, prefix, a.qkv, st.staged.as<kc::bf16>(), s_);
      st.backward_all(st.plan.later, rows, s_);
      kc::sdpa_unstage_key_grads(st.plan, prefix, st.staged_grad.as<kc::bf16>(), dqkv, s_,
                                 kc::SdpaUnstage::prefix_rows);
    }
  }
  if (which == model::AttentionPieces::with_prefix) return;
  st.backward_all(st.plan.whole, rows, s_);
  // dQ of every row and dK/dV of the whole pieces' rows, then the later parts' own dK/dV.
  kc::rows_to_fp32(dqkv, W, st.dqkv16.as<kc::bf16>(), W, N, W, false, s_);
  if (!st.plan.later.empty())
    kc::sdpa_unstage_key_grads(st.plan, prefix, st.staged_grad.as<kc::bf16>(), dqkv, s_, kc::SdpaUnstage::own_rows);
}

// ---- the bf16-storage datapath (its op table's attention entries call these where batch_sdpa_) --

void CudaModel::sdpa_forward_bf16(int layer, const BlockBf16& a, kc::bf16* out, model::AttentionPieces which) {
  SdpaState& st = *sdpa_;
  const ActivationsBf16& x = bacts_;
  SdpaRows rows;
  rows.qkv = a.qkv, rows.staged = x.sdpa_staged, rows.out = out, rows.stats = a.stats;
  if (which != model::AttentionPieces::with_prefix) st.forward_all(st.plan.whole, rows, s_);
  if (which == model::AttentionPieces::without_prefix || st.plan.later.empty()) return;
  // The later parts, against the prefixes the exchange holds.
  const LaterPrefixes prefixes(st.plan, exchange_, layer, layout_now_.pieces, /*grads=*/false);
  kc::sdpa_stage_keys(st.plan, prefixes.view(), a.qkv, x.sdpa_staged, s_);
  st.forward_all(st.plan.later, rows, s_);
}

void CudaModel::sdpa_backward_bf16(int layer, const BlockBf16& a, model::AttentionPieces which) {
  SdpaState& st = *sdpa_;
  const ActivationsBf16& x = bacts_;
  // O is the layer's kept output (a recomputation wrote the same bits elsewhere), Stats the
  // forward's or the recomputation's.
  const SdpaRows rows{a.qkv, x.sdpa_staged, a.atty, x.datty, x.dqkv, x.sdpa_staged_grad, a.stats};
  if (which != model::AttentionPieces::without_prefix)
    st.backward_prefixes.emplace(st.plan, exchange_, layer, layout_now_.pieces, /*grads=*/true);
  const model::AttentionPrefix prefix = st.backward_prefixes->view();
  // The later parts first, so that their prefixes' dK/dV travel while the whole pieces run.
  if (which != model::AttentionPieces::without_prefix && !st.plan.later.empty()) {
    kc::sdpa_stage_keys(st.plan, prefix, a.qkv, x.sdpa_staged, s_);
    st.backward_all(st.plan.later, rows, s_);
    kc::sdpa_unstage_key_grads(st.plan, prefix, x.sdpa_staged_grad, x.dqkv, s_, kc::SdpaUnstage::prefix_rows);
  }
  if (which == model::AttentionPieces::with_prefix) return;
  st.backward_all(st.plan.whole, rows, s_);
  if (!st.plan.later.empty())
    kc::sdpa_unstage_key_grads(st.plan, prefix, x.sdpa_staged_grad, x.dqkv, s_, kc::SdpaUnstage::own_rows);
}

}  // namespace kilter::backend
