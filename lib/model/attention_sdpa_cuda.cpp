// The cuDNN SDPA engine (attention_sdpa.h): cudnn-frontend graphs for the calls that
// lib/model/sdpa_plan.h describes, cached per bucket. The ONE translation unit that includes
// cudnn_frontend.h (built with CUDNN_FRONTEND_SKIP_JSON_LIB: no serialization, half the compile).
// It holds no kernels, so it is host C++ (attention_sdpa_rows.cu has the kernels): one compile,
// not one per CUDA architecture as nvcc would do.
//
// Every tensor comes from the plan: dims and strides of its layout, its ragged offset array, the
// seq_len arrays of the padding mask, all read from the call's descriptor block on the device, so
// one graph serves every micro-batch of its bucket. The causal mask is the diagonal band's right
// bound 0, top-left for whole pieces, bottom-right for later parts (the alignment is per entry,
// from its seq_len_q and seq_len_kv). Stats are packed by rows (B, H, S, 1) with a ragged offset:
// head-major ragged Stats returned zeros in the backward on some cuDNN versions (frontend issue
// #462). The backward asks for the deterministic algorithm and bounds its workspace by the
// bucket's rows (max_total_seq_len).
#include <cudnn.h>

#include <cstring>  // before the frontend, whose shim uses std::strlen without it
#include <cudnn_frontend.h>

#include <chrono>
#include <cmath>
#include <map>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "io/base/cuda_common.h"
#include "lib/model/attention_sdpa.h"

