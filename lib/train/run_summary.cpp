// summary.json of a training run (see run_summary.h; the keys are listed in docs/diagnostics.md
// and docs/plan.md).
#include "lib/train/run_summary.h"

#include <cstdio>
#include <filesystem>

#include "lib/balance/plan_config.h"
#include "lib/balance/plan_report.h"
#include "lib/model/spec.h"
#include "lib/train/signals.h"

namespace kilter::train {

namespace {

// The plan of the epoch the run started in, under `kilter plan --json`'s names, and the cost
// model its last steps were divided with.
void add_plan_figures(const Run& run, nlohmann::json& extra) {
  const balance::PlanStats& st = run.start_stats;
  extra.update(balance::plan_stats_json(st));
  // The names these figures had in summary.json before they took `kilter plan`'s: kept for one
  // release (docs/diagnostics.md), then dropped.
  extra["plan_kv_bytes_per_step_p50"] = st.kv_bytes_per_step_p50;
  extra["plan_kv_bytes_per_step_max"] = st.kv_bytes_per_step_max;
  extra["plan_kv_bytes_per_rank_max"] = st.kv_bytes_per_rank_max;
  // t, the charge per earlier token it cut with, which `kilter report` compares with what the
  // run's kv_wait measured in the units a, b and c define.
  const balance::CostModel& plan_cost = run.plans->cost(run.state.position);
  extra["plan_cost_a"] = plan_cost.a;
  extra["plan_cost_b"] = plan_cost.b;
  extra["plan_cost_c"] = plan_cost.c;
  extra["plan_cost_t"] = plan_cost.t;
}

// How the run ran: its back end, communication, model, and time.
void add_run_figures(const Run& run, const RunProgress& progress, nlohmann::json& extra) {
  extra["sampler"] = run.cfg.data.sampler;
  extra["backend"] = run.backend;
  extra["backend_detail"] = run.model->describe();
  // The engine probes (run_engine_probes.h): this node's verdict and the run's choice.
  nlohmann::json probes = nlohmann::json::array();
  for (const EngineChoice& c : run.engine_choices)
    probes.push_back({{"engine", c.verdict.engine}, {"family", c.verdict.family}, {"device", c.verdict.identity.device},
                      {"driver", c.verdict.identity.driver}, {"cudnn", c.verdict.identity.cudnn},
                      {"passed", c.verdict.passed}, {"passed_everywhere", c.passed_everywhere},
                      {"error", c.verdict.error}, {"origin", c.verdict.origin}, {"file", c.verdict.file},
                      {"choice", c.choice}});
  extra["engine_probes"] = probes;
  // Rank 0's attention graph builds (cuDNN SDPA, per shape bucket) in its first steps.
  extra["graph_builds_early"] = {{"steps", progress.early_build_steps}, {"graphs", progress.early_builds.graphs},
                                 {"seconds", progress.early_builds.seconds}};
  extra["comm_algo"] = run.algo;
  extra["shard_optimizer"] = run.shard_optimizer;
  // The sharding in force: none | optimizer, and the ranks sharing one copy (the world, or the
  // node's under HSDP).
  extra["shard"] = run.shard_optimizer ? run.cfg.train.shard : std::string("none");
  extra["shard_group_ranks"] = run.shard_group;
  extra["num_nodes"] = run.topo.num_nodes;
  extra["ranks_per_node"] = run.topo.local_size;
  extra["num_params"] = run.model->layout().num_params;
  extra["nonfinite_steps_skipped"] = progress.nonfinite_skipped;
  extra["elapsed_seconds"] = progress.elapsed;
  extra["startup_seconds"] = progress.t_loop - run.t_start;
  extra["preempted"] = progress.exit_code == kExitPreempted;
  extra["resumed_from_step"] = progress.first_step;
  if (run.data.mixture()) {  // this run's steps (not those before a resume)
    for (size_t k = 0; k < run.data.sources.size(); ++k) {
      extra["tokens_per_source"][run.data.sources[k]] = progress.tokens_per_source[k];
      extra["source_weights"][run.data.sources[k]] = run.data.weights[k];
    }
    extra["eval_loss_per_source"] = progress.eval_loss_per_source;
  }
}

// Model FLOPs (model_flops_per_token): per target token of the epoch's plan, forward and backward of
// the dense layers and the head, and the attention of the plan's pieces (padding a naive plan
// computes counts as work, not as model FLOPs), the rate per rank they make at the run's tokens/s,
// and MFU against comm.device_tflops (or the backend's figure the plan uses, which for a GPU is an
// H100's dense bf16 rate): the model's arithmetic, whatever the architecture.
void add_model_flops(const Run& run, double tokens_per_second, nlohmann::json& extra) {
  if (run.start_stats.target_tokens == 0) return;
  const double flops_per_token = model_flops_per_token(run);
  const double tflops_per_rank = tokens_per_second * flops_per_token / double(run.world_size) / 1e12;
  const double peak = balance::device_tflops(run.cfg);
  extra["model_flops_per_token"] = flops_per_token;
  extra["model_tflops_per_rank"] = tflops_per_rank;
  extra["mfu_peak_tflops"] = peak;
  extra["mfu"] = mfu(run, tokens_per_second);
}

}  // namespace

double model_flops_per_token(const Run& run) {
  const balance::PlanStats& st = run.start_stats;
  if (st.target_tokens == 0) return 0;
  const model::ModelSpec& spec = run.model->config();
  return model::dense_flops_per_token(spec) +
         model::attention_flops_per_square(spec) * st.attention_work / double(st.target_tokens);
}

double mfu(const Run& run, double tokens_per_second) {
  const double peak = balance::device_tflops(run.cfg);
  const double tflops_per_rank = tokens_per_second * model_flops_per_token(run) / double(run.world_size) / 1e12;
  return peak > 0 ? tflops_per_rank / peak : 0.0;
}

void write_run_summary(Run& run, const RunProgress& progress) {
  const double tokens_per_second = progress.elapsed > 0 ? progress.tokens_this_run / progress.elapsed : 0.0;
  nlohmann::json extra;
  extra["world_size"] = run.world_size;
  extra["steps"] = run.state.step;
  extra["steps_this_run"] = run.state.step - progress.first_step;
  extra["tokens_per_second"] = tokens_per_second;
  extra["final_loss"] = progress.last_loss;
  extra["eval_loss"] = std::isfinite(progress.eval_loss) ? nlohmann::json(progress.eval_loss) : nlohmann::json(nullptr);
  add_plan_figures(run, extra);
  add_model_flops(run, tokens_per_second, extra);
  // The cut-cost check (data.cut_cost_check): its window, what it measured, and where the plan
  // changed (null: it did not); absent where the check did not run in this process.
  if (!progress.cut_cost_check.is_null()) extra["cut_cost_check"] = progress.cut_cost_check;
  // The in-run calibration (data.cost_calibration = auto): every window's fit and verdict, the
  // models in force with their steps, and the rank speeds of the last (rank 0 decided them).
  if (run.rank == 0 && run.calibration.active()) extra["cost_calibration"] = run.calibration.summary();
  const std::vector<double>& speeds = run.plans->rank_speed(run.state.position);
  nlohmann::json speed_map = nlohmann::json::object();
  for (size_t r = 0; r < speeds.size(); ++r)
    if (speeds[r] != 1.0) speed_map[std::to_string(r)] = speeds[r];
  extra["plan_rank_speed"] = speed_map;
  add_run_figures(run, progress, extra);
  const nlohmann::json summary = run.diagnostics->finish(extra);
  if (run.rank == 0) {
    std::fprintf(stderr, "kilter: done: %lld steps, final loss %.4f, %.0f tokens/s, summary in %s\n",
                 (long long)run.state.step, progress.last_loss, tokens_per_second,
                 (std::filesystem::path(run.run_dir) / "summary.json").string().c_str());
    if (run.opts.json) std::printf("%s\n", summary.dump(2).c_str());
  }
}

}  // namespace kilter::train
