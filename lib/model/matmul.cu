// CUDA twin of lib/model/matmul.cpp through cuBLASLt, plus the Gemm engine every GEMM of the
// CUDA backend goes through (attention's batched products too) and deterministic column sums
// (bias gradients). Row-major (N,C) data is column-major (C,N) to cuBLAS, so
//   out (N,OC) = inp @ W^T   is  out' (OC,N) = W'^T (OC,C) inp' (C,N)     [W' = W as (C,OC)]
//   dinp (N,C) = dout @ W    is  dinp' (C,N) = W' (C,OC) dout' (OC,N)
//   dW (OC,C) = dout^T @ inp is  dW' (C,OC) = inp' (C,N) dout'^T (N,OC)
#include <cuda_bf16.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "io/base/cublaslt_loader.h"
#include "io/base/cuda_common.h"
#include "lib/model/cuda_ops.h"
#include "lib/model/bf16_device.cuh"
#include "lib/model/gemm_call.h"

namespace kilter::model::cuda {

namespace {
// cuBLASLt is opened on first use (cublaslt_loader.h).
const backend::CublasLt& lt() { return backend::cublaslt(); }

using scratch_detail::kColumnChunks;  // the column sums' chunks (kernel_scratch.h)

// Largest power of two (<= 16) dividing the address: cuBLASLt must not assume more.
uint32_t pointer_alignment(const void* p) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  uint32_t alignment = 16;
  while (alignment > 4 && (address % alignment) != 0) alignment /= 2;
  return alignment;
}
}  // namespace

// A cached matmul: descriptors and the algorithm the heuristic chose for one shape.
struct CachedMatmul {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool bf16_inputs = false;  // A and B are rounded to bf16 scratch first
};

namespace {

// Destroys a cached matmul's descriptors.
void release(CachedMatmul& m) {
  lt().MatrixLayoutDestroy(m.a);
  lt().MatrixLayoutDestroy(m.b);
  lt().MatrixLayoutDestroy(m.c);
  lt().MatrixLayoutDestroy(m.d);
  lt().MatmulDescDestroy(m.desc);
}

// Asks cuBLASLt's heuristic for the best algorithm of entry's descriptors within the engine's
// workspace, for operands of these alignments in bytes (A, B, C, D). False when it has none.
bool choose_algorithm(cublasLtHandle_t handle, CachedMatmul& entry, const uint32_t (&alignments)[4]) {
  cublasLtMatmulPreference_t preference = nullptr;
  KILTER_CUBLAS_CHECK(lt().MatmulPreferenceCreate(&preference));
  const size_t workspace_bytes = kGemmWorkspaceBytes;
  KILTER_CUBLAS_CHECK(lt().MatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                        &workspace_bytes, sizeof workspace_bytes));
  const cublasLtMatmulPreferenceAttributes_t alignment_attrs[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; ++i) {
    KILTER_CUBLAS_CHECK(
        lt().MatmulPreferenceSetAttribute(preference, alignment_attrs[i], &alignments[i], sizeof alignments[i]));
  }
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found_algorithms = 0;
  const cublasStatus_t status = lt().MatmulAlgoGetHeuristic(handle, entry.desc, entry.a, entry.b, entry.c, entry.d,
                                                            preference, 1, &heuristic, &found_algorithms);
  lt().MatmulPreferenceDestroy(preference);
  if (status != CUBLAS_STATUS_SUCCESS || found_algorithms == 0) return false;
  entry.algo = heuristic.algo;
  return true;
}

// The bf16 copies of A and B. Grown, never shrunk; a replaced buffer is kept until the engine
// dies, because a CUDA graph captured earlier may still point at it (and a cudaFree inside a
// step would synchronize the device).
struct Bf16Scratch {
  __nv_bfloat16* a = nullptr;
  __nv_bfloat16* b = nullptr;
  size_t capacity = 0;  // elements of each
  std::vector<void*> retired;
  ~Bf16Scratch() {
    cudaFree(a);
    cudaFree(b);
    for (void* p : retired) cudaFree(p);
  }
  void ensure(size_t elements) {
    if (elements <= capacity) return;
    elements = elements + elements / 8;  // room for a slightly larger batch
    if (a != nullptr) retired.push_back(a);
    if (b != nullptr) retired.push_back(b);
    a = b = nullptr;
    capacity = 0;
    KILTER_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&a), sizeof(__nv_bfloat16) * elements));
    KILTER_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&b), sizeof(__nv_bfloat16) * elements));
    capacity = elements;
  }
};

