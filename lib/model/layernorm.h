// LayerNorm over the last dimension, eps 1e-5 by default (GPT-2, torch.nn.LayerNorm defaults;
// model.norm_eps).
#pragma once

namespace kilter::model {

constexpr float kLayerNormEps = 1e-5f;

// inp/out (N,C); weight/bias (C); mean/rstd (N) are saved for the backward pass.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C, float eps = kLayerNormEps);

// Accumulates (+=) into dinp (N,C), dweight (C) and dbias (C).
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C);

}  // namespace kilter::model
