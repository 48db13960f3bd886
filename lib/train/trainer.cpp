// The training job of `kilter train` (see trainer.h) in three parts: make_run() sets the run up
// (run_setup.h), run_steps() below runs its steps, write_run_summary() ends it (run_summary.h).
// A step reads plan -> read -> forward/backward -> reduce -> update (the stages are in
// train_step.h). Every rank runs the same sequence of collectives every step whatever its data:
// the plan gives each rank the same number of steps, and a rank with no micro-batch in a step
// still joins the gradient reduction with zeros.
#include "lib/train/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>

#include "lib/balance/plan.h"
#include "lib/diag/tensorboard_writer.h"
#include "lib/train/evaluation.h"
#include "lib/train/guards.h"
#include "lib/train/calibration_driver.h"
#include "lib/train/run_setup.h"
#include "lib/train/run_summary.h"
#include "lib/train/signals.h"

namespace kilter::train {

namespace {

std::string format_duration(double s) {
  char buf[64];
  if (s < 0 || !std::isfinite(s)) return "?";
  long t = long(s + 0.5);
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t / 60) % 60);
  else if (t >= 60)
    std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%lds", t);
  return buf;
}

// The loop's own state: what it reports (progress) and when it last logged and checkpointed.
struct StepLoop {
  RunProgress progress;
  double t_last_log = 0;
  double tokens_since_log = 0;
  // output.checkpoint_minutes: rank 0's clock decides, and the step's reduction tells every rank.
  double t_last_checkpoint = 0;
  balance::CutCostCheck cut_check;  // rank 0: the cut-cost check's verdict, once given
};

// Rank 0, once the cut-cost check's window is in: its verdict. Returns the measured charge where
// every rank is to re-plan with it (data.cut_cost_replan), else 0 (a warning where it missed).
double judge_cut_cost(Run& run, StepLoop& loop) {
  CutCostWatch& watch = run.cut_watch;
  const balance::CutCostCheck& check = loop.cut_check = watch.decide(run.plans->cost(run.state.position));
  double replan_t = 0;
  if (check.replan && run.cfg.data.cut_cost_replan)
    replan_t = check.measured_t;
  else if (check.measured)
    std::fprintf(stderr, "kilter: %s%s\n", check.replan ? "warning: " : "",
                 describe_cut_cost_check(check, watch.window_begin(), watch.window_end(), -1).c_str());
  loop.progress.cut_cost_check = {
      {"window", {watch.window_begin(), watch.window_end()}},
      {"measured", check.measured},
      {"measured_t", check.measured ? nlohmann::json(check.measured_t) : nlohmann::json(nullptr)},
      {"planned_t", check.planned_t},
      {"excess_share", check.excess_share},
      {"rows", check.rows},
      {"charge_held", !check.replan},
      {"replanned_from_step", nullptr}};
  return replan_t;
}

// The cut-cost check's verdict reached every rank in this step's reduction: the rest of the run
// is planned with the measured charge, from after the furthest step any rank's reader has been
// fed from.
void replan_cut_cost(Run& run, StepLoop& loop, double replan_t) {
  TrainState& state = run.state;
  // One re-plan at a time: the calibration's candidate was divided with the old charge.
  abandon_calibration(run, "the cut-cost check re-planned with its measured charge");
  run.watchdog->enter("cut-cost re-plan", long(state.step));
  long long fed = (long long)(run.total_steps - run.cursor->steps_left());
  MPI_Allreduce(MPI_IN_PLACE, &fed, 1, MPI_LONG_LONG, MPI_MAX, run.world);
  run.watchdog->leave();
  const int64_t from_step = int64_t(fed) + 1;
  if (from_step < run.total_steps) {
    balance::PlanPosition from = state.position;
    for (int64_t i = state.step; i < from_step; ++i)
      from = balance::next_position(from, run.plans->get(from.epoch).steps.size());
    run.plans->replan(from, replan_t);
    state.cut_cost_t = replan_t;
  }
  if (run.rank == 0) {
    const int64_t shown = from_step < run.total_steps ? from_step : kRunEnds;
    std::fprintf(stderr, "kilter: %s\n", describe_cut_cost_check(loop.cut_check, run.cut_watch.window_begin(),
                                                                 run.cut_watch.window_end(), shown).c_str());
    if (shown >= 0) loop.progress.cut_cost_check["replanned_from_step"] = shown;
  }
}

