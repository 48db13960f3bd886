// The cuDNN attention engine (train.attention = cudnn | auto; docs/gpu.md "Attention"): causal
// multi-head self-attention with per-row lengths through cuDNN's multi-head attention API, the
// same contract as attention.cu's cuBLASLt engine and checked against the same CPU twin
// (tests/gpu/gpu_ops_test.cpp).
//
// Mapping. cuDNN's API projects Q, K and V itself; kilter's qkv is already projected (the c_attn
// GEMM), so every projection is off (q/k/v/oProjSize = 0). With projections off cuDNN hands each
// of its heads the whole vector, so kilter's NH heads become NH separate cuDNN sequences with ONE
// cuDNN head each: the data is (B*NH, T, head_dim), sequence (b,h) has length lengths[b], and
// the causal mask is the per-query window [0, t+1) (loWinIdx/hiWinIdx). Positions past a
// sequence's length are padding, which cuDNN does not promise to write (its paddingFill option
// must be NULL): the head-merge kernels write those rows of out and dqkv as exactly 0, like the
// CPU twin's, whatever cuDNN left there.
//
// Support is decided once per (B,T) shape: the descriptor, cuDNN's buffer sizes, and a trial
// forward + backward on zeros at that shape. fp32 needs FMA math (IEEE products); a cuDNN that
// refuses it for fp32 counts as unsupported rather than silently running TF32.
//
// Why this API and not cuDNN's fused flash attention (SDPA): see docs/gpu.md. In short, SDPA
// takes fp16/bf16 tensors only while kilter's activations are fp32 in both precisions, and in
// cuDNN 9.19 it is reached only through a backend graph whose exact node pattern must match an
// engine; the multi-head attention API takes fp32, ragged lengths and windows directly.
#include <cudnn.h>

#include <cmath>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "io/base/cuda_common.h"
#include "lib/model/cuda_ops.h"

// The multi-head attention API is marked deprecated in cuDNN 9 (it stays in libcudnn_adv); kilter
// uses it on purpose (see above), so the warnings are silenced here only.
#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
#if defined(__NVCC__)
#pragma nv_diag_suppress 1444
#endif

namespace kilter::model::cuda {

namespace {

std::string cudnn_message(cudnnStatus_t status) {
  std::string text = cudnnGetErrorString(status);
  char detail[512] = {0};
  cudnnGetLastErrorString(detail, sizeof(detail));
  if (detail[0] != '\0') text += std::string(" (") + detail + ")";
  return text;
}

#define KILTER_CUDNN_CHECK(call)                                                                \
  do {                                                                                          \
    cudnnStatus_t kilter_cudnn_status_ = (call);                                                \
    if (kilter_cudnn_status_ != CUDNN_STATUS_SUCCESS)                                           \
      KILTER_FAIL("cuDNN call " << #call << " failed: " << cudnn_message(kilter_cudnn_status_)); \
  } while (0)

// dst[b*NH + h] = lengths[b]: cuDNN's device-side sequence lengths, one per (row, head).
__global__ void expand_lengths_kernel(int* dst, const int32_t* lengths, int B, int NH) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < B * NH) dst[i] = lengths[i / NH];
}

size_t floats_for_bytes(size_t bytes) { return (bytes + sizeof(float) - 1) / sizeof(float); }
size_t align64(size_t floats) { return (floats + 63) / 64 * 64; }

}  // namespace

struct CudnnAttention::Impl {
  struct Shape {
    cudnnAttnDescriptor_t attn = nullptr;
    size_t work_bytes = 0, reserve_bytes = 0;
    bool described = false;  // descriptor set and buffer sizes known
    bool ok = false;
    bool retry = false;      // the trial found no memory: try it again next time
    std::string why;
  };

  cudaStream_t stream = nullptr;
  GemmMath math = GemmMath::fp32;
  int C = 0, NH = 0, hd = 0;
  cudnnHandle_t handle = nullptr;
  cudnnSeqDataDescriptor_t q_desc = nullptr, k_desc = nullptr, v_desc = nullptr, o_desc = nullptr;
  cudnnMathType_t math_type = CUDNN_DEFAULT_MATH;
  std::string math_name;
  std::map<std::pair<int, int>, Shape> shapes;
  std::vector<int> low, high, seq_lengths;  // host arrays the API reads

