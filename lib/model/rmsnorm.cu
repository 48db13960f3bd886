// CUDA twin of lib/model/rmsnorm.cpp: RMSNorm (the Llama family) forward and backward on fp32
// rows, through the shared row kernels (norm_kernels.cuh). The bf16 datapath's norms are in
// residual_norm.cu.
#include "lib/model/norm_kernels.cuh"

namespace kilter::model::cuda {

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps,
                     cudaStream_t stream) {
  norm_detail::launch_forward<float, false, true>(nullptr, out, nullptr, rstd, inp, nullptr, weight, nullptr, N, C,
                                                  eps, stream);
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int N, int C, float* scratch, cudaStream_t stream) {
  norm_detail::launch_backward<float, true>(dinp, nullptr, dweight, nullptr, dout, inp, weight, nullptr, rstd, N, C,
                                            scratch, stream);
}

}  // namespace kilter::model::cuda