// A finished step counted: diagnostics, a mixture's tokens per source, the state's step and
// plan position (a finished epoch's plan is dropped: `plan` and `step` are not used after).
void count_step(Run& run, StepLoop& loop, const balance::EpochPlan& plan, const balance::StepView& step,
                const StepWork& work, double loss) {
  TrainState& state = run.state;
  run.diagnostics->set_step_work(work.tokens_computed, work.attn_work, work.micro_batches, work.kv_tokens,
                                 work.kv_bytes);
  // The cuda backend: the device memory in use at the step's end (cudaMemGetInfo: every process
  // on the device, so ranks sharing one device each see their sum), the highest so far. What
  // stays allocated between steps (the arena, the state, a sharded run's chunks) is all there;
  // the units a sharded pass backs for a while are not.
  uint64_t free_bytes = 0, total_bytes = 0;
  if (run.backend == "cuda" && model::cuda_device_memory(&free_bytes, &total_bytes)) {
    run.device_used_peak = std::max(run.device_used_peak, total_bytes - free_bytes);
    run.diagnostics->set_device_peak_bytes(run.device_used_peak);
  }
  const double step_tokens = double(step.target_tokens());
  if (run.data.mixture()) {
    if (run.rank == 0 && (state.position.step_in_epoch == 0 || state.step == loop.progress.first_step))
      for (const std::string& line : wrap_messages(run.data, run.plans->wraps(state.position.epoch)))
        std::fprintf(stderr, "kilter: mixture epoch %llu: %s\n", (unsigned long long)state.position.epoch + 1,
                     line.c_str());
    const std::vector<uint64_t> by_source = balance::tokens_by_source(step, run.data.doc_begin);
    for (size_t k = 0; k < by_source.size(); ++k) loop.progress.tokens_per_source[k] += by_source[k];
  }
  run.diagnostics->end_step(state.step, int64_t(step.target_tokens()), loss);
  loop.progress.last_loss = loss;
  loop.progress.tokens_this_run += step_tokens;
  loop.tokens_since_log += step_tokens;
  ++state.step;
  state.tokens_seen += step_tokens;
  state.position = balance::next_position(state.position, plan.steps.size());
  if (state.position.step_in_epoch == 0) run.plans->drop_before(state.position.epoch);
}

// The held-out loss (and a mixture's per source) after the step just counted. Collective.
double evaluate_now(Run& run, StepLoop& loop) {
  const int64_t step = run.state.step;
  const int64_t batches = run.cfg.train.eval_batches;
  // The step's parameter gather may still run on the reducer's thread: it ends before this
  // thread makes blocking MPI calls of its own (Open MPI's waits of two threads take each
  // other's locks; TSan reports the order), and before the parameters are read.
  run.model->finish_arriving_params();
  const double loss = evaluate(run.ctx, *run.eval_plans, run.data.index, run.data_dir, run.reader_opts, batches, step);
  loop.progress.eval_loss = loss;
  for (size_t k = 0; k < run.source_eval_plans.size(); ++k) {
    if (!run.source_eval_plans[k]) continue;
    const double loss_k =
        evaluate(run.ctx, *run.source_eval_plans[k], run.data.index, run.data_dir, run.reader_opts, batches, step);
    loop.progress.eval_loss_per_source[run.data.sources[k]] = loss_k;
    if (run.rank == 0)
      std::fprintf(stderr, "kilter: step %lld eval loss %.4f on %s\n", (long long)step, loss_k,
                   run.data.sources[k].c_str());
  }
  return loss;
}

