// GELU, tanh approximation (GPT-2; torch's approximate="tanh").
#pragma once
#include <cstddef>

namespace kilter::model {

// out (N) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
void gelu_forward(float* out, const float* inp, size_t N);

// dinp (N) += gelu'(inp) * dout
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t N);

// d (N) = gelu'(inp) * d, in place: the model's fused form (no buffer to zero first).
void gelu_backward_inplace(float* d, const float* inp, size_t N);

}  // namespace kilter::model
