// AdamW (Loshchilov & Hutter) with decoupled weight decay, exactly as torch.optim.AdamW computes
// it, so that kilter and PyTorch take the same step from the same state.
#pragma once
#include <cstddef>
#include <cstdint>

namespace kilter::optim {

// One step over n elements; t is the 1-based step count for bias correction. grads are first
// multiplied by grad_scale (global-norm clipping). Per element, with g = grad * grad_scale:
//   param -= lr * weight_decay * param                      (decoupled decay; pass 0 to skip)
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//   param -= (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
void adamw_update(float* params, const float* grads, float* m, float* v, size_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, float grad_scale, int64_t t);

}  // namespace kilter::optim
