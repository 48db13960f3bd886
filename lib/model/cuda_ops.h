// The CUDA twins of the CPU model ops (lib/model/<op>.h) in namespace kilter::model::cuda: same
// arguments, on device pointers, plus the stream (and, for GEMM-based ops, the cuBLASLt engine
// and a scratch workspace) that the GPU needs. Backward functions ACCUMULATE into d* outputs like
// their CPU twins unless an `accumulate = false` argument asks them to overwrite (the model uses
// that to skip zero-fills). Kernels: lib/model/{encoder,layernorm,matmul,attention,gelu,
// crossentropy,adamw}.cu. Tests: tests/gpu/gpu_ops_test.cu compares each with its CPU twin.
// The bf16-storage datapath's kernels (train.bf16_storage; bf16 activations in and out, fp32
// math inside) are declared at the end; their CPU twins are lib/model/bf16_ops.h and
// attention_bf16.h.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>

#include "lib/model/kernel_scratch.h"

namespace kilter::model::cuda {

using bf16 = __nv_bfloat16;  // an activation of the bf16-storage datapath

// GEMM math. fp32: CUBLAS_COMPUTE_32F (IEEE fp32, like the CPU). bf16: fp32 data in memory,
// bf16 tensor-core products with fp32 accumulation (CUBLAS_COMPUTE_32F_FAST_16BF).
enum class GemmMath { fp32, bf16 };

// cuBLASLt handle, workspace and a cache of matmul descriptors + chosen algorithms per shape, so
// steady-state steps do no heuristic queries. One per stream; not thread-safe.
struct CachedMatmul;
struct GemmCall;  // a typed call with an epilogue (the bf16 datapath), below

class Gemm {
 public:
  Gemm(cudaStream_t stream, GemmMath math);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;
  cudaStream_t stream() const;
  GemmMath math() const;
  // Column-major D (m,n) = alpha * op(A) op(B) + beta * C [+ bias (m) added to every column].
  // A is (m,k) after op, B (k,n) after op; lda/ldb are the stored leading dimensions implied by
  // the transposes; C may be D or null (then beta must be 0). batch > 1: strided batches.
  // bf16 math: cuBLASLt's fp32-input fast-bf16 mode (CUBLAS_COMPUTE_32F_FAST_16BF); with
  // KILTER_CUDA_BF16_INPUTS=1, A and B are first rounded to bf16 (round to nearest even, as the
  // CPU's bf16 GEMMs do) into device scratch and multiplied by bf16 kernels with fp32
  // accumulation, C and D in fp32 (matmul.cu says why that is not the default yet). A shape with
  // no kernel of the chosen kind falls back to the next (fast-bf16, then fp32).
  void run(float* D, const float* A, const float* B, const float* C, int m, int n, int k,
           bool trans_a, bool trans_b, float alpha, float beta, const float* bias = nullptr,
           int batch = 1, int64_t stride_a = 0, int64_t stride_b = 0, int64_t stride_d = 0);
  // Typed operands and an epilogue (run_typed below); false when cuBLASLt has no algorithm.
  bool run_typed(const GemmCall& call);
  // Sizes the bf16 operand scratch for operands of up to `floats` elements each, so that no
  // allocation happens inside a step (bf16 math only; it grows by itself otherwise).
  void reserve_bf16(size_t floats);
  // Shares `other`'s bf16 scratch (engines whose work is ordered on one timeline, e.g. the
  // compute stream's and the CUDA-graph capture stream's).
  void share_bf16_scratch(Gemm& other);

