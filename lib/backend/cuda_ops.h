// The CUDA twins of the CPU model ops (lib/model/<op>.h) in namespace kilter::model::cuda: same
// arguments, on device pointers, plus the stream (and, for GEMM-based ops, the cuBLASLt engine
// and a scratch workspace) that the GPU needs. Backward functions ACCUMULATE into d* outputs like
// their CPU twins unless an `accumulate = false` argument asks them to overwrite (the model uses
// that to skip zero-fills). Kernels: lib/model/{encoder,layernorm,matmul,attention,gelu,
// crossentropy,adamw}.cu. Tests: tests/gpu/gpu_ops_test.cu compares each with its CPU twin.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>

namespace kilter::model::cuda {

// GEMM math. fp32: CUBLAS_COMPUTE_32F (IEEE fp32, like the CPU). bf16: fp32 data in memory,
// bf16 tensor-core products with fp32 accumulation (CUBLAS_COMPUTE_32F_FAST_16BF).
enum class GemmMath { fp32, bf16 };

// cuBLASLt handle, workspace and a cache of matmul descriptors + chosen algorithms per shape, so
// steady-state steps do no heuristic queries. One per stream; not thread-safe.
struct CachedMatmul;

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
  std::unique_ptr<Impl> impl_;
};

// ---- encoder.cu: a packed micro-batch: out (N,C); inp (N); cu_seqlens (pieces+1, device);
// positions restart at 0 in every piece, or start at pos_offset[p] (device, pieces; null: all 0)
// in a later part of a cut piece. max_len: the rows of dwpe touched (the longest piece, or with
// offsets the largest offset + length).
void encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, const int32_t* cu_seqlens,
                     int pieces, int N, int C, cudaStream_t stream, const int32_t* pos_offset = nullptr);
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, const int32_t* cu_seqlens,
                      int pieces, int N, int max_len, int C, cudaStream_t stream,
                      const int32_t* pos_offset = nullptr);

// ---- layernorm.cu: inp/out (N,C), mean/rstd (N); eps 1e-5
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C, cudaStream_t stream);
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
size_t column_sum_scratch_floats(int C);
void column_sums_accumulate(float* out, const float* x, int N, int C, float* scratch, cudaStream_t stream);

// ---- attention.cu: qkv (B,T,3C) -> out (B,T,C); att (B,NH,T,T) is the saved softmax (the same
// as the CPU's); rows t >= lengths[b] give 0. Uses batched cuBLASLt GEMMs and masked softmax.
size_t attention_workspace_floats(int B, int T, int C, int NH);
void attention_forward(Gemm& gemm, float* out, float* att, const float* qkv, const int32_t* lengths,
                       int B, int T, int C, int NH, float* workspace);
void attention_backward(Gemm& gemm, float* dqkv, const float* dout, const float* qkv, const float* att,
                        const int32_t* lengths, int B, int T, int C, int NH, float* workspace,
                        bool accumulate = true);

// A later part of a cut piece (issue 23; the CPU twin is attention_forward/backward with an
// AttentionPrefix): its L query rows qkv (L,3C) attend to s + L keys, the s rows of its prefix
// (prefix_kv (s,2C): k | v of the piece's earlier tokens, from other ranks) and then its own, with
// the bottom-right causal mask (query t sees keys 0 .. s+t). out (L,C); att (NH,L,s+L) is the
// saved softmax, as the CPU keeps it. The backward ADDS into dqkv (L,3C) and into prefix_dkv
// (s,2C: dk | dv of the prefix). cuBLASLt strided-batched GEMMs over the NH heads + the masked
// softmax kernels, whichever engine the whole pieces use.
size_t attention_prefix_workspace_floats(int s, int L, int C, int NH);
void attention_prefix_forward(Gemm& gemm, float* out, float* att, const float* qkv, const float* prefix_kv, int s,
                              int L, int C, int NH, float* workspace);
void attention_prefix_backward(Gemm& gemm, float* dqkv, float* prefix_dkv, const float* dout, const float* qkv,
                               const float* prefix_kv, const float* att, int s, int L, int C, int NH,
                               float* workspace);

// Head layout helpers shared by both attention engines (attention.cu), on `stream`:
// qkv (B,T,3,NH,hd) -> q, k, v (B,NH,T,hd); y (B,NH,T,hd) -> out (B,T,NH*hd);
// dout (B,T,NH*hd) -> dy (B,NH,T,hd); dq, dk, dv (B,NH,T,hd) -> dqkv (B,T,3,NH,hd), added or stored.
// The merges take optional device row lengths (B): rows t >= lengths[b] then give exactly 0.
void attention_split_heads(float* q, float* k, float* v, const float* qkv, int B, int T, int NH, int hd,
                           cudaStream_t stream);
void attention_merge_heads(float* out, const float* y, int B, int T, int NH, int hd, cudaStream_t stream,
                           const int32_t* lengths = nullptr);
void attention_split_grad(float* dy, const float* dout, int B, int T, int NH, int hd, cudaStream_t stream);
void attention_merge_qkv_grad(float* dqkv, const float* dq, const float* dk, const float* dv, int B, int T, int NH,
                              int hd, bool accumulate, cudaStream_t stream, const int32_t* lengths = nullptr);

// ---- attention_packed.cu: rows of a packed batch (N,W) <-> the padded rows of its attention
// groups (model::AttentionGroups::padded_token on the device; -1 = padding).
// gather: padded (P,W) = rows[padded_token] (padding rows 0). scatter: rows[padded_token] =
// (or += with accumulate) padded, padding rows skipped.
void gather_padded_rows(float* padded, const float* rows, const int32_t* padded_token, size_t padded_rows, int W,
                        cudaStream_t stream);
void scatter_padded_rows(float* rows, const float* padded, const int32_t* padded_token, size_t padded_rows, int W,
                         bool accumulate, cudaStream_t stream);

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

}  // namespace kilter::model::cuda
