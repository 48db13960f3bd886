// Learning-rate schedule (linear warmup, then cosine decay) and global-norm gradient clipping.
#pragma once
#include <cstdint>

namespace kilter::optim {

// step is 0-based. Warmup: lr * (step + 1) / warmup for step < warmup (lr/warmup at step 0,
// lr at step warmup - 1). Then cosine from lr at step `warmup` down to lr * min_lr_ratio at step
// `total`, and lr * min_lr_ratio afterwards. warmup = 0 starts directly with the cosine.
double learning_rate(int64_t step, int64_t warmup, int64_t total, double lr, double min_lr_ratio);

// The factor that brings a gradient of global L2 norm grad_norm down to max_norm, as
// torch.nn.utils.clip_grad_norm_ computes it: min(1, max_norm / (grad_norm + 1e-6)). 1 when
// clipping is off (max_norm <= 0). A non-finite grad_norm gives a non-finite or zero factor,
// which the trainer's on_nonfinite policy deals with.
float clip_scale(double grad_norm, double max_norm);

}  // namespace kilter::optim