 private:
  struct Impl;
  using Key = std::tuple<int, int, int, bool, bool, bool, int, int64_t, int64_t, int64_t, uint32_t, uint32_t,
                         uint32_t, uint32_t>;
  bool plan(CachedMatmul& entry, int compute_type, const Key& key);
  bool plan_typed(CachedMatmul& entry, const GemmCall& call);
  std::unique_ptr<Impl> impl_;
};

// ---- encoder.cu: a packed micro-batch: out (N,C); inp (N); cu_seqlens (pieces+1, device);
// positions restart at 0 in every piece, or start at pos_offset[p] (device, pieces; null: all 0)
// in a later part of a cut piece. max_len: the rows of dwpe touched (the longest piece, or with
// offsets the largest offset + length). wpe / dwpe null: no position table (llama).
void encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, const int32_t* cu_seqlens,
                     int pieces, int N, int C, cudaStream_t stream, const int32_t* pos_offset = nullptr);
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, const int32_t* cu_seqlens,
                      int pieces, int N, int max_len, int C, cudaStream_t stream,
                      const int32_t* pos_offset = nullptr);

// ---- layernorm.cu: inp/out (N,C), mean/rstd (N); eps model.norm_eps (1e-5)
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C, cudaStream_t stream, float eps = 1e-5f);
// scratch: column_sum_scratch_floats(C) * 2 floats (deterministic two-pass column sums).
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C,
                        float* scratch, cudaStream_t stream);

// ---- matmul.cu: out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias (OC); bias may be null
void matmul_forward(Gemm& gemm, float* out, const float* inp, const float* weight, const float* bias,
                    int N, int C, int OC);
// out = residual + inp @ weight^T + bias in one GEMM (residual may equal out).
void matmul_forward_residual(Gemm& gemm, float* out, const float* inp, const float* weight,
                             const float* bias, const float* residual, int N, int C, int OC);
// dinp (N,C) += dout @ weight; dweight (OC,C) += dout^T @ inp; dbias (OC) += column sums of dout
// (dbias may be null). scratch: column_sum_scratch_floats(OC). accumulate_dinp = false overwrites.
void matmul_backward(Gemm& gemm, float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int N, int C, int OC, float* scratch,
                     bool accumulate_dinp = true);
// out (C) += sum over rows of x (N,C), deterministic (fixed chunking, no atomics).
void column_sums_accumulate(float* out, const float* x, int N, int C, float* scratch, cudaStream_t stream);

// ---- attention.cu: qkv (B,T,W) -> out (B,T,C); att (B,NH,T,T) is the saved softmax (the same
// as the CPU's); rows t >= lengths[b] give 0. Uses batched cuBLASLt GEMMs and masked softmax.
// Grouped-query attention (NKV key/value heads, 0: NH; model::AttentionShape): a row is
// q (NH heads) | k (NKV) | v (NKV), W = (NH + 2 NKV) hd, C = NH hd; query head h reads K/V head
// h / (NH / NKV). The split copies each K/V head to its query heads, so the batched products run
// over the B NH query heads as for multi-head attention, and the merge sums a K/V head's
// gradients over its query heads in head order.
void attention_forward(Gemm& gemm, float* out, float* att, const float* qkv, const int32_t* lengths,
                       int B, int T, int C, int NH, float* workspace, int NKV = 0);
void attention_backward(Gemm& gemm, float* dqkv, const float* dout, const float* qkv, const float* att,
                        const int32_t* lengths, int B, int T, int C, int NH, float* workspace,
                        bool accumulate = true, int NKV = 0);

// A later part of a cut piece (context parallelism; the CPU twin is attention_forward/backward with an
// AttentionPrefix): its L query rows qkv (L,W) attend to s + L keys, the s rows of its prefix
// (prefix_kv (s,KVW): k | v of the piece's earlier tokens, from other ranks, KVW = 2 NKV hd) and
// then its own, with the bottom-right causal mask (query t sees keys 0 .. s+t). out (L,C); att
// (NH,L,s+L) is the saved softmax, as the CPU keeps it. The backward ADDS into dqkv (L,W) and
// into prefix_dkv (s,KVW: dk | dv of the prefix). cuBLASLt strided-batched GEMMs over the NH
// heads + the masked softmax kernels, whichever engine the whole pieces use. NKV as above.
void attention_prefix_forward(Gemm& gemm, float* out, float* att, const float* qkv, const float* prefix_kv, int s,
                              int L, int C, int NH, float* workspace, int NKV = 0);