  Shape& shape(int B, int T) {
    auto [it, inserted] = shapes.try_emplace({B, T});
    Shape& s = it->second;
    if (!inserted) {
      if (s.retry) s.ok = trial(s, B, T, &s.why, &s.retry);
      return s;
    }
    cudnnStatus_t status = cudnnCreateAttnDescriptor(&s.attn);
    if (status == CUDNN_STATUS_SUCCESS) status = set_descriptor(s.attn, B, T);
    size_t weight_bytes = 0;
    if (status == CUDNN_STATUS_SUCCESS)
      status = cudnnGetMultiHeadAttnBuffers(handle, s.attn, &weight_bytes, &s.work_bytes, &s.reserve_bytes);
    if (status == CUDNN_STATUS_SUCCESS && weight_bytes != 0) {
      s.why = "cuDNN asks for " + std::to_string(weight_bytes) + " bytes of projection weights with projections off";
      return s;
    }
    if (status != CUDNN_STATUS_SUCCESS) {
      s.why = cudnn_message(status);
      return s;
    }
    s.described = true;
    s.ok = trial(s, B, T, &s.why, &s.retry);
    return s;
  }

  cudnnStatus_t set_descriptor(cudnnAttnDescriptor_t attn, int B, int T) {
    const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
    return cudnnSetAttnDescriptor(attn, CUDNN_ATTN_QUERYMAP_ALL_TO_ONE | CUDNN_ATTN_DISABLE_PROJ_BIASES,
                                  /*nHeads=*/1, scale, CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, math_type, nullptr, nullptr,
                                  hd, hd, hd, 0, 0, 0, 0, T, T, B * NH, /*maxBeamSize=*/1);
  }

  // (B*NH, T, hd) sequences, batch-major: axes from outermost to innermost.
  void set_sequences(int B, int T, const int32_t* lengths_host) {
    seq_lengths.resize(static_cast<size_t>(B) * NH);
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < NH; ++h) seq_lengths[static_cast<size_t>(b) * NH + h] = lengths_host[b];
    int dims[CUDNN_SEQDATA_DIM_COUNT];
    dims[CUDNN_SEQDATA_TIME_DIM] = T;
    dims[CUDNN_SEQDATA_BATCH_DIM] = B * NH;
    dims[CUDNN_SEQDATA_BEAM_DIM] = 1;
    dims[CUDNN_SEQDATA_VECT_DIM] = hd;
    const cudnnSeqDataAxis_t axes[CUDNN_SEQDATA_DIM_COUNT] = {CUDNN_SEQDATA_BATCH_DIM, CUDNN_SEQDATA_BEAM_DIM,
                                                              CUDNN_SEQDATA_TIME_DIM, CUDNN_SEQDATA_VECT_DIM};
    for (cudnnSeqDataDescriptor_t desc : {q_desc, k_desc, v_desc, o_desc})
      KILTER_CUDNN_CHECK(cudnnSetSeqDataDescriptor(desc, CUDNN_DATA_FLOAT, CUDNN_SEQDATA_DIM_COUNT, dims, axes,
                                                   seq_lengths.size(), seq_lengths.data(), /*paddingFill=*/nullptr));
    low.assign(T, 0);
    high.resize(T);
    for (int t = 0; t < T; ++t) high[t] = t + 1;  // causal: keys [0, t]
  }

  struct Slices {
    float *q, *k, *v, *y, *dq, *dk, *dv;
    int* lengths;
    void* work;
  };
  Slices slices(float* workspace, int B, int T) const {
    const size_t btc = static_cast<size_t>(B) * T * C;
    Slices s;
    s.q = workspace;
    s.k = s.q + btc;
    s.v = s.k + btc;
    s.y = s.v + btc;
    s.dq = s.y + btc;
    s.dk = s.dq + btc;
    s.dv = s.dk + btc;
    s.lengths = reinterpret_cast<int*>(workspace + align64(7 * btc));
    s.work = workspace + align64(7 * btc) + align64(static_cast<size_t>(B) * NH);
    return s;
  }

  cudnnStatus_t call_forward(const Shape& s, const Slices& w, void* reserve);
  cudnnStatus_t call_backward(const Shape& s, const Slices& w, void* reserve);
  bool trial(const Shape& s, int B, int T, std::string* why, bool* retry);

  // What forward and backward both do first: the shape's descriptor, the workspace slices, the
  // per-sequence lengths on the device and in the descriptors, and q, k, v split per head.
  std::pair<Shape*, Slices> prepare(int B, int T, const float* qkv, const int32_t* lengths_host,
                                    const int32_t* lengths_device, float* workspace) {
    Shape& s = shape(B, T);
    KILTER_CHECK(s.ok, "cuDNN attention cannot run B=" << B << " T=" << T << ": " << s.why);
    const Slices w = slices(workspace, B, T);
    const int n = B * NH;
    expand_lengths_kernel<<<(n + 255) / 256, 256, 0, stream>>>(w.lengths, lengths_device, B, NH);
    KILTER_CUDA_LAUNCH_CHECK();
    attention_split_heads(w.q, w.k, w.v, qkv, B, T, NH, hd, stream);
    set_sequences(B, T, lengths_host);
    return {&s, w};
  }
};

