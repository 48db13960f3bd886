// The in-run calibration in the step loop (see calibration_driver.h).
#include "lib/train/calibration_driver.h"

#include <cstdio>

#include <fmt/format.h>

#include "io/base/error.h"

namespace kilter::train {

namespace {

// The position `steps` steps after `pos`.
balance::PlanPosition position_after(Run& run, balance::PlanPosition pos, int64_t steps) {
  for (int64_t i = 0; i < steps; ++i) pos = balance::next_position(pos, run.plans->get(pos.epoch).steps.size());
  return pos;
}

// Rank 0, a window gathered: its evaluation on a thread of its own, so that no step waits for it:
// the fit (WindowJob::evaluate), where it is usable and differs the division it makes, and that
// division compared with the plan in force on the next kCalibrationCompareSteps steps of the epoch
// under the fit (the plans that hold those steps are shared with the thread, so the cache may move
// on meanwhile).
void start_evaluation(Run& run) {
  const balance::PlanPosition pos = run.state.position;
  const uint64_t steps = run.plans->get(pos.epoch).steps.size();
  std::vector<std::shared_ptr<const balance::EpochPlan>> holders;
  std::vector<uint64_t> indices;
  for (uint64_t s = pos.step_in_epoch; s < steps && indices.size() < kCalibrationCompareSteps; ++s) {
    holders.push_back(run.plans->shared_plan_at({pos.epoch, s}));
    indices.push_back(s);
  }
  std::shared_ptr<WindowJob> job = run.calibration.start_window(run.plans->cost(pos), run.plans->rank_speed(pos));
  run.plans->start_job(
      pos.epoch,
      [job](PlanModel& model) {
        job->evaluate();
        if (job->candidate) model = job->model;
        return job->candidate;
      },
      [job, holders, indices](const balance::EpochPlan& built) {
        std::vector<balance::StepView> current, next;
        for (size_t i = 0; i < indices.size(); ++i) {
          current.push_back(holders[i]->steps[indices[i]]);
          next.push_back(built.steps[indices[i]]);
        }
        job->comparison = balance::compare_divisions(current, next, job->fit);
        job->compared = true;
      });
}

// Rank 0, stage evaluating, the job done: it pays, stage announced (the flag rides in this step's
// reduction); else the candidate goes.
void judge_candidate(Run& run) {
  const int64_t step = run.state.step;
  run.plans->built_plan();  // rethrows the job's error
  if (!run.calibration.finish_window(step)) run.plans->drop_build();
}

// Every rank, on rank 0's verdict: the model (and the epoch it was built for) from rank 0 in one
// broadcast; the other ranks build the same plan in the background. Epoch -1: rank 0 gave its
// candidate up in this step (the cut-cost check re-planned), and nothing follows.
void receive_candidate(Run& run) {
  const size_t fixed = 8;
  std::vector<double> packed(fixed + size_t(run.world_size), 1.0);
  packed[0] = -1;
  if (run.rank == 0 && run.plans->build_pending()) {
    const PlanModel& m = run.plans->build_model();
    packed[0] = double(run.plans->build_epoch());
    packed[1] = m.cost.a, packed[2] = m.cost.b, packed[3] = m.cost.c, packed[4] = m.cost.t;
    packed[5] = m.cost.t_link, packed[6] = double(m.cost.layers), packed[7] = m.rank_speed.empty() ? 0 : 1;
    for (size_t r = 0; r < m.rank_speed.size(); ++r) packed[fixed + r] = m.rank_speed[r];
  }
  run.watchdog->enter("cost calibration broadcast", long(run.state.step));
  MPI_Bcast(packed.data(), int(packed.size()), MPI_DOUBLE, 0, run.world);
  run.watchdog->leave();
  if (packed[0] < 0) return;
  if (run.rank != 0) {
    PlanModel m;
    m.cost.a = packed[1], m.cost.b = packed[2], m.cost.c = packed[3], m.cost.t = packed[4];
    m.cost.t_link = packed[5], m.cost.layers = int(packed[6]);
    if (packed[7] > 0) m.rank_speed.assign(packed.begin() + long(fixed), packed.end());
    run.plans->start_build(uint64_t(packed[0]), std::move(m));
  }
  run.calibration.set_stage(CostCalibration::Stage::building);
}

// Every rank, every rank's build ready: the first step no reader has been fed from (one MAX
// allreduce), and the switch there.
void switch_plan(Run& run) {
  TrainState& state = run.state;
  run.watchdog->enter("cost calibration re-plan", long(state.step));
  long long fed = (long long)(run.total_steps - run.cursor->steps_left());
  MPI_Allreduce(MPI_IN_PLACE, &fed, 1, MPI_LONG_LONG, MPI_MAX, run.world);
  run.watchdog->leave();
  const int64_t from_step = int64_t(fed) + 1;
  if (from_step >= run.total_steps) {
    run.plans->drop_build();
    run.calibration.abandon("the run ends before a new plan could start");
    return;
  }
  const balance::PlanPosition from = position_after(run, state.position, from_step - state.step);
  const PlanModel model = run.plans->build_model();
  if (!run.plans->switch_to(from)) {
    // The readers crossed into a later epoch meanwhile: that epoch is built, then switched to.
    run.plans->drop_build();
    run.plans->start_build(from.epoch, model);
    return;
  }
  run.calibration.switched(from_step, model, run.world_size);
  if (run.rank == 0) std::fprintf(stderr, "kilter: %s\n", run.calibration.switch_line().c_str());
}

// "cost_b 1.03e-3, cost_c 190, rank 1 x1.15": a model in words.
std::string describe_model(const PlanModel& m) {
  std::string text = fmt::format("cost_b {:.3g}, cost_c {:.3g}, cost_t {:.3g}", m.cost.b, m.cost.c, m.cost.t);
  for (size_t r = 0; r < m.rank_speed.size(); ++r)
    if (m.rank_speed[r] != 1.0) text += fmt::format(", rank {} x{:.3f}", r, m.rank_speed[r]);
  return text;
}

}  // namespace

void start_calibration(Run& run) {
  const Config& cfg = run.cfg;
  const balance::CostModel derived = balance::resolve_cost_model(run.plan_opts.cost, run.plan_opts.context,
                                                                 run.plan_opts.tokens_per_step, run.world_size);
  const CalibrationSettings settings =
      calibration_settings(cfg.data.cost_calibration, cfg.data.cost_b, cfg.data.cost_c, cfg.data.cost_t,
                           cfg.data.sampler, run.world_size, derived, run.plan_opts.cut_pieces);
  std::vector<CalibratedModel> restored = run.calibration.models();
  run.calibration = CostCalibration(settings, run.state.step);
  run.calibration.restore(std::move(restored));
  if (run.rank == 0 && (run.cut_watch.active() || run.calibration.active()))
    run.diagnostics->on_step_records([&run](const diag::StepRecord* records, int ranks) {
      run.cut_watch.add_step(records, ranks);
      run.calibration.add_step(records, ranks);
    });
}

void restore_calibration(Run& run) {
  std::vector<CalibratedModel> models = CostCalibration::parse_checkpoint_text(run.state.cost_calibration);
  if (models.empty()) return;
  const Config& cfg = run.cfg;
  if (cfg.data.cost_calibration != "auto") {
    if (run.rank == 0)
      std::fprintf(stderr, "kilter: plan: data.cost_calibration = %s: the steps are divided by the configured cost "
                   "model, not the one this run fitted before the checkpoint\n", cfg.data.cost_calibration.c_str());
    return;
  }
  for (CalibratedModel& m : models) {
    if (m.world_size != run.world_size) m.model.rank_speed.clear();  // speeds belong to the ranks that had them
    if (run.state.cut_cost_t >= 0 && cfg.data.cost_t < 0) m.model.cost.t = run.state.cut_cost_t, m.model.cost.layers = 0;
  }
  const TrainState& state = run.state;
  // The model in force at the resume step, then those that took effect later in its epoch.
  const CalibratedModel* in_force = nullptr;
  for (const CalibratedModel& m : models)
    if (m.from_step <= state.step) in_force = &m;
  if (in_force) run.plans->replan(state.position, in_force->model);
  for (const CalibratedModel& m : models) {
    if (m.from_step <= state.step) continue;
    run.plans->get(state.position.epoch);
    const balance::PlanPosition pos = position_after(run, state.position, m.from_step - state.step);
    if (pos.epoch == state.position.epoch) run.plans->replan(pos, m.model);
  }
  if (run.rank == 0) {
    const CalibratedModel& last = models.back();
    std::fprintf(stderr, "kilter: plan: divided by the cost model this run fitted (%s, from step %lld), as before the "
                 "checkpoint (data.cost_calibration = off divides by the configured one)\n",
                 describe_model(last.model).c_str(), (long long)last.from_step);
  }
  run.calibration.restore(std::move(models));
}

void calibration_before_step(Run& run) {
  CostCalibration& calibration = run.calibration;
  StepContext& ctx = run.ctx;
  ctx.calibration_verdict = false;
  ctx.replan_building = false;
  if (!calibration.active()) return;
  using Stage = CostCalibration::Stage;
  if (calibration.stage() == Stage::building) ctx.replan_building = !run.plans->build_ready();
  if (run.rank != 0) return;
  if (calibration.window_complete()) start_evaluation(run);
  if (calibration.stage() == Stage::evaluating && run.plans->build_ready()) judge_candidate(run);
  ctx.calibration_verdict = calibration.stage() == Stage::announced;
}

void calibration_after_step(Run& run, const ReducedStep& reduced) {
  CostCalibration& calibration = run.calibration;
  if (!calibration.active()) return;
  if (reduced.calibration_verdict)
    receive_candidate(run);
  else if (calibration.stage() == CostCalibration::Stage::building && reduced.replans_building == 0)
    switch_plan(run);
}

void abandon_calibration(Run& run, const std::string& why) {
  if (!run.calibration.active() || run.calibration.stage() == CostCalibration::Stage::idle) return;
  run.plans->drop_build();
  run.calibration.abandon(why);
}

}  // namespace kilter::train