// Four elements per thread where the span allows (float4 in, 4 bf16 out), the tail one by one.
__global__ void round_to_bf16_kernel(__nv_bfloat16* out, const float* in, size_t n) {
  const size_t quads = n / 4;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const bool aligned = (reinterpret_cast<uintptr_t>(in) % 16) == 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < quads; i += stride) {
    float4 v;
    if (aligned) v = reinterpret_cast<const float4*>(in)[i];
    else v = make_float4(in[4 * i], in[4 * i + 1], in[4 * i + 2], in[4 * i + 3]);
    __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
    reinterpret_cast<__nv_bfloat162*>(out)[2 * i] = lo;
    reinterpret_cast<__nv_bfloat162*>(out)[2 * i + 1] = hi;
  }
  for (size_t i = 4 * quads + blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += stride)
    out[i] = __float2bfloat16_rn(in[i]);
}

void round_to_bf16(__nv_bfloat16* out, const float* in, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  round_to_bf16_kernel<<<std::min(backend::grid_for((n + 3) / 4, 256), 132u * 16u), 256, 0, stream>>>(out, in, n);
  KILTER_CUDA_LAUNCH_CHECK();
}

// Elements an operand spans: one stored matrix, or `batch` of them `stride` apart.
size_t operand_span(int rows, int cols, int batch, int64_t stride) {
  const size_t one = static_cast<size_t>(rows) * static_cast<size_t>(cols);
  if (batch <= 1 || stride <= 0) return one;
  return static_cast<size_t>(stride) * static_cast<size_t>(batch - 1) + one;
}

// KILTER_CUDA_BF16_INPUTS=1 rounds the operands to bf16 copies; the default keeps bf16 math on
// cuBLASLt's fp32-input fast-bf16 mode. Measured on an H200 (docs/gpu.md): the copies make the
// block GEMMs bf16 kernels, but rounding fp32 activations on every GEMM took 18% of a GPT-2 124M
// step and the LM head (V = 50257, rows not 16-byte aligned in bf16) fell to sm75 kernels: 4%
// slower at 124M, 7% faster at 774M. Worth it once activations are stored in bf16.
bool bf16_inputs_enabled() {
  const char* value = std::getenv("KILTER_CUDA_BF16_INPUTS");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

}  // namespace

using GemmKey = std::tuple<int, int, int, bool, bool, bool, int, int64_t, int64_t, int64_t, uint32_t, uint32_t,
                           uint32_t, uint32_t>;  // Gemm::Key: shape, transposes, bias, batching, alignments

struct Gemm::Impl {
  cudaStream_t stream = nullptr;
  GemmMath math = GemmMath::fp32;
  bool bf16_inputs = false;
  std::shared_ptr<Bf16Scratch> scratch;
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::map<GemmKey, CachedMatmul> cache;
  // Typed calls (run_typed): the shape, types, leading dimensions, batching, epilogue and the
  // alignments of every pointer the heuristic looks at; `ok` false caches "no algorithm".
  std::map<std::array<int64_t, 24>, std::pair<CachedMatmul, bool>> typed_cache;
};

Gemm::Gemm(cudaStream_t stream, GemmMath math) : impl_(std::make_unique<Impl>()) {
  impl_->stream = stream;
  impl_->math = math;
  impl_->bf16_inputs = math == GemmMath::bf16 && bf16_inputs_enabled();
  if (impl_->bf16_inputs) impl_->scratch = std::make_shared<Bf16Scratch>();
  KILTER_CUBLAS_CHECK(lt().Create(&impl_->handle));
  KILTER_CUDA_CHECK(cudaMalloc(&impl_->workspace, kGemmWorkspaceBytes));
}