cudnnStatus_t CudnnAttention::Impl::call_forward(const Shape& s, const Slices& w, void* reserve) {
  return cudnnMultiHeadAttnForward(handle, s.attn, /*currIdx=*/-1, low.data(), high.data(), w.lengths, w.lengths,
                                   q_desc, w.q, /*residuals=*/nullptr, k_desc, w.k, v_desc, w.v, o_desc, w.y, 0,
                                   nullptr, s.work_bytes, w.work, s.reserve_bytes, reserve);
}

// w.y holds dy here.
cudnnStatus_t CudnnAttention::Impl::call_backward(const Shape& s, const Slices& w, void* reserve) {
  return cudnnMultiHeadAttnBackwardData(handle, s.attn, low.data(), high.data(), w.lengths, w.lengths, o_desc, w.y,
                                        q_desc, w.dq, w.q, k_desc, w.dk, w.k, v_desc, w.dv, w.v, 0, nullptr,
                                        s.work_bytes, w.work, s.reserve_bytes, reserve);
}

// One forward + backward on zeros with every sequence full, in a scratch allocation: a shape
// cuDNN accepts on paper but cannot run is refused here (and, with train.attention=auto, runs on
// cuBLASLt) instead of failing in the middle of a step.
// *retry is set when the scratch could not be allocated (memory may be free later).
bool CudnnAttention::Impl::trial(const Shape& s, int B, int T, std::string* why, bool* retry) {
  *retry = false;
  const size_t btc = static_cast<size_t>(B) * T * C;
  const size_t workspace = align64(7 * btc) + align64(static_cast<size_t>(B) * NH) + align64(floats_for_bytes(s.work_bytes));
  float* scratch = nullptr;
  cudaError_t cuda_status = cudaMalloc(reinterpret_cast<void**>(&scratch),
                                       sizeof(float) * (workspace + floats_for_bytes(s.reserve_bytes)));
  if (cuda_status != cudaSuccess) {
    cudaGetLastError();
    *why = std::string("no device memory for a trial run (") + cudaGetErrorString(cuda_status) + ")";
    *retry = true;
    return false;
  }
  const Slices w = slices(scratch, B, T);
  float* reserve = scratch + workspace;
  cudnnStatus_t status = CUDNN_STATUS_SUCCESS;
  cuda_status = cudaMemsetAsync(scratch, 0, sizeof(float) * 7 * btc, stream);
  const std::vector<int> full(static_cast<size_t>(B) * NH, T);
  if (cuda_status == cudaSuccess)
    cuda_status = cudaMemcpyAsync(w.lengths, full.data(), sizeof(int) * full.size(), cudaMemcpyHostToDevice, stream);
  if (cuda_status == cudaSuccess) {
    const std::vector<int32_t> rows(B, T);
    set_sequences(B, T, rows.data());
    status = call_forward(s, w, reserve);
    if (status == CUDNN_STATUS_SUCCESS) status = call_backward(s, w, reserve);
    cuda_status = cudaStreamSynchronize(stream);  // also keeps `full` alive until the copy is done
  }
  cudaFree(scratch);
  if (status != CUDNN_STATUS_SUCCESS) {
    *why = "trial run: " + cudnn_message(status);
    return false;
  }
  if (cuda_status != cudaSuccess) {
    cudaGetLastError();
    *why = std::string("trial run: ") + cudaGetErrorString(cuda_status);
    return false;
  }
  return true;
}

