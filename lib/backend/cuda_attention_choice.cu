// Which attention engine runs an attention group's shape (train.attention; cuda_model_impl.cuh):
// cuDNN where it is built, supports the shape, and agrees with the cuBLASLt engine on a problem of
// that shape (ragged rows whose queries see their own key first, attention_self_check.h; forward
// and backward), decided once per shape;
// cuBLASLt otherwise, with one line on stderr (an error naming train.attention under "cudnn").
// Code that has never met a device proves itself here before a run trusts it.
#include <algorithm>
#include <cstdio>
#include <cstring>

#include "lib/backend/cuda_model_impl.cuh"
#include "lib/model/attention_self_check.h"

namespace kilter::backend {

namespace {

// result[0] = max |a - b|, result[1] = max |b|, as float bits (non-negative floats order like
// their bits; a NaN difference shows as a value above every finite one).
// Each thread takes its maximum, each warp combines them, and one lane per warp does the atomics
// (blockDim.x is a multiple of 32).
__global__ void max_difference_kernel(unsigned* result, const float* a, const float* b, size_t n) {
  unsigned diff = 0, ref = 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    diff = max(diff, __float_as_uint(fabsf(a[i] - b[i])));
    ref = max(ref, __float_as_uint(fabsf(b[i])));
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    diff = max(diff, __shfl_xor_sync(0xffffffffu, diff, offset));
    ref = max(ref, __shfl_xor_sync(0xffffffffu, ref, offset));
  }
  if (threadIdx.x % 32 == 0) {
    atomicMax(&result[0], diff);
    atomicMax(&result[1], ref);
  }
}

}  // namespace

void max_difference_on_device(unsigned* result, const float* a, const float* b, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  max_difference_kernel<<<grid_for(n, 256), 256, 0, stream>>>(result, a, b, n);
  KILTER_CUDA_LAUNCH_CHECK();
}

float relative_difference_of(const unsigned* result) {
  float diff, ref;
  std::memcpy(&diff, &result[0], sizeof diff);
  std::memcpy(&ref, &result[1], sizeof ref);
  return diff / std::max(ref, 1e-20f);
}

bool CudaModel::cudnn_for_shape(int B, int T) {
  if (!cudnn_) return false;
  const auto decided = cudnn_shapes_.find({B, T});
  if (decided != cudnn_shapes_.end()) return decided->second;
  std::string why;
  bool retry = false;
  const bool usable = cudnn_->supports(B, T, &why, &retry) && cudnn_agrees(B, T, &why, &retry);
  // Short of memory for the trial or the self-check: cuBLASLt this time, ask again next time.
  if (!usable && retry && options_.attention == "auto") return false;
  cudnn_shapes_[{B, T}] = usable;
  if (!usable) {
    KILTER_CHECK(options_.attention != "cudnn", "train.attention=cudnn: cuDNN attention cannot be used for micro-batches of B="
                                                    << B << " T=" << T << ": " << why
                                                    << " (use train.attention=auto or cublaslt)");
    std::fprintf(stderr, "kilter: cuda backend: cuDNN attention not used for B=%d T=%d (%s); this shape uses cuBLASLt attention\n",
                 B, T, why.c_str());
  }
  return usable;
}

