// What the two softmax cross-entropy kernels share: crossentropy.cu's on fp32 logits and
// classifier.cu's on a chunk of bf16 logits (the bf16 datapath). One block of kThreads per row:
// the row's max, sum of exponentials and target logit over its V real columns, reduced in fp32
// in a fixed order, then each kernel writes its gradient; and the one-block sum of the row losses
// in double, in a fixed order, so the loss is deterministic. Included by .cu files only.
#pragma once
#include <cmath>
#include <cstdint>

#include "lib/model/bf16_device.cuh"

namespace kilter::model::cuda::crossentropy_detail {
namespace {  // each including .cu file gets its own kernels

constexpr int kThreads = 256;

// The block's max or sum of v, the same on every thread; the warps' results added in warp order.
__device__ float block_reduce(float v, bool use_max, float* shared) {
  v = use_max ? warp_reduce_max(v) : warp_reduce_sum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // shared may still be read by a previous reduction
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float result = shared[0];
  for (int w = 1; w < kThreads / 32; ++w) result = use_max ? fmaxf(result, shared[w]) : result + shared[w];
  return result;
}

// The softmax of a row of logits over its V real columns: p_i = exp(x_i - row_max) / sum.
struct RowSoftmax {
  float row_max, sum, target_logit;
  __device__ float loss() const { return logf(sum) + row_max - target_logit; }  // logsumexp - x[target]
};

// Every thread of the block has read x[target] when this returns, so the row may then be
// overwritten in place (the gradient written over the logits).
template <typename Stored>
__device__ __forceinline__ RowSoftmax row_softmax(const Stored* x, int V, int target, float* shared) {
  float local_max = -INFINITY;
  for (int i = threadIdx.x; i < V; i += kThreads) local_max = fmaxf(local_max, load_f(x[i]));
  const float row_max = block_reduce(local_max, true, shared);
  float local_sum = 0.0f;
  for (int i = threadIdx.x; i < V; i += kThreads) local_sum += expf(load_f(x[i]) - row_max);
  const float sum = block_reduce(local_sum, false, shared);
  const float target_logit = load_f(x[target]);
  __syncthreads();
  return {row_max, sum, target_logit};
}

// One block: loss_sum += sum(row_losses) in doubles, fixed order.
__global__ void sum_row_losses_kernel(double* loss_sum, const float* row_losses, int N) {
  __shared__ double shared[kThreads];
  double local = 0.0;
  for (int i = threadIdx.x; i < N; i += kThreads) local += row_losses[i];
  shared[threadIdx.x] = local;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) *loss_sum += shared[0];
}

}  // namespace
}  // namespace kilter::model::cuda::crossentropy_detail