void attention_prefix_backward(Gemm& gemm, float* dqkv, float* prefix_dkv, const float* dout, const float* qkv,
                               const float* prefix_kv, const float* att, int s, int L, int C, int NH,
                               float* workspace, int NKV = 0);

// Head layout helpers shared by both attention engines (attention.cu), on `stream`:
// qkv (B,T,3,NH,hd) -> q, k, v (B,NH,T,hd); y (B,NH,T,hd) -> out (B,T,NH*hd);
// dout (B,T,NH*hd) -> dy (B,NH,T,hd); dq, dk, dv (B,NH,T,hd) -> dqkv (B,T,3,NH,hd), added or stored.
// The merges take optional device row lengths (B): rows t >= lengths[b] then give exactly 0.
// NKV (0: NH): grouped K/V heads, expanded by the split and summed by the merge (above).
void attention_split_heads(float* q, float* k, float* v, const float* qkv, int B, int T, int NH, int hd,
                           cudaStream_t stream, int NKV = 0);
void attention_merge_heads(float* out, const float* y, int B, int T, int NH, int hd, cudaStream_t stream,
                           const int32_t* lengths = nullptr);
void attention_split_grad(float* dy, const float* dout, int B, int T, int NH, int hd, cudaStream_t stream);
void attention_merge_qkv_grad(float* dqkv, const float* dq, const float* dk, const float* dv, int B, int T, int NH,
                              int hd, bool accumulate, cudaStream_t stream, const int32_t* lengths = nullptr,
                              int NKV = 0);

// ---- attention_packed.cu: rows of a packed batch (N,W) <-> the padded rows of its attention
// groups (model::AttentionGroups::padded_token on the device; -1 = padding).
// gather: padded (P,W) = rows[padded_token] (padding rows 0). scatter: rows[padded_token] =
// (or += with accumulate) padded, padding rows skipped.
void gather_padded_rows(float* padded, const float* rows, const int32_t* padded_token, size_t padded_rows, int W,
                        cudaStream_t stream);
void scatter_padded_rows(float* rows, const float* padded, const int32_t* padded_token, size_t padded_rows, int W,
                         bool accumulate, cudaStream_t stream);
// The same for bf16 rows (the bf16-storage datapath; the scatter stores).
void gather_padded_rows(bf16* padded, const bf16* rows, const int32_t* padded_token, size_t padded_rows, int W,
                        cudaStream_t stream);
void scatter_padded_rows(bf16* rows, const bf16* padded, const int32_t* padded_token, size_t padded_rows, int W,
                         cudaStream_t stream);

// ---- attention_cudnn.cu (built only with cuDNN, KILTER_WITH_CUDNN): the same contract as
// attention_forward/backward through cuDNN's multi-head attention API (cudnnMultiHeadAttnForward
// / BackwardData) with projections off: every (row, head) pair is one cuDNN sequence of length
// lengths[b], head_dim-wide vectors, one cuDNN head, and the causal mask is the per-query
// attention window [0, t+1). Instead of att, each layer keeps cuDNN's reserve space
// (reserve_floats(B,T) floats) from forward to backward. One descriptor set per (B,T) shape.
class CudnnAttention {
 public:
  // Creates the cuDNN handle on `stream`. Throws kilter::Error (with cuDNN's message) when cuDNN
  // cannot be used here (library or sub-library missing, no device).
  CudnnAttention(cudaStream_t stream, GemmMath math, int C, int NH);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;
  // Whether cuDNN runs micro-batches of shape (B,T); when not, *why says cuDNN's reason and
  // *retry (optional) whether asking again later may succeed (the trial found no free memory).
  bool supports(int B, int T, std::string* why, bool* retry = nullptr);
  size_t reserve_floats(int B, int T);    // per layer, kept from forward to backward
  size_t workspace_floats(int B, int T);  // scratch, shared by all layers
  // lengths_host: the B row lengths on the host (cuDNN's descriptors take them there);
  // lengths_device: the same on the device.
  void forward(float* out, float* reserve, const float* qkv, const int32_t* lengths_host,
               const int32_t* lengths_device, int B, int T, float* workspace);
  void backward(float* dqkv, const float* dout, const float* qkv, float* reserve, const int32_t* lengths_host,
                const int32_t* lengths_device, int B, int T, float* workspace, bool accumulate = true);
  // "cuDNN <version> multi-head attention, <math>" for logs and the benchmark.
  std::string description() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---- gelu.cu: tanh approximation, elementwise over N
void gelu_forward(float* out, const float* inp, size_t N, cudaStream_t stream);
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t N, cudaStream_t stream,
                   bool accumulate = true);