// Rank 0: the progress line and the eval line on stdout, and train.csv's row holding both.
void log_step(Run& run, StepLoop& loop, double loss, const UpdateResult& updated, bool log_now, bool eval_now,
              double eval_loss) {
  const int64_t step = run.state.step, total = run.total_steps;
  const double t = now_seconds();
  const double rate = loop.tokens_since_log / std::max(1e-9, t - loop.t_last_log);
  const double per_step = (t - loop.progress.t_loop) / double(step - loop.progress.first_step);
  if (log_now)
    std::printf("step %6lld/%lld | loss %.4f | lr %.2e | grad norm %.3f | %8.0f tok/s | eta %s\n", (long long)step,
                (long long)total, loss, updated.lr, updated.grad_norm, rate,
                format_duration(per_step * double(total - step)).c_str());
  if (eval_now)
    std::printf("step %6lld/%lld | eval loss %.4f | perplexity %.2f\n", (long long)step, (long long)total, eval_loss,
                std::exp(eval_loss));
  std::fflush(stdout);
  diag::TrainRow row;
  row.step = step;
  row.tokens = run.state.tokens_seen;
  row.loss = loss;
  row.lr = updated.lr;
  row.grad_norm = updated.grad_norm;
  row.tokens_per_second = rate;
  row.eval_loss = eval_loss;
  row.elapsed_seconds = t - loop.progress.t_loop;
  run.train_csv->append_line(diag::train_csv_row(row));
  // TensorBoard (output.tensorboard): the same figures; an eval-only row has no training ones.
  diag::Scalars scalars;
  if (log_now)
    scalars = {{"train/loss", loss}, {"train/lr", updated.lr}, {"train/grad_norm", updated.grad_norm},
               {"train/tokens_per_second", rate}, {"train/mfu", mfu(run, rate)}};
  if (eval_now) scalars.insert(scalars.end(), {{"eval/loss", eval_loss}, {"eval/perplexity", std::exp(eval_loss)}});
  run.diagnostics->log_scalars(step, scalars);
  loop.t_last_log = t;
  loop.tokens_since_log = 0;
}

// Collective: a checkpoint every output.checkpoint_every steps, when rank 0's clock said so
// (output.checkpoint_minutes, agreed in the reduction), at the last step and on a stop signal.
void checkpoint_if_due(Run& run, StepLoop& loop, const ReducedStep& reduced) {
  const int64_t step = run.state.step;
  const bool periodic =
      (run.cfg.output.checkpoint_every > 0 && step % run.cfg.output.checkpoint_every == 0) || reduced.checkpoint_due;
  const bool final_checkpoint = reduced.stop_requested || step == run.total_steps;
  if (!periodic && !final_checkpoint) return;
  loop.t_last_checkpoint = now_seconds();
  run.model->finish_arriving_params();  // as before evaluating
  run.state.cost_calibration = run.calibration.checkpoint_text();
  // The run ends after a final one: its failure fails the run (Checkpointer::wait), while a
  // periodic one that fails is a warning and the next interval tries again.
  run.checkpointer->save(*run.model, run.state, final_checkpoint);
}

