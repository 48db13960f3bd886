// Warmup + cosine learning-rate schedule and the clipping factor (see schedule.h).
#include "lib/optim/schedule.h"

#include <cmath>

namespace kilter::optim {

double learning_rate(int64_t step, int64_t warmup, int64_t total, double lr, double min_lr_ratio) {
  const double min_lr = lr * min_lr_ratio;
  if (step < warmup) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (step >= total || total <= warmup) return step >= total ? min_lr : lr;
  const double progress = static_cast<double>(step - warmup) / static_cast<double>(total - warmup);
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return min_lr + cosine * (lr - min_lr);
}

float clip_scale(double grad_norm, double max_norm) {
  if (max_norm <= 0.0) return 1.0f;
  if (std::isnan(grad_norm)) return static_cast<float>(grad_norm);
  const double factor = max_norm / (grad_norm + 1e-6);
  return static_cast<float>(factor < 1.0 ? factor : 1.0);
}

}  // namespace kilter::optim
