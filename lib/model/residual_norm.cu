// The bf16 datapath's norms (train.bf16_storage): LayerNorm or RMSNorm on bf16 rows, fused with
// the residual add that precedes them (residual = round(a + b), then the norm of that stored sum),
// and their backward, which accumulates the residual stream's gradient in fp32 and writes its
// bf16 copy for the next GEMMs in the same pass. Twins: bf16_ops.h (residual_norm_forward_bf16,
// norm_forward_bf16, norm_backward_bf16).
#include "lib/model/norm_kernels.cuh"

namespace kilter::model::cuda {

void residual_norm_forward_bf16(bf16* residual, bf16* out, float* mean, float* rstd, const bf16* a, const bf16* b,
                                const float* weight, const float* bias, int N, int C, bool rms, float eps,
                                cudaStream_t stream) {
  using namespace norm_detail;
  if (b == nullptr && rms)
    launch_forward<bf16, false, true>(nullptr, out, mean, rstd, a, nullptr, weight, bias, N, C, eps, stream);
  else if (b == nullptr)
    launch_forward<bf16, false, false>(nullptr, out, mean, rstd, a, nullptr, weight, bias, N, C, eps, stream);
  else if (rms)
    launch_forward<bf16, true, true>(residual, out, mean, rstd, a, b, weight, bias, N, C, eps, stream);
  else
    launch_forward<bf16, true, false>(residual, out, mean, rstd, a, b, weight, bias, N, C, eps, stream);
}

void norm_backward_bf16(float* dresidual, bf16* dresidual_bf16, float* dweight, float* dbias, const bf16* dout,
                        const bf16* inp, const float* weight, const float* mean, const float* rstd, int N, int C,
                        bool rms, float* scratch, cudaStream_t stream) {
  if (rms)
    norm_detail::launch_backward<bf16, true>(dresidual, dresidual_bf16, dweight, nullptr, dout, inp, weight, nullptr,
                                             rstd, N, C, scratch, stream);
  else
    norm_detail::launch_backward<bf16, false>(dresidual, dresidual_bf16, dweight, dbias, dout, inp, weight, mean, rstd,
                                              N, C, scratch, stream);
}

}  // namespace kilter::model::cuda