// One optimizer step at the state's position, counted, evaluated, logged and checkpointed as
// due. Returns whether a rank received a stop signal (the step is then checkpointed).
bool run_step(Run& run, StepLoop& loop) {
  TrainState& state = run.state;
  StepContext& ctx = run.ctx;
  // plan
  const balance::EpochPlan& plan = run.plans->get(state.position.epoch);
  const balance::StepView step = run.plans->step(state.position);
  maybe_fail_for_test(run.rank, state.step);
  run.diagnostics->begin_step(state.step);
  run.model->zero_grads();
  ctx.step_index = state.step;
  ctx.checkpoint_due = run.rank == 0 && run.cfg.output.checkpoint_minutes > 0 &&
                       now_seconds() - loop.t_last_checkpoint >= run.cfg.output.checkpoint_minutes * 60;
  ctx.replan_t = run.rank == 0 && run.cut_watch.ready() ? judge_cut_cost(run, loop) : 0;
  calibration_before_step(run);
  // read -> forward/backward (the reduction starts inside the last backward)
  StepWork work;
  const double local_loss_sum = compute_gradients(ctx, step, work);
  // reduce
  const ReducedStep reduced = reduce(ctx, step, local_loss_sum, state.step);
  // update
  const UpdateResult updated = update(ctx, run.cfg.train, reduced, state.step, run.total_steps);
  loop.progress.nonfinite_skipped += updated.skipped;
  count_step(run, loop, plan, step, work, reduced.loss);
  if (reduced.replan_t > 0) replan_cut_cost(run, loop, reduced.replan_t);
  calibration_after_step(run, reduced);

  const bool eval_now = run.cfg.train.eval_every > 0 && state.step % run.cfg.train.eval_every == 0;
  const double eval_loss = eval_now ? evaluate_now(run, loop) : NAN;
  const bool log_now = state.step % run.cfg.output.log_every == 0 || state.step == run.total_steps ||
                       state.step == loop.progress.first_step + 1;
  if (run.rank == 0 && (log_now || eval_now)) log_step(run, loop, reduced.loss, updated, log_now, eval_now, eval_loss);
  run.sampler->maybe_sample(*run.model, state.step);
  checkpoint_if_due(run, loop, reduced);
  if (loop.progress.early_build_steps < 0 && state.step - loop.progress.first_step >= kGraphBuildSteps) {
    loop.progress.early_builds = run.model->engine_build_stats();
    loop.progress.early_build_steps = kGraphBuildSteps;
  }
  return reduced.stop_requested;
}

// The steps from the state's position to train.steps, or to a stop signal's checkpoint.
RunProgress run_steps(Run& run) {
  StepLoop loop;
  RunProgress& progress = loop.progress;
  progress.first_step = run.state.step;
  progress.t_loop = loop.t_last_log = loop.t_last_checkpoint = now_seconds();
  progress.tokens_per_source.assign(run.data.sources.size(), 0);
  while (run.state.step < run.total_steps) {
    if (run_step(run, loop)) {
      progress.exit_code = kExitPreempted;
      break;
    }
  }
  run.model->finish_arriving_params();  // the last step's gather, where nothing has read the parameters since
  run.checkpointer->wait();
  if (run.rank == 0) {  // what the last checkpoint cost (bench/checkpoint_write.sh reads this line)
    const Checkpointer::SaveStats saved = run.checkpointer->last_save();
    if (!saved.path.empty())
      std::fprintf(stderr, "kilter: checkpoint %s: %.3f GiB of tensors; the step waited %.2f s, the writer took %.2f s\n",
                   saved.path.c_str(), double(saved.bytes) / double(1ull << 30),
                   saved.waited_seconds + saved.snapshot_seconds, saved.write_seconds);
  }
  if (progress.exit_code == kExitPreempted && run.rank == 0)
    std::fprintf(stderr, "kilter: stop signal received: checkpoint of step %lld written, exiting with code %d\n",
                 (long long)run.state.step, kExitPreempted);
  progress.elapsed = now_seconds() - progress.t_loop;
  if (progress.early_build_steps < 0) {  // fewer steps than kGraphBuildSteps
    progress.early_builds = run.model->engine_build_stats();
    progress.early_build_steps = run.state.step - progress.first_step;
  }
  return progress;
}

}  // namespace

int run_training(MPI_Comm world, const Config& cfg, const RunOptions& opts) {
  const std::unique_ptr<Run> run = make_run(world, cfg, opts);
  const RunProgress progress = run_steps(*run);
  write_run_summary(*run, progress);
  close_run(*run);
  return progress.exit_code;
}

}  // namespace kilter::train