CudnnAttention::CudnnAttention(cudaStream_t stream, GemmMath math, int C, int NH) : impl_(std::make_unique<Impl>()) {
  KILTER_CHECK(NH > 0 && C % NH == 0, "cuDNN attention: n_embd " << C << " is not a multiple of n_head " << NH);
  Impl& m = *impl_;
  m.stream = stream;
  m.math = math;
  m.C = C;
  m.NH = NH;
  m.hd = C / NH;
  // fp32: FMA math keeps the products IEEE fp32 like the CPU twin (a cuDNN that refuses it makes
  // every shape unsupported); bf16 mode lets cuDNN use tensor cores on fp32 data (TF32), the
  // closest this API comes to the GEMMs' bf16 math.
  m.math_type = math == GemmMath::fp32 ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH;
  m.math_name = math == GemmMath::fp32 ? "fp32 data, FMA math" : "fp32 data, default math (TF32 products allowed)";
  KILTER_CUDNN_CHECK(cudnnCreate(&m.handle));
  KILTER_CUDNN_CHECK(cudnnSetStream(m.handle, stream));
  for (cudnnSeqDataDescriptor_t* desc : {&m.q_desc, &m.k_desc, &m.v_desc, &m.o_desc})
    KILTER_CUDNN_CHECK(cudnnCreateSeqDataDescriptor(desc));
  // The multi-head attention API lives in libcudnn_adv: fail here, not at the first step, when
  // that sub-library is missing or does not match.
  KILTER_CUDNN_CHECK(cudnnAdvVersionCheck());
}

CudnnAttention::~CudnnAttention() {
  Impl& m = *impl_;
  for (auto& entry : m.shapes)
    if (entry.second.attn != nullptr) cudnnDestroyAttnDescriptor(entry.second.attn);
  for (cudnnSeqDataDescriptor_t desc : {m.q_desc, m.k_desc, m.v_desc, m.o_desc})
    if (desc != nullptr) cudnnDestroySeqDataDescriptor(desc);
  if (m.handle != nullptr) cudnnDestroy(m.handle);
}

bool CudnnAttention::supports(int B, int T, std::string* why, bool* retry) {
  const Impl::Shape& s = impl_->shape(B, T);
  if (!s.ok && why != nullptr) *why = s.why;
  if (retry != nullptr) *retry = s.retry;
  return s.ok;
}

size_t CudnnAttention::reserve_floats(int B, int T) {
  const Impl::Shape& s = impl_->shape(B, T);
  return s.ok ? floats_for_bytes(s.reserve_bytes) : 0;
}

size_t CudnnAttention::workspace_floats(int B, int T) {
  const Impl::Shape& s = impl_->shape(B, T);
  if (!s.ok) return 0;
  const size_t btc = static_cast<size_t>(B) * T * impl_->C;
  return align64(7 * btc) + align64(static_cast<size_t>(B) * impl_->NH) + floats_for_bytes(s.work_bytes);
}

void CudnnAttention::forward(float* out, float* reserve, const float* qkv, const int32_t* lengths_host,
                             const int32_t* lengths_device, int B, int T, float* workspace) {
  if (B == 0 || T == 0) return;
  Impl& m = *impl_;
  const auto [shape, w] = m.prepare(B, T, qkv, lengths_host, lengths_device, workspace);
  const Impl::Shape& s = *shape;
  KILTER_CUDNN_CHECK(m.call_forward(s, w, reserve));
  attention_merge_heads(out, w.y, B, T, m.NH, m.hd, m.stream, lengths_device);
}

void CudnnAttention::backward(float* dqkv, const float* dout, const float* qkv, float* reserve,
                              const int32_t* lengths_host, const int32_t* lengths_device, int B, int T,
                              float* workspace, bool accumulate) {
  if (B == 0 || T == 0) return;
  Impl& m = *impl_;
  const auto [shape, w] = m.prepare(B, T, qkv, lengths_host, lengths_device, workspace);
  const Impl::Shape& s = *shape;
  attention_split_grad(w.y, dout, B, T, m.NH, m.hd, m.stream);
  KILTER_CUDNN_CHECK(m.call_backward(s, w, reserve));
  attention_merge_qkv_grad(dqkv, w.dq, w.dk, w.dv, B, T, m.NH, m.hd, accumulate, m.stream, lengths_device);
}

std::string CudnnAttention::description() const {
  std::ostringstream text;
  const size_t version = cudnnGetVersion();
  text << "cuDNN " << version / 10000 << "." << (version / 100) % 100 << " multi-head attention API ("
       << impl_->math_name << ")";
  return text.str();
}

}  // namespace kilter::model::cuda