// ---- crossentropy.cu: logits (N,V); targets (N), -1 = no target.
// Adds the sum of -log p[target] into *loss_sum (device double) and sets or adds
// (softmax - onehot) * dloss_scale into dlogits on rows with a target (rows without: 0 when
// overwriting, untouched when accumulating). dlogits may equal logits when accumulate = false.
// dloss_scale_device (optional): read the scale from device memory instead (CUDA graphs replay
// kernels with their captured arguments, so a per-step scale must live on the device).
void crossentropy_forward_backward_async(float* dlogits, const float* logits, const int32_t* targets,
                                         int N, int V, float dloss_scale, double* loss_sum,
                                         bool accumulate, cudaStream_t stream,
                                         const float* dloss_scale_device = nullptr);
// The CPU twin's form: accumulates into dlogits, returns the loss sum (synchronizes the stream).
double crossentropy_forward_backward(float* dlogits, const float* logits, const int32_t* targets,
                                     int N, int V, float dloss_scale, cudaStream_t stream);

// ---- adamw.cu: AdamW (decoupled weight decay) and the global-norm reduction
void adamw_update(float* params, const float* grads, float* m, float* v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, float grad_scale, int64_t t,
                  cudaStream_t stream);
// *result (device double) = sum of x[i]^2, deterministic. scratch: sum_of_squares_scratch_doubles().
size_t sum_of_squares_scratch_doubles();
void sum_of_squares_async(double* result, const float* x, size_t n, double* scratch, cudaStream_t stream);

// ---- adamw.cu, one launch for all owned ranges: the parts of every tensor inside the owned
// ranges, in model::for_each_owned_part's order, as a device table (AdamWSegments::upload).
// AdamW over all of them in ONE launch, with each part's own decay (the same per-element
// arithmetic as adamw_update), writing the bf16 working copy of each updated parameter in the
// same pass where `params_bf16` is given (params_bf16[i] for params[i]; head_bf16: a second copy
// of [head_lo, head_hi) at head_bf16[i - head_lo], the classifier's vocabulary-padded head).
// compact_master: `params` is the distributed optimizer's fp32 master of the owned floats only,
// indexed as the moments (the element at parameter offset p of a part is params[moment + p - lo]);
// the gradients and the working copies stay at the parameters' offsets.
struct AdamWSegment {
  uint64_t lo = 0, hi = 0;  // [lo, hi) of the parameter buffer
  uint64_t moment = 0;      // lo's index among the owned floats (the moments' position)
  uint64_t first = 0;       // the number of elements of the segments before this one
  float decay = 0;          // 1: weight decay applies, 0: not
};
void adamw_update_segments(float* params, const float* grads, float* m, float* v, const AdamWSegment* segments,
                           int count, uint64_t total, float lr, float beta1, float beta2, float eps,
                           float weight_decay, float grad_scale, int64_t t, cudaStream_t stream,
                           bf16* params_bf16 = nullptr, bf16* head_bf16 = nullptr, uint64_t head_lo = 0,
                           uint64_t head_hi = 0, bool compact_master = false);
// *result = the sum of grads[i]^2 over the segments, in ONE launch: fixed partial sums in double
// and the last block to finish adds them in order (deterministic). scratch:
// sum_of_squares_scratch_doubles() doubles and one unsigned counter, zero before the first call
// (the kernel leaves it zero).
void sum_of_squares_segments(double* result, const float* grads, const AdamWSegment* segments, int count,
                             uint64_t total, double* scratch, unsigned* counter, cudaStream_t stream);
