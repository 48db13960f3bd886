// The stages of one training step (train_step.h).
#include "lib/train/train_step.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <sstream>

#include "io/base/error.h"
#include "io/text_format.h"
#include "lib/optim/schedule.h"
#include "lib/train/cut_schedule.h"
#include "lib/train/guards.h"
#include "lib/train/signals.h"

namespace kilter::train {

int padding_micro_batches(const StepContext& ctx, const balance::StepView& step) {
  if (!ctx.param_shards) return 0;
  int size = 1;
  MPI_Comm_size(ctx.world, &size);
  uint32_t most = 0;
  for (int r = 0; r < size; ++r) {
    const auto [first, end] = step.rank_micro_batches(r);
    most = std::max(most, end - first);
  }
  const auto [first, end] = step.rank_micro_batches(ctx.rank);
  return int(most - (end - first));
}

model::Batch padding_micro_batch() {
  model::Batch empty;
  const int32_t token = 0;
  empty.append_piece(&token, nullptr, 1);
  return empty;
}

namespace {

// One token without a target: every unit is gathered and reduce-scattered as in a real
// micro-batch, and the gradients it adds are zeros.
void run_padding_micro_batches(StepContext& ctx, int count, float loss_scale) {
  if (count == 0) return;
  const model::Batch empty = padding_micro_batch();
  for (int i = 0; i < count; ++i) ctx.model->forward_backward(empty, loss_scale, {});
}

}  // namespace

double compute_gradients(StepContext& ctx, const balance::StepView& step, StepWork& work) {
  model::Model& model = *ctx.model;
  diag::RankDiagnostics& diagnostics = *ctx.diagnostics;
  const auto [first, end] = step.rank_micro_batches(ctx.rank);
  // The test hook makes this rank's gradient NaN (its loss stays finite).
  const float loss_scale = nonfinite_gradient_injected_for_test(ctx.rank, ctx.step_index)
                               ? std::numeric_limits<float>::quiet_NaN()
                               : 1.0f / float(step.target_tokens());
  double loss_sum = 0;
  ctx.local_nonfinite = false;
  const int padding = padding_micro_batches(ctx, step);
  if (ctx.param_shards) {
    ctx.param_shards->set_step(long(ctx.step_index));
    ctx.param_shards->set_diagnostics(ctx.diagnostics);  // gather_wait and scatter_wait
    ctx.param_shards->release_all();  // a whole-buffer write (initialization, a resume) leaves nothing behind
  }
  if (first == end) {
    // No micro-batch for this rank in this step: contribute zeros to the reduction.
    ctx.reducer->begin();
    run_padding_micro_batches(ctx, padding, loss_scale);
    diagnostics.mark_arrival();
    ctx.reducer->ready(0, model.layout().padded_size);
    return 0;
  }
  // Pieces cut between ranks: every rank lists them alike from the plan, no message needed.
  const StepCuts cuts = StepCuts::of(step);
  comm::KvExchangeOptions kv_options;
  kv_options.n_layer = model.config().n_layer;
  kv_options.rows = model::kv_row_layout(model.config());
  kv_options.timeout_s = ctx.kv_timeout_s;
  std::unique_ptr<comm::CutExchange> exchange;
  kv_options.on_wait = [&](const comm::KvWaitEvent& e) {
    diag::RankDiagnostics::KvWait wait;
    wait.begin_ns = e.begin_ns;
    wait.end_ns = e.end_ns;
    wait.layer = e.layer;
    wait.backward = e.backward;
    wait.peer = e.last_rank;
    if (e.last_piece >= 0) wait.piece = exchange->schedule().describe_piece(e.last_piece);
    diagnostics.kv_wait(wait);
  };
  balance::MicroBatch mb;
  for (uint32_t id = first; id < end; ++id) {
    step.micro_batch(id, mb);
    const bool last = id + 1 == end;
    comm::KvSchedule schedule = cuts.schedule(mb, ctx.rank, id - first, ctx.step_index);
    exchange.reset();
    if (!schedule.empty()) {
      KILTER_CHECK(ctx.make_kv_exchange, "step " << ctx.step_index << " holds a piece cut between ranks "
                                                  << "but this trainer has no K/V exchange");
      work.kv_tokens += schedule.kv_tokens();
      work.kv_bytes += schedule.bytes_per_step(kv_options.n_layer, kv_options.rows.kv_width);
      exchange = kv_exchange_for_test(ctx.make_kv_exchange(std::move(schedule), kv_options), ctx.rank,
                                      ctx.step_index, kv_options.n_layer);
    }
    ctx.fill_prefetch();
    diagnostics.phase_begin(diag::kDataWait);
    const io::ReadyGroup& group = ctx.reader->next();
    diagnostics.phase_end(diag::kDataWait);
    diagnostics.phase_begin(diag::kH2D);
    assemble_batch(group, mb, ctx.batch);
    ctx.batch.exchange = exchange.get();
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
    // train.grad_dtype = bf16: each finished range into the bf16 sum (StepContext::bf16_grads).
    auto accumulate = [&](size_t offset, size_t count) {
      if (ctx.bf16_grads) model.round_grads_bf16(offset, count);
    };
    if (last) {
      ctx.reducer->begin();
      on_ready = [&](size_t offset, size_t count) {
        note_backward();
        accumulate(offset, count);
        // This rank's own gradient, final before the reduction mixes it with the others':
        // the only place to tell which rank a non-finite value came from.
        if (!ctx.local_nonfinite && !model.grads_finite(offset, count)) ctx.local_nonfinite = true;
        ctx.reducer->ready(offset, count);
      };
    } else {
      on_ready = [&](size_t offset, size_t count) {
        note_backward();
        accumulate(offset, count);
      };
    }
    loss_sum += model.forward_backward(ctx.batch, loss_scale, on_ready);
    if (exchange) exchange->finish();  // its last sends, before the next micro-batch's
    ctx.batch.exchange = nullptr;
    note_backward();
    diagnostics.phase_end(diag::kBackward);
    model.set_backward_start_hook({});
    if (last && padding == 0) diagnostics.mark_arrival();
  }
  if (padding > 0) {
    run_padding_micro_batches(ctx, padding, loss_scale);
    diagnostics.mark_arrival();
  }
  if (!std::isfinite(loss_sum)) ctx.local_nonfinite = true;
  return loss_sum;
}

ReducedStep reduce(StepContext& ctx, const balance::StepView& step, double local_loss_sum, int64_t step_index) {
  // The last step's parameter gather has arrived where this rank ran a forward; a rank without
  // micro-batches this step waits for it here, closing its watchdog section first.
  ctx.model->finish_arriving_params();
  // Sharded parameters: the step's last reduce-scatter, a watchdog section of its own (sections
  // do not nest), before the reduction's.
  if (ctx.param_shards) ctx.param_shards->wait_reduce_scatter();
  ctx.watchdog->enter("gradient reduction", long(step_index));
  const double exposed = ctx.reducer->finish();
  ctx.diagnostics->add_phase_seconds(diag::kCommExposed, exposed);
  // Loss of the global step, the stop flag, the non-finite flag, rank 0's "a timed checkpoint
  // is due", rank 0's cut-cost verdict, rank 0's calibration verdict and the count of ranks still
  // building a re-plan in one small collective (no rank waits on another's clock; only rank 0
  // adds a non-zero verdict, so every rank reads its exact value).
  double scalars[7] = {local_loss_sum, double(stop_signal_received() != 0), double(ctx.local_nonfinite),
                       double(ctx.checkpoint_due), ctx.replan_t, double(ctx.calibration_verdict),
                       double(ctx.replan_building)};
  MPI_Allreduce(MPI_IN_PLACE, scalars, 7, MPI_DOUBLE, MPI_SUM, ctx.world);
  ReducedStep reduced;
  reduced.loss = scalars[0] / double(step.target_tokens());
  reduced.stop_requested = scalars[1] > 0;
  reduced.checkpoint_due = scalars[3] > 0;
  reduced.replan_t = scalars[4];
  reduced.calibration_verdict = scalars[5] > 0;
  reduced.replans_building = int(scalars[6]);
  if (scalars[2] > 0) {
    // Every rank saw the same sum, so every rank joins this allgather.
    int size = 1;
    MPI_Comm_size(ctx.world, &size);
    const int mine = ctx.local_nonfinite ? 1 : 0;
    std::vector<int> flags(static_cast<size_t>(size));
    MPI_Allgather(&mine, 1, MPI_INT, flags.data(), 1, MPI_INT, ctx.world);
    for (int r = 0; r < size; ++r)
      if (flags[size_t(r)]) reduced.nonfinite_ranks.push_back(r);
  }
  ctx.watchdog->leave();
  return reduced;
}

UpdateResult update(StepContext& ctx, const TrainConfig& train, const ReducedStep& reduced, int64_t step_index,
                    int64_t total_steps) {
  model::Model& model = *ctx.model;
  ctx.diagnostics->phase_begin(diag::kOptimizer);
  UpdateResult result;
  const double loss = reduced.loss;
  double norm_squared = model.grad_norm_squared();
  // Sharded: each rank summed its own ranges; the global norm is one small allreduce away. It
  // and the parameters' gather are collectives a lost rank would leave hanging: the watchdog
  // brackets them (a gather left to the communication thread bounds its own waits).
  if (ctx.shard_optimizer) {
    ctx.watchdog->enter("gradient norm allreduce", long(step_index));
    if (!ctx.shard_norm_counts) norm_squared = 0;  // a replica of the first node's shard
    MPI_Allreduce(MPI_IN_PLACE, &norm_squared, 1, MPI_DOUBLE, MPI_SUM, ctx.world);
    ctx.watchdog->leave();
  }
  result.grad_norm = std::sqrt(norm_squared);
  if (!reduced.nonfinite_ranks.empty() || !std::isfinite(loss) || !std::isfinite(result.grad_norm)) {
    std::ostringstream what;
    what << "step " << step_index << ": non-finite " << (std::isfinite(loss) ? "gradient" : "loss")
         << (reduced.nonfinite_ranks.empty()
                 ? std::string(" after the reduction (no rank's own values were flagged: this backend does not check them)")
                 : (reduced.nonfinite_ranks.size() == 1 ? " on rank " : " on ranks ") +
                       io::rank_list_text(reduced.nonfinite_ranks))
         << " (loss " << loss << ", grad norm " << result.grad_norm << ")";
    KILTER_CHECK(train.on_nonfinite == "skip",
                 what.str() << "; every rank stops: lower train.lr or raise train.warmup, check that step's data, or "
                               "set train.on_nonfinite = skip to skip such steps");
    result.skipped = true;
    if (ctx.rank == 0)
      std::fprintf(stderr, "kilter: warning: %s: update skipped on every rank (train.on_nonfinite = skip)\n",
                   what.str().c_str());
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
    if (ctx.shard_optimizer) {
      // Every rank updated its own ranges; all of them reach every rank before the next forward
      // reads them (the bf16 working copy under the distributed optimizer, else the parameters).
      // With a communication thread (comm.overlap = thread) the gather runs there, first layers first, and the model waits for each layer's range as its forward gets to it.
      model.synchronize();
      if (ctx.reducer->gathers_in_background() && model.takes_arriving_params()) {
        // One watchdog section from here until the last range has arrived, so a rank lost during
        // the gather is named like one lost in any other collective. It waits only until the
        // communication thread has the last range (gather_arrival), not until the forward has read
        // it (the model's wait, at the latest before the next step's reduction: reduce(), leaves
        // it): a rank stalled before its next forward is named by the others at their next
        // collective, not blamed on a finished gather.
        if (uint16_t* working = model.gathered_working_copy())
          ctx.reducer->start_gather_bf16(working);
        else
          ctx.reducer->start_gather(model.params());
        ctx.watchdog->enter("parameter all-gather", long(step_index), ctx.reducer->gather_arrival());
        comm::GradientReducer* reducer = ctx.reducer;
        Watchdog* watchdog = ctx.watchdog;
        const size_t padded = model.layout().padded_size;
        model.params_arriving([reducer, watchdog, padded](size_t end) {
          reducer->wait_gather(end);
          if (end >= padded) watchdog->leave();
        });
      } else {
        ctx.watchdog->enter("parameter all-gather", long(step_index));
        if (uint16_t* working = model.gathered_working_copy())
          ctx.reducer->gather_bf16(working);
        else
          ctx.reducer->gather(model.params());
        ctx.watchdog->leave();
        model.params_changed();
      }
    }
  }
  model.synchronize();
  ctx.diagnostics->phase_end(diag::kOptimizer);
  return result;
}

}  // namespace kilter::train