namespace kilter::model::cuda {

namespace {

namespace fe = cudnn_frontend;
using Graph = fe::graph::Graph;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

// The tensors' uids: the variant pack of an execution names them.
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kSeqQ, kSeqKv, kOffQ, kOffK, kOffV, kOffO, kOffStats, kDO, kDQ, kDK, kDV
};

std::vector<int64_t> vec(const std::array<int64_t, 4>& a) { return {a[0], a[1], a[2], a[3]}; }

// sm_version > 0: the target without a device (the nodes copy the graph's context when they are
// added, so it is set first); 0: the current device's.
std::shared_ptr<Graph> new_graph(int sm_version) {
  auto graph = std::make_shared<Graph>();
  if (sm_version > 0) graph->set_sm_version(sm_version);
  graph->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return graph;
}

// An int32 (n, 1, 1, 1) tensor: seq_len or ragged offsets.
TensorPtr index_tensor(Graph& graph, const char* name, int64_t uid, int64_t n) {
  return graph.tensor(fe::graph::Tensor_attributes()
                          .set_name(name)
                          .set_uid(uid)
                          .set_dim({n, 1, 1, 1})
                          .set_stride({1, 1, 1, 1})
                          .set_data_type(fe::DataType_t::INT32));
}

TensorPtr row_tensor(Graph& graph, const char* name, int64_t uid, const SdpaTensorLayout& layout, TensorPtr offsets) {
  auto t = graph.tensor(
      fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(vec(layout.dim)).set_stride(vec(layout.stride)));
  t->set_ragged_offset(std::move(offsets));
  return t;
}

// Sets a graph output's layout (the frontend infers the rest).
void as_output(const TensorPtr& t, int64_t uid, const SdpaTensorLayout& layout, TensorPtr offsets) {
  t->set_output(true).set_uid(uid).set_dim(vec(layout.dim)).set_stride(vec(layout.stride));
  t->set_ragged_offset(std::move(offsets));
}

struct CallTensors {
  TensorPtr seq_q, seq_kv, off_q, off_k, off_v, off_o, off_stats;
};

CallTensors index_tensors(Graph& graph, const SdpaBucket& bucket) {
  const int64_t B = bucket.batch;
  return {index_tensor(graph, "seq_len_q", kSeqQ, B),          index_tensor(graph, "seq_len_kv", kSeqKv, B),
          index_tensor(graph, "offset_q", kOffQ, B + 1),        index_tensor(graph, "offset_k", kOffK, B + 1),
          index_tensor(graph, "offset_v", kOffV, B + 1),        index_tensor(graph, "offset_o", kOffO, B + 1),
          index_tensor(graph, "offset_stats", kOffStats, B + 1)};
}

fe::DiagonalAlignment_t alignment(const SdpaBucket& bucket) {
  return bucket.bottom_right ? fe::DiagonalAlignment_t::BOTTOM_RIGHT : fe::DiagonalAlignment_t::TOP_LEFT;
}

float attention_scale(const AttentionShape& shape) { return 1.0f / std::sqrt(static_cast<float>(shape.head_dim)); }

std::shared_ptr<Graph> forward_graph(const SdpaCall& call, const AttentionShape& shape, int sm_version = 0) {
  auto graph = new_graph(sm_version);
  const CallTensors idx = index_tensors(*graph, call.bucket);
  auto Q = row_tensor(*graph, "Q", kQ, call.q, idx.off_q);
  auto K = row_tensor(*graph, "K", kK, call.k, idx.off_k);
  auto V = row_tensor(*graph, "V", kV, call.v, idx.off_v);
  auto options = fe::graph::SDPA_attributes()
                     .set_name("sdpa_forward")
                     .set_generate_stats(true)
                     .set_attn_scale(attention_scale(shape))
                     .set_padding_mask(true)
                     .set_seq_len_q(idx.seq_q)
                     .set_seq_len_kv(idx.seq_kv)
                     .set_diagonal_alignment(alignment(call.bucket))
                     .set_diagonal_band_right_bound(0);
  auto [O, Stats] = graph->sdpa(Q, K, V, options);
  as_output(O, kO, call.o, idx.off_o);
  as_output(Stats, kStats, call.stats, idx.off_stats);
  Stats->set_data_type(fe::DataType_t::FLOAT);
  return graph;
}

std::shared_ptr<Graph> backward_graph(const SdpaCall& call, const AttentionShape& shape, int sm_version = 0) {
  auto graph = new_graph(sm_version);
  const CallTensors idx = index_tensors(*graph, call.bucket);
  auto Q = row_tensor(*graph, "Q", kQ, call.q, idx.off_q);
  auto K = row_tensor(*graph, "K", kK, call.k, idx.off_k);
  auto V = row_tensor(*graph, "V", kV, call.v, idx.off_v);
  auto O = row_tensor(*graph, "O", kO, call.o, idx.off_o);
  auto dO = row_tensor(*graph, "dO", kDO, call.o, idx.off_o);
  auto Stats = row_tensor(*graph, "Stats", kStats, call.stats, idx.off_stats);
  Stats->set_data_type(fe::DataType_t::FLOAT);
  auto options = fe::graph::SDPA_backward_attributes()
                     .set_name("sdpa_backward")
                     .set_attn_scale(attention_scale(shape))
                     .set_padding_mask(true)
                     .set_seq_len_q(idx.seq_q)
                     .set_seq_len_kv(idx.seq_kv)
                     .set_diagonal_alignment(alignment(call.bucket))
                     .set_diagonal_band_right_bound(0)
                     .set_deterministic_algorithm(true)
                     .set_max_total_seq_len_q(call.bucket.rows_q)
                     .set_max_total_seq_len_kv(call.bucket.rows_kv);
  auto [dQ, dK, dV] = graph->sdpa_backward(Q, K, V, O, dO, Stats, options);
  as_output(dQ, kDQ, call.q, idx.off_q);
  as_output(dK, kDK, call.k, idx.off_k);
  as_output(dV, kDV, call.v, idx.off_v);
  return graph;
}

std::string frontend_message(fe::error_t status) {  // its getters are not const
  std::string text = status.get_message();
  return text.empty() ? "cudnn-frontend error " + std::to_string(static_cast<int>(status.get_code())) : text;
}

std::string cudnn_version_text() {
  const size_t v = cudnnGetVersion();
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

}  // namespace

bool sdpa_validate_graphs(const SdpaCall& call, const AttentionShape& shape, int sm_version, std::string* why) {
  if (call.empty()) return true;
  for (bool forward : {true, false}) {
    std::shared_ptr<Graph> graph =
        forward ? forward_graph(call, shape, sm_version) : backward_graph(call, shape, sm_version);
    fe::error_t status = graph->validate();
    if (!status.is_good()) {
      if (why != nullptr)
        *why = std::string(forward ? "forward" : "backward") + " graph for " + call.bucket.text() + ": " + frontend_message(status);
      return false;
    }
  }
  return true;
}

struct SdpaAttention::Impl {
  struct Built {
    bool ok = false;
    std::string why;
    std::shared_ptr<Graph> forward, backward;
    int64_t forward_workspace = 0, backward_workspace = 0;
  };
  AttentionShape shape;
  cudnnHandle_t handle = nullptr;
  std::map<SdpaBucket, Built> built;
  SdpaBuildStats stats;

  Built& build(const SdpaCall& call) {
    auto [it, inserted] = built.try_emplace(call.bucket);
    Built& b = it->second;
    if (!inserted) return b;
    const auto start = std::chrono::steady_clock::now();
    b.forward = forward_graph(call, shape);
    b.backward = backward_graph(call, shape);
    // Heuristics mode A, then the fallback list: the first engine that supports the graph.
    for (auto* graph : {&b.forward, &b.backward}) {
      fe::error_t status = (*graph)->build(handle, {fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK});
      ++stats.graphs;
      if (!status.is_good()) {
        b.why = std::string(graph == &b.forward ? "forward" : "backward") + " graph for " + call.bucket.text() + ": " +
                frontend_message(status);
        break;
      }
    }
    b.ok = b.why.empty();
    if (b.ok) {
      b.ok = b.forward->get_workspace_size(b.forward_workspace).is_good() &&
             b.backward->get_workspace_size(b.backward_workspace).is_good();
      if (!b.ok) b.why = "cuDNN could not size the workspace of " + call.bucket.text();
    }
    stats.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return b;
  }

  const Built& ready(const SdpaCall& call) {
    const Built& b = build(call);
    KILTER_CHECK(b.ok, "SDPA attention: " << b.why);
    return b;
  }

