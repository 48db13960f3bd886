// CUDA twin of lib/model/layernorm.cpp: LayerNorm (eps 1e-5) forward and backward.
// inp/out (N,C), mean/rstd (N). One warp per row for the row work; dweight/dbias are column sums
// over rows done in fixed chunks and summed in a fixed order, so results are deterministic.
#include "lib/backend/cuda_common.h"
#include "lib/backend/cuda_ops.h"

namespace kilter::model::cuda {

namespace {

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = 8;  // warps per block in the row kernels
constexpr int kColumnChunks = 64; // row chunks of the column sums (matmul.cu uses the same)

__device__ inline float warp_sum(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp,
                                         const float* weight, const float* bias, int N, int C, float eps) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.y;
  const int lane = threadIdx.x;
  if (row >= N) return;
  const float* x = inp + static_cast<size_t>(row) * C;
  float sum = 0.0f;
  for (int i = lane; i < C; i += kWarp) sum += x[i];
  const float m = warp_sum(sum) / C;
  float sq = 0.0f;
  for (int i = lane; i < C; i += kWarp) {
    const float d = x[i] - m;
    sq += d * d;
  }
  const float s = rsqrtf(warp_sum(sq) / C + eps);
  float* y = out + static_cast<size_t>(row) * C;
  for (int i = lane; i < C; i += kWarp) y[i] = (x[i] - m) * s * weight[i] + bias[i];
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

__global__ void layernorm_backward_input_kernel(float* dinp, const float* dout, const float* inp,
                                                const float* weight, const float* mean,
                                                const float* rstd, int N, int C) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.y;
  const int lane = threadIdx.x;
  if (row >= N) return;
  const size_t base = static_cast<size_t>(row) * C;
  const float m = mean[row];
  const float s = rstd[row];
  float dnorm_sum = 0.0f, dnorm_xhat_sum = 0.0f;
  for (int i = lane; i < C; i += kWarp) {
    const float xhat = (inp[base + i] - m) * s;
    const float dnorm = dout[base + i] * weight[i];
    dnorm_sum += dnorm;
    dnorm_xhat_sum += dnorm * xhat;
  }
  const float dnorm_mean = warp_sum(dnorm_sum) / C;
  const float dnorm_xhat_mean = warp_sum(dnorm_xhat_sum) / C;
  for (int i = lane; i < C; i += kWarp) {
    const float xhat = (inp[base + i] - m) * s;
    const float dnorm = dout[base + i] * weight[i];
    dinp[base + i] += (dnorm - dnorm_mean - xhat * dnorm_xhat_mean) * s;
  }
}

// Partial column sums of dout*xhat (dweight) and dout (dbias) over one chunk of rows.
// grid (ceil(C/32), kColumnChunks), block (32, 8).
__global__ void layernorm_backward_params_partial(float* partial_w, float* partial_b, const float* dout,
                                                  const float* inp, const float* mean,
                                                  const float* rstd, int N, int C) {
  __shared__ float shared_w[kRowsPerBlock][kWarp + 1];
  __shared__ float shared_b[kRowsPerBlock][kWarp + 1];
  const int c = blockIdx.x * kWarp + threadIdx.x;
  const int rows_per_chunk = (N + kColumnChunks - 1) / kColumnChunks;
  const int row_begin = blockIdx.y * rows_per_chunk;
  const int row_end = min(N, row_begin + rows_per_chunk);
  float sum_w = 0.0f, sum_b = 0.0f;
  if (c < C) {
    for (int r = row_begin + threadIdx.y; r < row_end; r += kRowsPerBlock) {
      const size_t i = static_cast<size_t>(r) * C + c;
      const float g = dout[i];
      sum_w += g * (inp[i] - mean[r]) * rstd[r];
      sum_b += g;
    }
  }
  shared_w[threadIdx.y][threadIdx.x] = sum_w;
  shared_b[threadIdx.y][threadIdx.x] = sum_b;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float w = 0.0f, b = 0.0f;
    for (int y = 0; y < kRowsPerBlock; ++y) {
      w += shared_w[y][threadIdx.x];
      b += shared_b[y][threadIdx.x];
    }
    partial_w[static_cast<size_t>(blockIdx.y) * C + c] = w;
    partial_b[static_cast<size_t>(blockIdx.y) * C + c] = b;
  }
}

__global__ void layernorm_backward_params_final(float* dweight, float* dbias, const float* partial_w,
                                                const float* partial_b, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float w = 0.0f, b = 0.0f;
  for (int k = 0; k < kColumnChunks; ++k) {
    w += partial_w[static_cast<size_t>(k) * C + c];
    b += partial_b[static_cast<size_t>(k) * C + c];
  }
  dweight[c] += w;
  dbias[c] += b;
}

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C, cudaStream_t stream, float eps) {
  if (N == 0) return;
  const dim3 block(kWarp, kRowsPerBlock);
  const unsigned grid = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  layernorm_forward_kernel<<<grid, block, 0, stream>>>(out, mean, rstd, inp, weight, bias, N, C, eps);
  KILTER_CUDA_LAUNCH_CHECK();
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C,
                        float* scratch, cudaStream_t stream) {
  if (N == 0) return;
  const dim3 block(kWarp, kRowsPerBlock);
  const unsigned grid = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  layernorm_backward_input_kernel<<<grid, block, 0, stream>>>(dinp, dout, inp, weight, mean, rstd, N, C);
  KILTER_CUDA_LAUNCH_CHECK();
  float* partial_w = scratch;
  float* partial_b = scratch + column_sum_scratch_floats(C);
  const dim3 partial_grid((C + kWarp - 1) / kWarp, kColumnChunks);
  layernorm_backward_params_partial<<<partial_grid, block, 0, stream>>>(partial_w, partial_b, dout, inp,
                                                                        mean, rstd, N, C);
  KILTER_CUDA_LAUNCH_CHECK();
  layernorm_backward_params_final<<<(C + 255) / 256, 256, 0, stream>>>(dweight, dbias, partial_w, partial_b, C);
  KILTER_CUDA_LAUNCH_CHECK();
}

}  // namespace kilter::model::cuda