// params_bf16[i] = round(params[i]) (set_params, init); head_bf16 as above, rows [V, Vp) zero.
void round_params_bf16(bf16* params_bf16, const float* params, size_t n, bf16* head_bf16, uint64_t head_lo,
                       uint64_t head_hi, cudaStream_t stream);

// ---- rmsnorm.cu: RMSNorm (the Llama family) in fp32, the twin of lib/model/rmsnorm.cpp.
// inp/out (N,C), rstd (N). The backward ACCUMULATES into dinp and dweight. scratch: as
// layernorm_backward's.
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps,
                     cudaStream_t stream);
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int N, int C, float* scratch, cudaStream_t stream);

// ---- rope.cu: RoPE in place on the query and key heads of q|k|v rows (N, (NH + 2 NKV) hd),
// HF's rotate-half convention, each row at its position in its piece (cu_seqlens, pos_offset as
// the encoder takes them). cos/sin: model::RopeTable's (context, hd/2) on the device. The
// backward turns the gradient back. The twin is lib/model/rope.cpp (bf16: rounded, bf16_ops.h).
void rope_forward(float* qkv, const int32_t* cu_seqlens, const int32_t* pos_offset, int pieces, int N, int NH,
                  int NKV, int hd, const float* cos, const float* sin, cudaStream_t stream);
void rope_backward(float* dqkv, const int32_t* cu_seqlens, const int32_t* pos_offset, int pieces, int N, int NH,
                   int NKV, int hd, const float* cos, const float* sin, cudaStream_t stream);
void rope_forward(bf16* qkv, const int32_t* cu_seqlens, const int32_t* pos_offset, int pieces, int N, int NH,
                  int NKV, int hd, const float* cos, const float* sin, cudaStream_t stream);
void rope_backward(bf16* dqkv, const int32_t* cu_seqlens, const int32_t* pos_offset, int pieces, int N, int NH,
                   int NKV, int hd, const float* cos, const float* sin, cudaStream_t stream);

// ---- swiglu.cu: out (N,F) = silu(gate) * up of inp (N,2F) = gate | up; the backward writes
// dinp (N,2F) (overwrites). fp32 (twin: swiglu.cpp) and bf16 (rounded; bf16_ops.h).
void swiglu_forward(float* out, const float* inp, int N, int F, cudaStream_t stream);
void swiglu_backward(float* dinp, const float* dout, const float* inp, int N, int F, cudaStream_t stream);
void swiglu_forward(bf16* out, const bf16* inp, int N, int F, cudaStream_t stream);
void swiglu_backward(bf16* dinp, const bf16* dout, const bf16* inp, int N, int F, cudaStream_t stream);

// ======== the bf16-storage datapath (train.bf16_storage; twins in bf16_ops.h) ================

// ---- matmul.cu: one cuBLASLt call with typed operands and an epilogue (column-major, cuBLASLt's
// own terms: D (m,n) = alpha op(A) op(B) + beta C, C = D when null).
enum class GemmType { f32, bf16 };
enum class GemmEpilogue {
  none,
  bias,           // + bias (m), the D type
  gelu_aux,       // D = gelu(AB [+ bias]); aux = AB [+ bias] (GELU_AUX[_BIAS])
  dgelu,          // D = gelu'(aux) * AB (DGELU)
  bias_gradient,  // bias (n, the C type) = the sums of op(B) over k (BGRADB)
};
struct GemmCall {
  void* D = nullptr;
  const void* A = nullptr;
  const void* B = nullptr;
  const void* C = nullptr;
  GemmType ab = GemmType::bf16, cd = GemmType::bf16;
  int m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  int64_t lda = 0, ldb = 0, ldd = 0;  // 0: packed (the stored rows)
  float alpha = 1.0f, beta = 0.0f;
  int batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_d = 0;
  GemmEpilogue epilogue = GemmEpilogue::none;
  const void* bias = nullptr;  // bias, or where the bias gradient goes
  void* aux = nullptr;         // GELU's pre-activation (written by gelu_aux, read by dgelu)
  int64_t aux_ld = 0;
};
// Gemm::run_typed(call) runs it on the engine's stream with fp32 accumulation
// (CUBLAS_COMPUTE_32F). False, doing nothing, when cuBLASLt offers no algorithm for it (an
// epilogue a shape or library lacks: the caller then runs the plain GEMM and a kernel); other
// failures throw. Descriptors and the chosen algorithm are cached per shape, types and epilogue.