  void execute(const Graph& graph, std::unordered_map<int64_t, void*>& pack, const SdpaCall& call,
               const int32_t* descriptors, void* workspace, cudaStream_t stream) {
    auto at = [&](SdpaCall::Array array) {
      return const_cast<int32_t*>(descriptors) + SdpaCall::descriptor_index(call.bucket.batch, array);
    };
    pack[kSeqQ] = at(SdpaCall::seq_q_array);
    pack[kSeqKv] = at(SdpaCall::seq_kv_array);
    pack[kOffQ] = at(SdpaCall::q_offsets);
    pack[kOffK] = at(SdpaCall::k_offsets);
    pack[kOffV] = at(SdpaCall::v_offsets);
    pack[kOffO] = at(SdpaCall::o_offsets);
    pack[kOffStats] = at(SdpaCall::stats_offsets);
    const cudnnStatus_t set = cudnnSetStream(handle, stream);
    KILTER_CHECK(set == CUDNN_STATUS_SUCCESS, "cudnnSetStream failed: " << cudnnGetErrorString(set));
    fe::error_t status = graph.execute(handle, pack, workspace);
    KILTER_CHECK(status.is_good(), "SDPA attention (" << call.bucket.text() << "): " << frontend_message(status));
  }
};

SdpaAttention::SdpaAttention(const AttentionShape& shape) : impl_(std::make_unique<Impl>()) {
  impl_->shape = shape;
  std::string why;
  KILTER_CHECK(sdpa_shape_supported(shape, &why), "SDPA attention: " << why);
  KILTER_CHECK(cudnnGetVersion() >= 90600, "SDPA attention needs cuDNN >= 9.6 (ragged grouped-query heads, "
                                           "bottom-right causal backward); this is cuDNN " << cudnn_version_text());
  const cudnnStatus_t status = cudnnCreate(&impl_->handle);
  KILTER_CHECK(status == CUDNN_STATUS_SUCCESS, "cudnnCreate failed: " << cudnnGetErrorString(status));
}

SdpaAttention::~SdpaAttention() {
  impl_->built.clear();  // plans before the handle they were built with
  if (impl_->handle != nullptr) cudnnDestroy(impl_->handle);
}

bool SdpaAttention::prepare(const SdpaCall& call, std::string* why) {
  if (call.empty()) return true;
  const Impl::Built& b = impl_->build(call);
  if (!b.ok && why != nullptr) *why = b.why;
  return b.ok;
}

size_t SdpaAttention::workspace_bytes(const SdpaCall& call) {
  if (call.empty()) return 0;
  const Impl::Built& b = impl_->ready(call);
  return static_cast<size_t>(std::max(b.forward_workspace, b.backward_workspace));
}

void SdpaAttention::forward(const SdpaCall& call, const int32_t* descriptors, const bf16* qkv, const bf16* keys,
                            bf16* out, float* stats, void* workspace, cudaStream_t stream) {
  if (call.empty()) return;
  const Impl::Built& b = impl_->ready(call);
  std::unordered_map<int64_t, void*> pack = {
      {kQ, const_cast<bf16*>(qkv) + call.q.column},   {kK, const_cast<bf16*>(keys) + call.k.column},
      {kV, const_cast<bf16*>(keys) + call.v.column},  {kO, out + call.o.column},
      {kStats, stats}};
  impl_->execute(*b.forward, pack, call, descriptors, workspace, stream);
}

void SdpaAttention::backward(const SdpaCall& call, const int32_t* descriptors, const bf16* qkv, const bf16* keys,
                             const bf16* out, const bf16* dout, const float* stats, bf16* dqkv, bf16* dkeys,
                             void* workspace, cudaStream_t stream) {
  if (call.empty()) return;
  const Impl::Built& b = impl_->ready(call);
  std::unordered_map<int64_t, void*> pack = {
      {kQ, const_cast<bf16*>(qkv) + call.q.column},  {kK, const_cast<bf16*>(keys) + call.k.column},
      {kV, const_cast<bf16*>(keys) + call.v.column}, {kO, const_cast<bf16*>(out) + call.o.column},
      {kDO, const_cast<bf16*>(dout) + call.o.column}, {kStats, const_cast<float*>(stats)},
      {kDQ, dqkv + call.q.column},                   {kDK, dkeys + call.k.column},
      {kDV, dkeys + call.v.column}};
  impl_->execute(*b.backward, pack, call, descriptors, workspace, stream);
}

SdpaBuildStats SdpaAttention::build_stats() const { return impl_->stats; }

std::string SdpaAttention::description() const {
  std::ostringstream text;
  text << "cuDNN " << cudnn_version_text() << " SDPA flash attention (cudnn-frontend " << CUDNN_FRONTEND_MAJOR_VERSION
       << "." << CUDNN_FRONTEND_MINOR_VERSION << "." << CUDNN_FRONTEND_PATCH_VERSION
       << "), bf16, deterministic backward, " << impl_->stats.graphs << " graphs built in " << impl_->stats.seconds
       << " s";
  return text.str();
}

}  // namespace kilter::model::cuda
