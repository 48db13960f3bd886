// CUDA twin of lib/model/crossentropy.cpp: fused softmax + cross-entropy forward and backward.
// logits (N,V), targets (N) with -1 = no target. One block per row: max, sum of exponentials,
// loss = logsumexp - logit[target], dlogits = (softmax - onehot) * dloss_scale. Per-row losses
// are summed by one block in a fixed order into a double, so the loss is deterministic.
#include "io/base/cuda_common.h"
#include "lib/model/cuda_ops.h"
#include "lib/model/crossentropy_kernels.cuh"

namespace kilter::model::cuda {

namespace {

using namespace crossentropy_detail;

// No __restrict__: dlogits may alias logits (in-place overwrite). Each thread reads an element
// before it writes the same element, and the target logit is read before any write.
__global__ void crossentropy_kernel(float* dlogits, const float* logits, const int32_t* targets,
                                    float* row_losses, int V, float dloss_scale, const float* dloss_scale_device,
                                    bool accumulate) {
  __shared__ float shared[kThreads / 32];
  if (dloss_scale_device != nullptr) dloss_scale = *dloss_scale_device;
  const size_t row = blockIdx.x;
  const float* x = logits + row * V;
  float* dx = dlogits + row * V;
  const int target = targets[row];
  if (target < 0 || target >= V) {
    if (!accumulate) {
      for (int i = threadIdx.x; i < V; i += kThreads) dx[i] = 0.0f;
    }
    if (threadIdx.x == 0) row_losses[row] = 0.0f;
    return;
  }
  const RowSoftmax softmax = row_softmax(x, V, target, shared);
  const float inv_sum = 1.0f / softmax.sum;
  for (int i = threadIdx.x; i < V; i += kThreads) {
    const float p = expf(x[i] - softmax.row_max) * inv_sum;
    const float g = (p - (i == target ? 1.0f : 0.0f)) * dloss_scale;
    dx[i] = accumulate ? dx[i] + g : g;
  }
  if (threadIdx.x == 0) row_losses[row] = softmax.loss();
}

}  // namespace

void crossentropy_forward_backward_async(float* dlogits, const float* logits, const int32_t* targets,
                                         int N, int V, float dloss_scale, double* loss_sum,
                                         bool accumulate, cudaStream_t stream, const float* dloss_scale_device) {
  if (N == 0) return;
  KILTER_CHECK(dlogits != logits || !accumulate,
               "crossentropy_forward_backward: in-place dlogits needs accumulate = false");
  // Row losses go to a small stream-ordered allocation: no arena bookkeeping for N floats.
  float* row_losses = nullptr;
  KILTER_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&row_losses), sizeof(float) * N, stream));
  crossentropy_kernel<<<N, kThreads, 0, stream>>>(dlogits, logits, targets, row_losses, V, dloss_scale,
                                                  dloss_scale_device, accumulate);
  KILTER_CUDA_LAUNCH_CHECK();
  sum_row_losses_kernel<<<1, kThreads, 0, stream>>>(loss_sum, row_losses, N);
  KILTER_CUDA_LAUNCH_CHECK();
  KILTER_CUDA_CHECK(cudaFreeAsync(row_losses, stream));
}

double crossentropy_forward_backward(float* dlogits, const float* logits, const int32_t* targets, int N,
                                     int V, float dloss_scale, cudaStream_t stream) {
  double* loss_sum = nullptr;
  KILTER_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&loss_sum), sizeof(double), stream));
  KILTER_CUDA_CHECK(cudaMemsetAsync(loss_sum, 0, sizeof(double), stream));
  crossentropy_forward_backward_async(dlogits, logits, targets, N, V, dloss_scale, loss_sum, true, stream);
  double host_loss = 0.0;
  KILTER_CUDA_CHECK(cudaMemcpyAsync(&host_loss, loss_sum, sizeof(double), cudaMemcpyDeviceToHost, stream));
  KILTER_CUDA_CHECK(cudaFreeAsync(loss_sum, stream));
  KILTER_CUDA_CHECK(cudaStreamSynchronize(stream));
  return host_loss;
}

}  // namespace kilter::model::cuda
