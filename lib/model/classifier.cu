// The LM head's loss and gradient on a chunk of bf16 logits (the bf16 datapath; twin:
// classifier_bf16 in bf16_ops.h). The model computes the logits of a chunk of rows against the
// vocabulary-padded head (Vp columns, rows V..Vp-1 of the head zero), this kernel turns them into
// dlogits in place, and the two backward GEMMs follow, chunk after chunk: no N x V buffer exists,
// and none in fp32. One block per row: max and the sum of exponentials over the V real columns
// in fp32, loss = logsumexp - logit[target], dlogits = round((softmax - onehot) * scale); padded
// columns and rows without a target get 0. Row losses are summed in double in a fixed order.
#include <algorithm>

#include "io/base/cuda_common.h"
#include "lib/model/cuda_ops.h"
#include "lib/model/crossentropy_kernels.cuh"
#include "lib/model/gemm_call.h"

namespace kilter::model::cuda {

namespace {

using namespace crossentropy_detail;

// Each thread reads an element before it writes the same element; the target logit is read by
// every thread before any write (row_softmax).
__global__ void classifier_kernel(bf16* logits, float* row_losses, const int32_t* targets, int V, int Vp,
                                  float dloss_scale, const float* scale_device, bool backward) {
  __shared__ float shared[kThreads / 32];
  if (scale_device != nullptr) dloss_scale = *scale_device;
  const size_t row = blockIdx.x;
  bf16* x = logits + row * Vp;
  const int target = targets[row];
  if (target < 0 || target >= V) {
    if (backward)
      for (int i = threadIdx.x; i < Vp; i += kThreads) x[i] = __float2bfloat16_rn(0.0f);
    if (threadIdx.x == 0) row_losses[row] = 0.0f;
    return;
  }
  const RowSoftmax softmax = row_softmax(x, V, target, shared);
  if (threadIdx.x == 0) row_losses[row] = softmax.loss();
  if (!backward) return;
  const float inv_sum = 1.0f / softmax.sum;
  for (int i = threadIdx.x; i < Vp; i += kThreads) {
    const float p = i < V ? expf(load_f(x[i]) - softmax.row_max) * inv_sum : 0.0f;
    x[i] = __float2bfloat16_rn(i < V ? (p - (i == target ? 1.0f : 0.0f)) * dloss_scale : 0.0f);
  }
}

}  // namespace

void classifier_bf16(bf16* logits, float* row_losses, const int32_t* targets, int R, int V, int Vp, float dloss_scale,
                     const float* scale_device, bool backward, cudaStream_t stream) {
  if (R == 0) return;
  classifier_kernel<<<R, kThreads, 0, stream>>>(logits, row_losses, targets, V, Vp, dloss_scale, scale_device, backward);
  KILTER_CUDA_LAUNCH_CHECK();
}

void sum_row_losses(double* loss_sum, const float* row_losses, int N, cudaStream_t stream) {
  if (N == 0) return;
  sum_row_losses_kernel<<<1, kThreads, 0, stream>>>(loss_sum, row_losses, N);
  KILTER_CUDA_LAUNCH_CHECK();
}

void classifier_chunks_bf16(Gemm& gemm, bf16* dx, float* dweight, const bf16* x, const bf16* weight,
                            const int32_t* targets, int N, int C, int V, int Vp, int R, bf16* logits,
                            float* row_losses, double* loss_sum, float dloss_scale, const float* scale_device,
                            bool backward) {
  cudaStream_t stream = gemm.stream();
  for (int r0 = 0; r0 < N; r0 += R) {
    const int rows = std::min(R, N - r0);
    const bf16* xc = x + static_cast<size_t>(r0) * C;
    // logits' (Vp,rows) = W'^T x'
    KILTER_CHECK(gemm.run_typed(gemm_call(logits, weight, xc, Vp, rows, C, /*trans_a=*/true)),
                 "cuBLASLt has no bf16 algorithm for the LM head's logits");
    classifier_bf16(logits, row_losses + r0, targets + r0, rows, V, Vp, dloss_scale, scale_device, backward, stream);
    if (!backward) continue;
    // dx' (C,rows) = W' (C,Vp) dlogits' (Vp,rows)
    KILTER_CHECK(gemm.run_typed(gemm_call(dx + static_cast<size_t>(r0) * C, weight, logits, C, rows, Vp)),
                 "cuBLASLt has no bf16 algorithm for the LM head's input gradient");
    // dW' (C,V) += x' (C,rows) dlogits'^T (rows,V): the real vocabulary's columns only.
    GemmCall dw = gemm_call(dweight, xc, logits, C, V, rows, /*trans_a=*/false, /*trans_b=*/true);
    dw.ldb = Vp;
    dw.cd = GemmType::f32;
    dw.beta = 1.0f;
    KILTER_CHECK(gemm.run_typed(dw), "cuBLASLt has no bf16 algorithm for the LM head's weight gradient");
  }
  sum_row_losses(loss_sum, row_losses, N, stream);
}

}  // namespace kilter::model::cuda