// Linear layers on bf16 rows (N tokens): out (N,OC) = round(inp (N,C) @ weight (OC,C)^T + bias);
// with pre_gelu: pre_gelu = round(h), out = round(gelu(h)) (GELU_AUX_BIAS; without the epilogue,
// the plain GEMM and a GELU kernel). bias may be null.
void linear_forward_bf16(Gemm& gemm, bf16* out, bf16* pre_gelu, const bf16* inp, const bf16* weight,
                         const bf16* bias, int N, int C, int OC);
// dinp (N,C) = round(dout @ weight), or round(gelu'(pre_gelu) (dout @ weight)) (DGELU), OVERWRITTEN
// (null: not wanted); dweight (OC,C) += dout^T @ inp in fp32; dbias (OC, fp32, may be null) += the
// column sums of dout (BGRADB into scratch, then added). scratch: linear_scratch_floats(OC).
void linear_backward_bf16(Gemm& gemm, bf16* dinp, float* dweight, float* dbias, const bf16* dout, const bf16* inp,
                          const bf16* weight, const bf16* pre_gelu, int N, int C, int OC, float* scratch);

// ---- encoder.cu: out (N,C) = round(wte[inp] + wpe[position]) from the fp32 master weights.
void encoder_forward_bf16(bf16* out, const int32_t* inp, const float* wte, const float* wpe, const int32_t* cu_seqlens,
                          int pieces, int N, int C, cudaStream_t stream, const int32_t* pos_offset = nullptr);
// The same from the tables' bf16 working copy (summed in fp32, rounded once): the distributed
// optimizer, whose fp32 master is sharded. Twin: lib/model/encoder.h encoder_forward_bf16.
void encoder_forward_bf16(bf16* out, const int32_t* inp, const bf16* wte, const bf16* wpe, const int32_t* cu_seqlens,
                          int pieces, int N, int C, cudaStream_t stream, const int32_t* pos_offset = nullptr);

// ---- residual_norm.cu: LayerNorm (bias) or RMSNorm (rms; bias null, mean unused) on bf16 rows.
// residual = round(a + b) (b null: a itself, nothing written to residual), out = round(norm of
// it); mean/rstd fp32. The plain norm and the fused one run the same arithmetic on the same
// values, so a recomputed norm gives the fused one's bits.
void residual_norm_forward_bf16(bf16* residual, bf16* out, float* mean, float* rstd, const bf16* a, const bf16* b,
                                const float* weight, const float* bias, int N, int C, bool rms, float eps,
                                cudaStream_t stream);
// dresidual (N,C fp32) += the input gradient; dresidual_bf16 = round(dresidual); dweight, dbias +=
// (dbias null for rms). scratch: 2 column_sum_scratch_floats(C).
void norm_backward_bf16(float* dresidual, bf16* dresidual_bf16, float* dweight, float* dbias, const bf16* dout,
                        const bf16* inp, const float* weight, const float* mean, const float* rstd, int N, int C,
                        bool rms, float* scratch, cudaStream_t stream);

// ---- gelu.cu on bf16: out = round(gelu(inp)); d = round(gelu'(inp) d) in place.
void gelu_forward(bf16* out, const bf16* inp, size_t n, cudaStream_t stream);
void gelu_backward_inplace(bf16* d, const bf16* inp, size_t n, cudaStream_t stream);

