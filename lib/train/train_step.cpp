// The stages of one training step (train_step.h).
#include "lib/train/train_step.h"

#include <cmath>
#include <cstdio>

#include "io/error.h"
#include "lib/optim/schedule.h"
#include "lib/train/signals.h"

namespace kilter::train {

double compute_gradients(StepContext& ctx, const balance::StepView& step, StepWork& work) {
  model::Model& model = *ctx.model;
  diag::RankDiagnostics& diagnostics = *ctx.diagnostics;
  const auto [first, end] = step.rank_micro_batches(ctx.rank);
  const float loss_scale = 1.0f / float(step.target_tokens());
  double loss_sum = 0;
  if (first == end) {
    // No micro-batch for this rank in this step: contribute zeros to the reduction.
    ctx.reducer->begin();
    diagnostics.mark_arrival();
    ctx.reducer->ready(0, model.layout().padded_size);
    return 0;
  }
  balance::MicroBatch mb;
  for (uint32_t id = first; id < end; ++id) {
    step.micro_batch(id, mb);
    const bool last = id + 1 == end;
    ctx.fill_prefetch();
    diagnostics.phase_begin(diag::kDataWait);
    const io::ReadyGroup& group = ctx.reader->next();
    diagnostics.phase_end(diag::kDataWait);
    diagnostics.phase_begin(diag::kH2D);
    assemble_batch(group, mb, ctx.batch);
    diagnostics.phase_end(diag::kH2D);
    ctx.fill_prefetch();
    work.add(ctx.batch);

    // forward_backward runs both passes; the model's backward-start hook (or, failing that,
    // the first finished gradient range) splits the forward and backward phases.
    diagnostics.phase_begin(diag::kForward);
    bool backward_started = false;
    auto note_backward = [&]() {
      if (!backward_started) {
        backward_started = true;
        diagnostics.phase_end(diag::kForward);
        diagnostics.phase_begin(diag::kBackward);
      }
    };
    model.set_backward_start_hook(note_backward);
    model::GradReadyFn on_ready;
    if (last) {
      ctx.reducer->begin();
      on_ready = [&](size_t offset, size_t count) {
        note_backward();
        ctx.reducer->ready(offset, count);
      };
    } else {
      on_ready = [&](size_t, size_t) { note_backward(); };
    }
    loss_sum += model.forward_backward(ctx.batch, loss_scale, on_ready);
    note_backward();
    diagnostics.phase_end(diag::kBackward);
    model.set_backward_start_hook({});
    if (last) diagnostics.mark_arrival();
  }
  return loss_sum;
}

ReducedStep reduce(StepContext& ctx, const balance::StepView& step, double local_loss_sum, int64_t step_index) {
  ctx.watchdog->enter("gradient reduction", long(step_index));
  const double exposed = ctx.reducer->finish();
  ctx.diagnostics->add_phase_seconds(diag::kCommExposed, exposed);
  // Loss of the global step and the stop flag in one small collective.
  double scalars[2] = {local_loss_sum, double(stop_signal_received() != 0)};
  MPI_Allreduce(MPI_IN_PLACE, scalars, 2, MPI_DOUBLE, MPI_SUM, ctx.world);
  ctx.watchdog->leave();
  ReducedStep reduced;
  reduced.loss = scalars[0] / double(step.target_tokens());
  reduced.stop_requested = scalars[1] > 0;
  return reduced;
}

UpdateResult update(StepContext& ctx, const TrainConfig& train, double loss, int64_t step_index, int64_t total_steps) {
  model::Model& model = *ctx.model;
  ctx.diagnostics->phase_begin(diag::kOptimizer);
  UpdateResult result;
  result.grad_norm = std::sqrt(model.grad_norm_squared());
  if (!std::isfinite(loss) || !std::isfinite(result.grad_norm)) {
    KILTER_CHECK(train.on_nonfinite == "skip",
                 "step " << step_index << ": non-finite " << (std::isfinite(loss) ? "gradient norm" : "loss")
                         << " (loss " << loss << ", grad norm " << result.grad_norm
                         << "); lower train.lr or set train.on_nonfinite = skip");
    result.skipped = true;
    if (ctx.rank == 0)
      std::fprintf(stderr, "kilter: step %lld: non-finite loss or gradient norm, update skipped\n",
                   (long long)step_index);
  }
  result.lr = optim::learning_rate(step_index, train.warmup, total_steps, train.lr, train.min_lr_ratio);
  if (!result.skipped) {
    model::AdamWParams ap;
    ap.lr = float(result.lr);
    ap.beta1 = float(train.beta1);
    ap.beta2 = float(train.beta2);
    ap.eps = float(train.eps);
    ap.weight_decay = float(train.weight_decay);
    ap.grad_scale = train.grad_clip > 0 ? optim::clip_scale(result.grad_norm, train.grad_clip) : 1.0f;
    ap.t = step_index + 1;
    model.adamw_step(ap);
  }
  model.synchronize();
  ctx.diagnostics->phase_end(diag::kOptimizer);
  return result;
}

}  // namespace kilter::train
