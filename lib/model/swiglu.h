// SwiGLU (the Llama family's MLP activation): out = silu(gate) * up, silu(g) = g / (1 + exp(-g)),
// over the fused first projection's rows [gate | up].
#pragma once
#include <cstddef>

namespace kilter::model {

// inp (N, 2F): gate | up; out (N, F).
void swiglu_forward(float* out, const float* inp, int N, int F);

// dinp (N, 2F) = the gradient of gate | up from dout (N, F) (overwritten, not accumulated).
void swiglu_backward(float* dinp, const float* dout, const float* inp, int N, int F);

}  // namespace kilter::model