bool CudaModel::cudnn_agrees(int B, int T, std::string* why, bool* retry) {
  *retry = false;
#ifdef KILTER_WITH_CUDNN
  const int C = cfg_.n_embd, NH = cfg_.n_head;
  const size_t btc = static_cast<size_t>(B) * T * C, att = static_cast<size_t>(B) * NH * T * T;
  const size_t saved = align_up(std::max(att, cudnn_->reserve_floats(B, T)));
  const size_t workspace = align_up(std::max(kc::attention_workspace_floats(B, T, C, NH), cudnn_->workspace_floats(B, T)));
  // qkv (3), dout (1), out x2 (2), dqkv x2 (6) tokens*C each, then each engine's saved state,
  // one workspace, the lengths and the comparison result.
  const size_t floats = 12 * align_up(btc) + 2 * saved + workspace + align_up(B) + kAlignFloats;
  // The activation arena holds nothing between micro-batches, and this runs in stream order
  // after the previous one and before the next upload lands: borrow it when it is large enough
  // (it normally is: it holds a whole model's activations for this shape).
  float* scratch = nullptr;
  const bool borrowed = arena_ != nullptr && floats <= capacity_floats_;
  if (borrowed) {
    scratch = arena_;
  } else {
    const cudaError_t status = cudaMalloc(reinterpret_cast<void**>(&scratch), sizeof(float) * floats);
    if (status != cudaSuccess) {
      cudaGetLastError();
      *why = std::string("no device memory for the self-check (") + cudaGetErrorString(status) + ")";
      *retry = true;
      return false;
    }
  }
  ArenaCarver carver(scratch);
  float* qkv = carver.take(3 * btc);
  float* dout = carver.take(btc);
  float* out_cudnn = carver.take(btc);
  float* out_cublas = carver.take(btc);
  float* dqkv_cudnn = carver.take(3 * btc);
  float* dqkv_cublas = carver.take(3 * btc);
  float* saved_cudnn = carver.take(saved);
  float* saved_cublas = carver.take(saved);
  float* work = carver.take(workspace);
  int32_t* lengths_device = carver.take_ints(B);
  unsigned* result = reinterpret_cast<unsigned*>(carver.take(4));
  std::vector<int32_t> lengths(B);
  std::vector<model::RowSpan> rows(B);
  for (int b = 0; b < B; ++b) {
    lengths[b] = b == 0 ? T : 1 + static_cast<int>((b * 7919L) % T);
    rows[b] = {b * T, lengths[b]};
  }
  // Each real row sees its own key first (attention_self_check.h), so that a mask off by one key
  // shows; pageable copies, staged before cudaMemcpyAsync returns.
  const std::vector<float> qkv_host = model::self_check_qkv(static_cast<size_t>(B) * T, model::AttentionShape::mha(C, NH),
                                                            rows, 12345u);
  const std::vector<float> dout_host = model::self_check_rows(btc, 54321u);
  bool agree = false;
  unsigned host_result[4] = {0, 0, 0, 0};
  try {
    KILTER_CUDA_CHECK(cudaMemcpyAsync(qkv, qkv_host.data(), sizeof(float) * qkv_host.size(), cudaMemcpyHostToDevice, stream_));
    KILTER_CUDA_CHECK(cudaMemcpyAsync(dout, dout_host.data(), sizeof(float) * btc, cudaMemcpyHostToDevice, stream_));
    KILTER_CUDA_CHECK(cudaMemcpyAsync(lengths_device, lengths.data(), sizeof(int32_t) * B, cudaMemcpyHostToDevice, stream_));
    KILTER_CUDA_CHECK(cudaMemsetAsync(result, 0, sizeof(unsigned) * 4, stream_));
    cudnn_->forward(out_cudnn, saved_cudnn, qkv, lengths.data(), lengths_device, B, T, work);
    cudnn_->backward(dqkv_cudnn, dout, qkv, saved_cudnn, lengths.data(), lengths_device, B, T, work, false);
    kc::attention_forward(*gemm_, out_cublas, saved_cublas, qkv, lengths_device, B, T, C, NH, work);
    kc::attention_backward(*gemm_, dqkv_cublas, dout, qkv, saved_cublas, lengths_device, B, T, C, NH, work, false);
    max_difference_on_device(result, out_cudnn, out_cublas, btc, stream_);
    max_difference_on_device(result + 2, dqkv_cudnn, dqkv_cublas, 3 * btc, stream_);
    KILTER_CUDA_CHECK(cudaMemcpyAsync(host_result, result, sizeof(host_result), cudaMemcpyDeviceToHost, stream_));
    KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));
    agree = true;
  } catch (const Error& e) {
    *why = std::string("self-check failed to run: ") + e.what();
    cudaStreamSynchronize(stream_);  // queued kernels may still use the scratch
    cudaGetLastError();
  }
  if (!borrowed) cudaFree(scratch);
  if (!agree) return false;
  // fp32: both engines run IEEE fp32 products; bf16: bf16 GEMMs against TF32 products.
  const float tolerance = options_.precision == "bf16" ? 5e-2f : 1e-3f;
  const float out_error = relative_difference_of(host_result);
  const float grad_error = relative_difference_of(host_result + 2);
  if (!(out_error <= tolerance && grad_error <= tolerance)) {
    char text[200];
    std::snprintf(text, sizeof(text), "self-check against cuBLASLt attention: relative difference %.3g in out, %.3g in dqkv (limit %.0e)",
                  out_error, grad_error, tolerance);
    *why = text;
    return false;
  }
  return true;
#else
  (void)B;
  (void)T;
  *retry = false;
  *why = "built without cuDNN";
  return false;
#endif
}

}  // namespace kilter::backend
