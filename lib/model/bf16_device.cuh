// Device helpers of the kernels that run on fp32 or bf16 storage (templates over T = float or
// __nv_bfloat16): values are read into fp32, all arithmetic is fp32, and a bf16 result is rounded
// once, to nearest even (__float2bfloat16_rn), where it is stored: the rounding points the CPU
// twins (lib/model/bf16_ops.h) reproduce. Also the warp reductions the row kernels share.
#pragma once
#include <cuda_bf16.h>

namespace kilter::model::cuda {

__device__ __forceinline__ float load_f(float x) { return x; }
__device__ __forceinline__ float load_f(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T store_f(float x);
template <>
__device__ __forceinline__ float store_f<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 store_f<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

__device__ __forceinline__ float warp_reduce_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
__device__ __forceinline__ float warp_reduce_max(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

}  // namespace kilter::model::cuda
