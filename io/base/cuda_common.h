// Error checks for CUDA, cuBLASLt, cuDNN and NCCL calls, and small launch helpers shared by the
// CUDA kernels (lib/model/*.cu), the CUDA backend (lib/backend/cuda_*.cu) and the NCCL communicator
// (lib/comm); the foundation below them (io/base/). Every failed call
// becomes a kilter::Error that names the call, the library's own message, file, line and rank.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "io/base/error.h"

// KILTER_CUDA_CHECK(cudaMalloc(...)): throws with cudaGetErrorString.
#define KILTER_CUDA_CHECK(call)                                                         \
  do {                                                                                  \
    cudaError_t kilter_cuda_status_ = (call);                                           \
    if (kilter_cuda_status_ != cudaSuccess)                                             \
      KILTER_FAIL("CUDA call " << #call << " failed: "                                  \
                               << cudaGetErrorString(kilter_cuda_status_));             \
  } while (0)

// KILTER_CUBLAS_CHECK(cublasLtMatmul(...)): throws with cublasLt's status name.
#define KILTER_CUBLAS_CHECK(call)                                                       \
  do {                                                                                  \
    cublasStatus_t kilter_cublas_status_ = (call);                                      \
    if (kilter_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                 \
      KILTER_FAIL("cuBLAS call " << #call << " failed: "                                \
                                 << ::kilter::backend::cublas_status_name(kilter_cublas_status_)); \
  } while (0)

// After a kernel launch: launch errors (bad configuration) surface here, not much later.
#define KILTER_CUDA_LAUNCH_CHECK() KILTER_CUDA_CHECK(cudaGetLastError())

namespace kilter::backend {

const char* cublas_status_name(cublasStatus_t status);

// The stream every kernel of the CUDA model runs on, created once per process on the device of
// cuda_device_index() (which it makes current on the calling thread). The NCCL communicator
// makes its own stream wait on this one before each collective, so a gradient range reported
// ready by the model is reduced only after the kernels that produce it.
cudaStream_t cuda_compute_stream();

// Blocks of `threads` covering n items, capped where a grid-stride loop takes over.
inline unsigned grid_for(size_t n, unsigned threads) {
  size_t blocks = (n + threads - 1) / threads;
  const size_t cap = 65535u * 8u;
  if (blocks > cap) blocks = cap;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks);
}

}  // namespace kilter::backend