Gemm::~Gemm() {
  for (auto& entry : impl_->typed_cache)
    if (entry.second.second) release(entry.second.first);
  for (auto& entry : impl_->cache) release(entry.second);
  cudaFree(impl_->workspace);
  lt().Destroy(impl_->handle);
}

void Gemm::reserve_bf16(size_t floats) {
  if (impl_->bf16_inputs) impl_->scratch->ensure(floats);
}

void Gemm::share_bf16_scratch(Gemm& other) {
  if (impl_->bf16_inputs && other.impl_->bf16_inputs) impl_->scratch = other.impl_->scratch;
}

cudaStream_t Gemm::stream() const { return impl_->stream; }
GemmMath Gemm::math() const { return impl_->math; }

static cublasLtMatrixLayout_t make_layout(int rows, int cols, int batch, int64_t stride,
                                          cudaDataType_t type = CUDA_R_32F) {
  cublasLtMatrixLayout_t layout = nullptr;
  KILTER_CUBLAS_CHECK(lt().MatrixLayoutCreate(&layout, type, rows, cols, rows));
  if (batch > 1) {
    KILTER_CUBLAS_CHECK(lt().MatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                         &batch, sizeof batch));
    KILTER_CUBLAS_CHECK(lt().MatrixLayoutSetAttribute(
        layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
  }
  return layout;
}

// Builds the descriptors of `key`'s shape for one compute type and asks the heuristic for the
// best algorithm; false (descriptors released) when it has none.
bool Gemm::plan(CachedMatmul& entry, int compute_type, const GemmKey& key) {
  const auto [m, n, k, trans_a, trans_b, has_bias, batch, stride_a, stride_b, stride_d, align_a, align_b, align_c,
              align_d] = key;
  const cublasComputeType_t compute = static_cast<cublasComputeType_t>(compute_type);
  KILTER_CUBLAS_CHECK(lt().MatmulDescCreate(&entry.desc, compute, CUDA_R_32F));
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  KILTER_CUBLAS_CHECK(lt().MatmulDescSetAttribute(entry.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  KILTER_CUBLAS_CHECK(lt().MatmulDescSetAttribute(entry.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  const cublasLtEpilogue_t epilogue = has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  KILTER_CUBLAS_CHECK(
      lt().MatmulDescSetAttribute(entry.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
  if (has_bias) {
    const cudaDataType_t bias_type = CUDA_R_32F;
    KILTER_CUBLAS_CHECK(lt().MatmulDescSetAttribute(entry.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                       sizeof bias_type));
  }
  // entry.bf16_inputs: bf16 A and B (the rounded copies); else fp32 A and B.
  const cudaDataType_t ab_type = entry.bf16_inputs ? CUDA_R_16BF : CUDA_R_32F;
  entry.a = trans_a ? make_layout(k, m, batch, stride_a, ab_type) : make_layout(m, k, batch, stride_a, ab_type);
  entry.b = trans_b ? make_layout(n, k, batch, stride_b, ab_type) : make_layout(k, n, batch, stride_b, ab_type);
  entry.c = make_layout(m, n, batch, stride_d);
  entry.d = make_layout(m, n, batch, stride_d);
  // The bf16 copies start at their (256-byte aligned) scratch.
  const uint32_t alignments[4] = {entry.bf16_inputs ? 16u : align_a, entry.bf16_inputs ? 16u : align_b, align_c,
                                  align_d};
  if (choose_algorithm(impl_->handle, entry, alignments)) return true;
  release(entry);
  const bool bf16_inputs = entry.bf16_inputs;
  entry = CachedMatmul{};
  entry.bf16_inputs = bf16_inputs;
  return false;
}

void Gemm::run(float* D, const float* A, const float* B, const float* C, int m, int n, int k,
               bool trans_a, bool trans_b, float alpha, float beta, const float* bias, int batch,
               int64_t stride_a, int64_t stride_b, int64_t stride_d) {
  if (m == 0 || n == 0) return;
  if (C == nullptr) {
    KILTER_CHECK(beta == 0.0f, "Gemm::run: beta != 0 needs a C matrix");
    C = D;
  }
  const bool has_bias = bias != nullptr;
  const GemmKey key{m, n, k, trans_a, trans_b, has_bias, batch, stride_a, stride_b, stride_d,
                    pointer_alignment(A), pointer_alignment(B), pointer_alignment(C),
                    pointer_alignment(D)};
  auto found = impl_->cache.find(key);
  if (found == impl_->cache.end()) {
    CachedMatmul entry;
    // bf16 math first when asked; shapes or alignments with no bf16 kernel fall back to fp32
    // math (still correct, only slower) rather than failing.
    const bool want_bf16 = impl_->math == GemmMath::bf16;
    entry.bf16_inputs = impl_->bf16_inputs;
    bool planned = entry.bf16_inputs && plan(entry, CUBLAS_COMPUTE_32F, key);
    entry.bf16_inputs = planned;
    if (!planned) planned = want_bf16 && plan(entry, CUBLAS_COMPUTE_32F_FAST_16BF, key);
    if (!planned && !plan(entry, CUBLAS_COMPUTE_32F, key)) {
      KILTER_FAIL("cuBLASLt has no algorithm for a GEMM m=" << m << " n=" << n << " k=" << k << " transA=" << trans_a
                  << " transB=" << trans_b << " batch=" << batch << " bias=" << has_bias);
    }
    found = impl_->cache.emplace(key, entry).first;
  }
  CachedMatmul& cached = found->second;
  if (has_bias) {
    KILTER_CUBLAS_CHECK(lt().MatmulDescSetAttribute(cached.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                       sizeof bias));
  }
  const void* a = A;
  const void* b = B;
  if (cached.bf16_inputs) {
    const size_t span_a = trans_a ? operand_span(k, m, batch, stride_a) : operand_span(m, k, batch, stride_a);
    const size_t span_b = trans_b ? operand_span(n, k, batch, stride_b) : operand_span(k, n, batch, stride_b);
    Bf16Scratch& scratch = *impl_->scratch;
    scratch.ensure(std::max(span_a, span_b));
    round_to_bf16(scratch.a, A, span_a, impl_->stream);
    round_to_bf16(scratch.b, B, span_b, impl_->stream);
    a = scratch.a;
    b = scratch.b;
  }
  KILTER_CUBLAS_CHECK(lt().Matmul(impl_->handle, cached.desc, &alpha, a, cached.a, b, cached.b, &beta, C,
                                     cached.c, D, cached.d, &cached.algo, impl_->workspace, kGemmWorkspaceBytes,
                                     impl_->stream));
}

// ---- typed calls with epilogues (the bf16-storage datapath) ----------------------------------

namespace {

cudaDataType_t data_type(GemmType type) { return type == GemmType::bf16 ? CUDA_R_16BF : CUDA_R_32F; }

cublasLtEpilogue_t epilogue_of(const GemmCall& call) {
  switch (call.epilogue) {
    case GemmEpilogue::bias: return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::gelu_aux: return call.bias != nullptr ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    case GemmEpilogue::dgelu: return CUBLASLT_EPILOGUE_DGELU;
    case GemmEpilogue::bias_gradient: return CUBLASLT_EPILOGUE_BGRADB;
    case GemmEpilogue::none: break;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// A (rows x cols) column-major layout with leading dimension ld, optionally strided-batched.
cublasLtMatrixLayout_t typed_layout(cudaDataType_t type, int rows, int cols, int64_t ld, int batch, int64_t stride) {
  cublasLtMatrixLayout_t layout = nullptr;
  KILTER_CUBLAS_CHECK(lt().MatrixLayoutCreate(&layout, type, rows, cols, ld));
  if (batch > 1) {
    KILTER_CUBLAS_CHECK(lt().MatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch));
    KILTER_CUBLAS_CHECK(
        lt().MatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
  }
  return layout;
}

// The leading dimensions a call means by 0: its matrices stored packed.
struct Leading {
  int64_t a, b, d;
  explicit Leading(const GemmCall& c)
      : a(c.lda ? c.lda : (c.trans_a ? c.k : c.m)), b(c.ldb ? c.ldb : (c.trans_b ? c.n : c.k)), d(c.ldd ? c.ldd : c.m) {}
};

}  // namespace

bool Gemm::plan_typed(CachedMatmul& entry, const GemmCall& call) {
  const Leading ld(call);
  KILTER_CUBLAS_CHECK(lt().MatmulDescCreate(&entry.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = call.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = call.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  KILTER_CUBLAS_CHECK(lt().MatmulDescSetAttribute(entry.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  KILTER_CUBLAS_CHECK(lt().MatmulDescSetAttribute(entry.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  const cublasLtEpilogue_t epilogue = epilogue_of(call);
  KILTER_CUBLAS_CHECK(lt().MatmulDescSetAttribute(entry.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
  // The heuristic reads the pointers' alignment, so they are set before it runs (and again per call).
  if (call.bias != nullptr)
    KILTER_CUBLAS_CHECK(
        lt().MatmulDescSetAttribute(entry.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &call.bias, sizeof call.bias));
  if (call.aux != nullptr) {
    KILTER_CUBLAS_CHECK(
        lt().MatmulDescSetAttribute(entry.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &call.aux, sizeof call.aux));
    KILTER_CUBLAS_CHECK(lt().MatmulDescSetAttribute(entry.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &call.aux_ld,
                                                    sizeof call.aux_ld));
  }
  const cudaDataType_t ab = data_type(call.ab), cd = data_type(call.cd);
  entry.a = call.trans_a ? typed_layout(ab, call.k, call.m, ld.a, call.batch, call.stride_a)
                         : typed_layout(ab, call.m, call.k, ld.a, call.batch, call.stride_a);
  entry.b = call.trans_b ? typed_layout(ab, call.n, call.k, ld.b, call.batch, call.stride_b)
                         : typed_layout(ab, call.k, call.n, ld.b, call.batch, call.stride_b);
  entry.c = typed_layout(cd, call.m, call.n, ld.d, call.batch, call.stride_d);
  entry.d = typed_layout(cd, call.m, call.n, ld.d, call.batch, call.stride_d);
  const void* C = call.C != nullptr ? call.C : call.D;
  const uint32_t alignments[4] = {pointer_alignment(call.A), pointer_alignment(call.B), pointer_alignment(C),
                                  pointer_alignment(call.D)};
  if (choose_algorithm(impl_->handle, entry, alignments)) return true;
  release(entry);
  entry = CachedMatmul{};
  return false;
}

bool Gemm::run_typed(const GemmCall& call) {
  if (call.m == 0 || call.n == 0) return true;
  const Leading ld(call);
  const void* C = call.C != nullptr ? call.C : call.D;
  const std::array<int64_t, 24> key = {call.m, call.n, call.k, call.trans_a, call.trans_b, ld.a, ld.b, ld.d,
                                       static_cast<int64_t>(call.ab), static_cast<int64_t>(call.cd), call.batch,
                                       call.stride_a, call.stride_b, call.stride_d,
                                       static_cast<int64_t>(call.epilogue), call.bias != nullptr, call.aux_ld,
                                       pointer_alignment(call.A), pointer_alignment(call.B), pointer_alignment(C),
                                       pointer_alignment(call.D), pointer_alignment(call.bias),
                                       pointer_alignment(call.aux), 0};
  auto found = impl_->typed_cache.find(key);
  if (found == impl_->typed_cache.end()) {
    CachedMatmul entry;
    const bool ok = plan_typed(entry, call);
    found = impl_->typed_cache.emplace(key, std::make_pair(entry, ok)).first;
  }
  if (!found->second.second) return false;
  CachedMatmul& cached = found->second.first;
  if (call.bias != nullptr)
    KILTER_CUBLAS_CHECK(
        lt().MatmulDescSetAttribute(cached.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &call.bias, sizeof call.bias));
  if (call.aux != nullptr)
    KILTER_CUBLAS_CHECK(
        lt().MatmulDescSetAttribute(cached.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &call.aux, sizeof call.aux));
  KILTER_CUBLAS_CHECK(lt().Matmul(impl_->handle, cached.desc, &call.alpha, call.A, cached.a, call.B, cached.b,
                                  &call.beta, C, cached.c, call.D, cached.d, &cached.algo, impl_->workspace,
                                  kGemmWorkspaceBytes, impl_->stream));
  return true;
}

namespace {

// grid (ceil(C/32), kColumnChunks), block (32, 8): partial column sums of one chunk of rows.
template <typename T>
__global__ void column_sums_partial(float* partial, const T* x, int N, int C) {
  __shared__ float shared[8][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  const int rows_per_chunk = (N + kColumnChunks - 1) / kColumnChunks;
  const int row_begin = blockIdx.y * rows_per_chunk;
  const int row_end = min(N, row_begin + rows_per_chunk);
  float sum = 0.0f;
  if (c < C) {
    for (int r = row_begin + threadIdx.y; r < row_end; r += 8) sum += load_f(x[static_cast<size_t>(r) * C + c]);
  }
  shared[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float total = 0.0f;
    for (int y = 0; y < 8; ++y) total += shared[y][threadIdx.x];
    partial[static_cast<size_t>(blockIdx.y) * C + c] = total;
  }
}

__global__ void column_sums_final(float* out, const float* partial, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float total = 0.0f;
  for (int k = 0; k < kColumnChunks; ++k) total += partial[static_cast<size_t>(k) * C + c];
  out[c] += total;
}

}  // namespace

template <typename T>
void column_sums(float* out, const T* x, int N, int C, float* scratch, cudaStream_t stream) {
  if (N == 0 || C == 0) return;
  column_sums_partial<T><<<dim3((C + 31) / 32, kColumnChunks), dim3(32, 8), 0, stream>>>(scratch, x, N, C);
  KILTER_CUDA_LAUNCH_CHECK();
  column_sums_final<<<(C + 255) / 256, 256, 0, stream>>>(out, scratch, C);
  KILTER_CUDA_LAUNCH_CHECK();
}

void column_sums_accumulate(float* out, const float* x, int N, int C, float* scratch, cudaStream_t stream) {
  column_sums(out, x, N, C, scratch, stream);
}

void column_sums_accumulate(float* out, const bf16* x, int N, int C, float* scratch, cudaStream_t stream) {
  column_sums(out, x, N, C, scratch, stream);
}

void matmul_forward(Gemm& gemm, float* out, const float* inp, const float* weight, const float* bias,
                    int N, int C, int OC) {
  gemm.run(out, weight, inp, nullptr, OC, N, C, /*trans_a=*/true, /*trans_b=*/false, 1.0f, 0.0f, bias);
}

void matmul_forward_residual(Gemm& gemm, float* out, const float* inp, const float* weight,
                             const float* bias, const float* residual, int N, int C, int OC) {
  gemm.run(out, weight, inp, residual, OC, N, C, true, false, 1.0f, 1.0f, bias);
}

void matmul_backward(Gemm& gemm, float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int N, int C, int OC, float* scratch,
                     bool accumulate_dinp) {
  if (N == 0) return;
  // dinp' (C,N) = W' (C,OC) dout' (OC,N)
  gemm.run(dinp, weight, dout, accumulate_dinp ? dinp : nullptr, C, N, OC, false, false, 1.0f,
           accumulate_dinp ? 1.0f : 0.0f);
  // dW' (C,OC) += inp' (C,N) dout'^T (N,OC)
  gemm.run(dweight, inp, dout, dweight, C, OC, N, false, true, 1.0f, 1.0f);
  if (dbias != nullptr) column_sums_accumulate(dbias, dout, N, OC, scratch, gemm.stream());
}

// ---- Linear layers of the bf16-storage datapath --------------------------------------------

namespace {

__global__ void add_vector_kernel(float* out, const float* x, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] += x[i];
}

// The epilogue's aux matrix needs a leading dimension that is a multiple of 8 (cublasLt.h).
bool aux_allowed(int rows) { return rows % 8 == 0; }

}  // namespace

void linear_forward_bf16(Gemm& gemm, bf16* out, bf16* pre_gelu, const bf16* inp, const bf16* weight,
                         const bf16* bias, int N, int C, int OC) {
  // out' (OC,N) = W'^T (OC,C) inp' (C,N), as matmul_forward.
  GemmCall call = gemm_call(out, weight, inp, OC, N, C, /*trans_a=*/true);
  call.bias = bias;
  call.epilogue = bias != nullptr ? GemmEpilogue::bias : GemmEpilogue::none;
  if (pre_gelu != nullptr && aux_allowed(OC)) {
    GemmCall fused = call;
    fused.epilogue = GemmEpilogue::gelu_aux;
    fused.aux = pre_gelu;
    fused.aux_ld = OC;
    if (gemm.run_typed(fused)) return;
  }
  // No GELU epilogue here: the pre-activation from the GEMM, GELU from it by a kernel.
  if (pre_gelu != nullptr) call.D = pre_gelu;
  KILTER_CHECK(gemm.run_typed(call), "cuBLASLt has no bf16 algorithm for a Linear layer N=" << N << " C=" << C
                                                                                        << " OC=" << OC);
  if (pre_gelu != nullptr) gelu_forward(out, pre_gelu, static_cast<size_t>(N) * OC, gemm.stream());
}

void linear_backward_bf16(Gemm& gemm, bf16* dinp, float* dweight, float* dbias, const bf16* dout, const bf16* inp,
                          const bf16* weight, const bf16* pre_gelu, int N, int C, int OC, float* scratch) {
  if (N == 0) return;
  cudaStream_t stream = gemm.stream();
  if (dinp != nullptr) {
    // dinp' (C,N) = W' (C,OC) dout' (OC,N)
    const GemmCall call = gemm_call(dinp, weight, dout, C, N, OC);
    bool done = false;
    if (pre_gelu != nullptr && aux_allowed(C)) {
      GemmCall fused = call;
      fused.epilogue = GemmEpilogue::dgelu;
      fused.aux = const_cast<bf16*>(pre_gelu);
      fused.aux_ld = C;
      done = gemm.run_typed(fused);
    }
    if (!done) {
      KILTER_CHECK(gemm.run_typed(call), "cuBLASLt has no bf16 algorithm for a Linear backward N=" << N << " C=" << C
                                                                                                 << " OC=" << OC);
      if (pre_gelu != nullptr) gelu_backward_inplace(dinp, pre_gelu, static_cast<size_t>(N) * C, stream);
    }
  }
  // dW' (C,OC) += inp' (C,N) dout'^T (N,OC), into the fp32 gradient; BGRADB sums op(B) = dout
  // over the N rows: the bias gradient, into scratch (the epilogue stores, the gradient adds).
  GemmCall call = gemm_call(dweight, inp, dout, C, OC, N, /*trans_a=*/false, /*trans_b=*/true);
  call.cd = GemmType::f32;
  call.beta = 1.0f;
  if (dbias != nullptr) {
    GemmCall fused = call;
    fused.epilogue = GemmEpilogue::bias_gradient;
    fused.bias = scratch;
    if (gemm.run_typed(fused)) {
      add_vector_kernel<<<(OC + 255) / 256, 256, 0, stream>>>(dbias, scratch, OC);
      KILTER_CUDA_LAUNCH_CHECK();
      return;
    }
  }
  KILTER_CHECK(gemm.run_typed(call), "cuBLASLt has no bf16 algorithm for a weight gradient N=" << N << " C=" << C
                                                                                               << " OC=" << OC);
  if (dbias != nullptr) column_sums_accumulate(dbias, dout, N, OC, scratch, stream);
}

}  // namespace kilter::model::cuda
