// RMSNorm over the last dimension (the Llama family; Hugging Face's LlamaRMSNorm):
// y = weight * x / sqrt(mean(x^2) + eps), in fp32.
#pragma once

namespace kilter::model {

// inp/out (N,C); weight (C); rstd (N) is saved for the backward pass.
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps);

// Accumulates (+=) into dinp (N,C) and dweight (C).
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int N, int C);

}  // namespace kilter::model
