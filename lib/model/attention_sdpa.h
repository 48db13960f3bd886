// cuDNN's fused flash attention (SDPA, through cudnn-frontend) on a packed micro-batch: the
// engine's interface, usable without the frontend's headers (only attention_sdpa_cuda.cpp includes
// them, so one translation unit pays their compile time). The host side, what a call reads, is
// lib/model/sdpa_plan.h; docs/gpu.md ("cuDNN SDPA") says how it is used and what has run.
//
// Per layer, the calls of sdpa_plan.h: the whole pieces, causal, with Q/K/V as strided views of
// the packed qkv rows and O, dQ, dK, dV straight in the packed rows; and the later parts of cut
// pieces, causal aligned bottom-right, over their staged K/V rows (each kind one call, or several
// within the score budget). cuDNN's SDPA takes fp16/bf16 only: the rows are bf16, the
// bf16-storage datapath's own; the conversion kernels below serve the fp32-activation datapath.
// The backward runs cuDNN's deterministic algorithm, so reruns are bit-identical.
//
// Built only with KILTER_WITH_SDPA (cmake/KilterCudnn.cmake); the conversion and staging kernels
// (attention_sdpa_rows.cu) need no frontend.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>

#include "lib/model/attention.h"
#include "lib/model/sdpa_plan.h"

namespace kilter::model::cuda {

using bf16 = __nv_bfloat16;

// Graph building so far: graphs built (forward and backward count one each) and the host time
// it took (validate, operation graph, heuristics, plans: cuDNN may compile kernels at run time).
struct SdpaBuildStats {
  int graphs = 0;
  double seconds = 0.0;
};

class SdpaAttention {
 public:
  // Creates a cuDNN handle. Throws kilter::Error (with the reason) when cuDNN is older than 9.6
  // (GQA with ragged offsets, s_q != s_kv in the backward), the shape is not one SDPA takes
  // (sdpa_shape_supported), or cuDNN cannot be used here.
  explicit SdpaAttention(const AttentionShape& shape);
  ~SdpaAttention();
  SdpaAttention(const SdpaAttention&) = delete;
  SdpaAttention& operator=(const SdpaAttention&) = delete;

  // Builds, once per bucket, the forward and backward graphs of `call` (validate, operation
  // graph, heuristics, check_support, plans). False, with cuDNN's reason in *why, when cuDNN has
  // no engine for it; the answer is remembered per bucket.
  bool prepare(const SdpaCall& call, std::string* why);
  // Device workspace the call needs (forward or backward, the larger); after prepare().
  size_t workspace_bytes(const SdpaCall& call);

  // descriptors: the call's descriptor_block() in device memory. qkv: the packed (N, row_width)
  // rows; keys: the call's key rows (qkv again, or the staged (rows, kv_width) rows). out
  // (N, q_width) and stats (N, n_head floats) are written at the call's rows only.
  void forward(const SdpaCall& call, const int32_t* descriptors, const bf16* qkv, const bf16* keys, bf16* out,
               float* stats, void* workspace, cudaStream_t stream);
  // dQ into dqkv's query columns at the call's rows; dK and dV into dkeys (dqkv again for whole
  // pieces, the staged gradient rows for later parts), overwritten there.
  void backward(const SdpaCall& call, const int32_t* descriptors, const bf16* qkv, const bf16* keys, const bf16* out,
                const bf16* dout, const float* stats, bf16* dqkv, bf16* dkeys, void* workspace, cudaStream_t stream);

  SdpaBuildStats build_stats() const;
  // "cuDNN 9.19 SDPA (cudnn-frontend 1.32.0), bf16, deterministic backward"
  std::string description() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Without a device: builds the forward and backward graphs of `call` and runs the frontend's
// validate() for an SM version (90: H100/H200), no handle needed. False with the reason in *why.
// CI's check of the graphs (tests/unit/backend_sdpa_graph_test.cpp).
bool sdpa_validate_graphs(const SdpaCall& call, const AttentionShape& shape, int sm_version, std::string* why);

// ---- attention_sdpa_rows.cu: rows between the fp32 datapath and the engine's bf16 rows.
// dst (rows, cols) at row stride dst_ld = src (row stride src_ld), rounded to nearest even.
void rows_to_bf16(bf16* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows, int cols,
                  cudaStream_t stream);
// dst (rows, cols) fp32 = (or += with accumulate) src bf16.
void rows_to_fp32(float* dst, int64_t dst_ld, const bf16* src, int64_t src_ld, int64_t rows, int cols, bool accumulate,
                  cudaStream_t stream);
// The staged K/V rows of the later parts (plan.staging): each part's prefix rows (prefix.kv[piece],
// fp32 rows of kv_width) then its own rows (k|v columns of the fp32 qkv), as bf16 rows of kv_width.
void sdpa_stage_keys(const SdpaPlan& plan, const AttentionPrefix& prefix, const float* qkv, bf16* staged,
                     cudaStream_t stream);
// The staged rows' dK/dV back: prefix rows ADDED into prefix.dkv[piece] (kv_exchange.h's
// contract), own rows STORED into dqkv's k|v columns (fp32). `which` lets a caller send the
// prefixes' gradients before its own rows are final.
enum class SdpaUnstage { prefix_rows, own_rows, all };
void sdpa_unstage_key_grads(const SdpaPlan& plan, const AttentionPrefix& prefix, const bf16* staged_grad, float* dqkv,
                            cudaStream_t stream, SdpaUnstage which = SdpaUnstage::all);
// The same on bf16 rows (the bf16-storage datapath): own rows copied from qkv's k|v columns, and
// back into dqkv's, bit for bit; the prefixes stay fp32 (the exchange's rows), rounded to bf16 on
// the way in (exactly: they are bf16 values on their owner) and added in fp32 on the way back.
void sdpa_stage_keys(const SdpaPlan& plan, const AttentionPrefix& prefix, const bf16* qkv, bf16* staged,
                     cudaStream_t stream);
void sdpa_unstage_key_grads(const SdpaPlan& plan, const AttentionPrefix& prefix, const bf16* staged_grad, bf16* dqkv,
                            cudaStream_t stream, SdpaUnstage which = SdpaUnstage::all);
// dst (rows, cols) = src, bf16 rows at their strides (a strided copy, no rounding).
void rows_copy_bf16(bf16* dst, int64_t dst_ld, const bf16* src, int64_t src_ld, int64_t rows, int cols,
                    cudaStream_t stream);

}  // namespace kilter::model::cuda