// ---- convert.cu: conversions and the K/V exchange's staging.
void to_bf16(bf16* out, const float* in, size_t n, cudaStream_t stream);
void to_float(float* out, const bf16* in, size_t n, cudaStream_t stream);
// x = float(round(x)) in place: train.grad_dtype = bf16's accumulation (twin: bf16_ops.h
// round_bf16_inplace).
void round_bf16_inplace(float* x, size_t n, cudaStream_t stream);
// x = round(x + y), elementwise (the exchange's fp32 dK/dV added into bf16 dqkv rows).
void add_into_bf16(bf16* x, const float* y, size_t n, cudaStream_t stream);
// out (C) += sum over rows of x (N,C) bf16 (deterministic). scratch: column_sum_scratch_floats(C).
void column_sums_accumulate(float* out, const bf16* x, int N, int C, float* scratch, cudaStream_t stream);

// ---- attention_bf16.cu: the cuBLASLt engine on bf16 (twin: attention_bf16.h). qkv (B,T,W)
// bf16 -> out (B,T,C) bf16; att (B,NH,T,T) bf16 is the saved softmax. Scores and the softmax are
// fp32 in the workspace, a chunk of the group's rows at a time (at most score_budget floats of
// scores: attention_bf16_workspace_bytes sizes for it), so the workspace stays small.
void attention_bf16_forward(Gemm& gemm, bf16* out, bf16* att, const bf16* qkv, const int32_t* lengths, int B, int T,
                            int C, int NH, int NKV, void* workspace, size_t score_budget);
// dqkv (B,T,W) bf16 stored (rows t >= lengths[b]: 0).
void attention_bf16_backward(Gemm& gemm, bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* att,
                             const int32_t* lengths, int B, int T, int C, int NH, int NKV, void* workspace,
                             size_t score_budget);
// A later part of a cut piece (as attention_prefix_forward, on bf16): qkv (L,W) bf16, prefix_kv
// (s,KVW) fp32 as the exchange delivers it, out (L,C) bf16, att (NH,L,s+L) bf16. The backward
// stores dqkv (L,W) bf16 and ADDS the fp32 sums into prefix_dkv (s,KVW).
void attention_prefix_bf16_forward(Gemm& gemm, bf16* out, bf16* att, const bf16* qkv, const float* prefix_kv, int s,
                                   int L, int C, int NH, int NKV, void* workspace);
void attention_prefix_bf16_backward(Gemm& gemm, bf16* dqkv, float* prefix_dkv, const bf16* dout, const bf16* qkv,
                                    const float* prefix_kv, const bf16* att, int s, int L, int C, int NH, int NKV,
                                    void* workspace);

// ---- classifier.cu: the LM head's loss on a chunk of bf16 logits (R rows, Vp >= V columns, the
// padded vocabulary): row r with a target adds logsumexp - logit[target] (fp32) to row_losses[r]
// (0 without) and, with backward, turns its logits into round((softmax - onehot) * scale) in
// place (padded columns and rows without a target: 0). scale from scale_device when given.
void classifier_bf16(bf16* logits, float* row_losses, const int32_t* targets, int R, int V, int Vp, float dloss_scale,
                     const float* scale_device, bool backward, cudaStream_t stream);
// *loss_sum += the sum of row_losses (N), in double, in a fixed order.
void sum_row_losses(double* loss_sum, const float* row_losses, int N, cudaStream_t stream);
// The whole head over bf16 rows x (N,C), R rows at a time (logits: R x Vp bf16 scratch, the only
// logits that exist): logits = round(x W^T) against weight (Vp,C bf16; rows V..Vp-1 zero), the
// loss into row_losses (N) and *loss_sum (added), and with backward: dlogits in place, dx (N,C
// bf16) = round(dlogits W) and dweight (V,C fp32) += dlogits[:, :V]^T x. Twin: classifier_bf16.
void classifier_chunks_bf16(Gemm& gemm, bf16* dx, float* dweight, const bf16* x, const bf16* weight,
                            const int32_t* targets, int N, int C, int V, int Vp, int R, bf16* logits,
                            float* row_losses, double* loss_sum, float dloss_scale, const float* scale_device,
                            bool backward);

}  // namespace kilter::model::cuda
