// The set-up of a training run (`kilter train`, trainer.h): everything the step loop uses, made
// in one order by make_run(). What is made first lives longest: Run's members are declared in
// the order they are made, so they are destroyed in reverse (the reader before the index it
// reads, the reducer before the model's buffers it reduces, ...).
#pragma once
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "io/reader.h"
#include "lib/balance/plan.h"
#include "lib/comm/communicator.h"
#include "lib/core/config.h"
#include "lib/diag/diagnostics.h"
#include "lib/diag/metrics_csv.h"
#include "lib/model/model.h"
#include "lib/train/checkpointer.h"
#include "lib/train/calibration_in_run.h"
#include "lib/train/calibration_cut_cost.h"
#include "lib/train/plan_cursor.h"
#include "lib/train/run_engine_probes.h"
#include "lib/train/sample_feed.h"
#include "lib/train/sampling.h"
#include "lib/train/train_step.h"
#include "lib/train/trainer.h"
#include "lib/train/training_data.h"
#include "lib/train/watchdog.h"

namespace kilter::train {

// A rank that unwinds an error while its reducer is mid-collective (a step's reduction, or the
// parameters' gather on the communication thread): the reducer lets its thread go, since the
// job is about to be aborted, and that collective still reads and writes the model's buffers.
// The model is then let go too, not freed under it. Declared after both, so it acts first.
struct ModelOutlivesCollective {
  std::unique_ptr<model::Model>& model;
  const std::unique_ptr<comm::GradientReducer>& reducer;
  ~ModelOutlivesCollective();
};

// One training run on this rank, as make_run() leaves it for the step loop.
struct Run {
  Run() = default;
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  // Where it runs.
  MPI_Comm world = MPI_COMM_NULL;
  int rank = 0;
  int world_size = 1;
  Config cfg;        // as resolved: output.dir is the run directory, model.vocab_size the data's
  RunOptions opts;
  double t_start = 0;  // now_seconds() when the run began
  comm::Topology topo;
  std::string run_dir;
  bool resuming = false;
  std::string resume_path;  // the checkpoint a resume loads

  // What it trains on.
  TrainingData data;
  std::string data_dir;  // data.dir, or its node-local copy (data.stage_dir)
  balance::Split split;
  balance::PlanOptions plan_opts;
  std::unique_ptr<PlanCache> plans;

  // The model and the gradient reduction.
  std::string backend;    // cpu | cuda (train.backend = auto resolved)
  std::string comm_kind;  // mpi | nccl
  std::string algo;       // flat | hierarchical, as in force
  bool shard_optimizer = false;
  // train.grad_dtype resolved to bf16: the gradients accumulate over micro-batches in bf16.
  bool bf16_grads = false;
  // train.shard_group smaller than the world: sharded inside each group, replicated across groups
  // (HSDP).
  bool shard_within_node = false;
  int shard_group = 1;  // ranks sharing one sharded copy (the world, or train.shard_group under HSDP)
  bool shard_norm_counts = true;  // HSDP: this rank is in the first group (its shard counts in the norm)
  uint64_t device_used_peak = 0;  // the cuda backend: the most of its device seen in use at a step's end
  // train.shard = parameters on more than one rank: the shards (run.reducer owns them), else null.
  UnitShards* param_shards = nullptr;
  std::vector<EngineChoice> engine_choices;  // the engine probes' verdicts and what they chose
  std::unique_ptr<model::Model> model;
  std::unique_ptr<comm::GradientReducer> reducer;
  ModelOutlivesCollective model_outlives_collective{model, reducer};
  TrainState state;

  // What runs beside the steps.
  std::unique_ptr<diag::RankDiagnostics> diagnostics;
  std::unique_ptr<Checkpointer> checkpointer;
  std::unique_ptr<TrainingSampler> sampler;
  std::unique_ptr<SampleFeed> sample_feed;  // train.shard = parameters, rank 0's shard group, samples on
  std::unique_ptr<Watchdog> watchdog;
  std::unique_ptr<diag::CsvAppender> train_csv;  // rank 0: metrics/train.csv
  io::ReaderOptions reader_opts;
  std::unique_ptr<io::PrefetchReader> reader;
  int64_t total_steps = 0;  // train.steps: the run's last step, a resume's included
  std::unique_ptr<PrefetchCursor> cursor;
  std::unique_ptr<PlanCache> eval_plans;                      // null: no evaluation
  std::vector<std::unique_ptr<PlanCache>> source_eval_plans;  // a mixture's, per source (null: none held out)
  // The statistics of the epoch the run starts in (a copy: the plan goes once its epoch is done).
  balance::PlanStats start_stats;
  CutCostWatch cut_watch{0, 0};  // data.cut_cost_check; rank 0 collects its window
  CostCalibration calibration;   // data.cost_calibration (calibration_driver.h)
  // The K/V exchange of cut pieces gets its own communicator: its messages never meet the
  // trainer's or the reducer's. close_run() frees it; an error ends the job instead.
  MPI_Comm kv_comm = MPI_COMM_NULL;
  StepContext ctx;
};

// The steady clock, in seconds (Run::t_start and the step loop's times).
double now_seconds();

// Collective over `world`: the topology and the checks every rank must agree on, the run
// directory (--force, --resume), the data and its plans, the model (refused before it is
// allocated where the memory plan says the run cannot fit), the reducer, a resume's checkpoint,
// diagnostics, checkpoints, the reader and the evaluation plans; rank 0 logs the run and its
// plan. Throws kilter::Error on failure.
std::unique_ptr<Run> make_run(MPI_Comm world, const Config& cfg, const RunOptions& opts);

// Collective, once the run ends without an error: frees the communicators make_run() made (the
// K/V exchange's and the topology's).
void close_run(Run& run);

}  // namespace kilter::train
