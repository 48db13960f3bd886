// One training step's stages after the plan has named this rank's micro-batches:
// read -> forward/backward (gradient reduction started inside the last backward) -> reduce ->
// update. run_training (trainer.cpp) calls them in that order every step.
#pragma once
#include <mpi.h>

#include <functional>
#include <memory>
#include <vector>

#include "io/reader.h"
#include "lib/balance/plan.h"
#include "lib/comm/communicator.h"
#include "lib/comm/kv_schedule.h"
#include "lib/core/config.h"
#include "lib/diag/diagnostics.h"
#include "lib/model/model.h"
#include "lib/train/micro_batch.h"
#include "lib/train/unit_shards.h"
#include "lib/train/watchdog.h"

namespace kilter::train {

// What the stages use; owned by run_training.
struct StepContext {
  int rank = 0;
  MPI_Comm world = MPI_COMM_NULL;
  model::Model* model = nullptr;
  io::PrefetchReader* reader = nullptr;
  std::function<void()> fill_prefetch;  // keeps the reader's queue full
  comm::GradientReducer* reducer = nullptr;
  diag::RankDiagnostics* diagnostics = nullptr;
  Watchdog* watchdog = nullptr;
  // The K/V exchange of cut pieces: makes one micro-batch's exchange (the trainer
  // picks MPI or NCCL, on a communicator of the exchange's own); empty: a step with a cut piece
  // is refused.
  std::function<std::unique_ptr<comm::CutExchange>(comm::KvSchedule, const comm::KvExchangeOptions&)>
      make_kv_exchange;
  double kv_timeout_s = 300;  // comm.timeout_s
  model::Batch batch;  // reused by every micro-batch
  int64_t step_index = 0;       // the optimizer steps completed (set by the trainer every step)
  bool local_nonfinite = false;  // this step: this rank's own loss or gradient was not finite
  bool checkpoint_due = false;   // rank 0: output.checkpoint_minutes passed (travels with the stop flag)
  double replan_t = 0;           // rank 0: the cut-cost check's measured charge, > 0 to re-plan (travels too)
  bool calibration_verdict = false;  // rank 0: the in-run calibration has a model to re-plan with (travels too)
  bool replan_building = false;      // this rank's background re-plan is not built yet (summed)
  // train.shard_optimizer in force: the reducer leaves each rank 1/P of the gradient, update()
  // sums the norm over ranks and all-gathers the parameters.
  bool shard_optimizer = false;
  // train.grad_dtype = bf16 (auto under bf16 storage): the gradient accumulation buffer holds
  // bf16 values. Each range is rounded as the backward finishes it, micro-batch after
  // micro-batch, so every micro-batch adds its fp32 gradient to the bf16 sum of the earlier ones
  // and rounds once; the reduction then sums those bf16 values in fp32. The cpu backend keeps
  // them in its fp32 buffer (the oracle rounds where a device would store bf16).
  bool bf16_grads = false;
  // Whether this rank's shard counts in the gradient norm's sum over ranks: sharded inside the
  // node and replicated across nodes (HSDP), only the first node's ranks add theirs.
  bool shard_norm_counts = true;
  // train.shard = parameters: the shards (also `reducer`); every rank runs the step's largest
  // micro-batch count, padding with empty micro-batches, since each unit's gather and
  // reduce-scatter is a meeting point of all ranks.
  UnitShards* param_shards = nullptr;
};

// Reads this rank's micro-batches of `step` and runs forward/backward on each, accumulating
// gradients of (loss sum / step.target_tokens). The gradient reduction starts inside the last
// micro-batch's backward; an idle rank (no micro-batch) starts it at once with zero gradients,
// so every rank joins every collective. A micro-batch holding a part of a cut piece gets a K/V
// exchange (lib/comm/kv_exchange_mpi.h) for its forward/backward; its waits are the kv_wait
// phase. Returns this rank's loss sum; `work` gets its work.
double compute_gradients(StepContext& ctx, const balance::StepView& step, StepWork& work);

// train.shard = parameters: the empty micro-batches this rank runs after its own in `step`, so
// that every rank runs the step's largest count (every unit's gather and reduce-scatter joins all
// ranks); 0 otherwise. One is padding_micro_batch(): one token without a target (the same
// collectives, no loss, zero gradients).
int padding_micro_batches(const StepContext& ctx, const balance::StepView& step);
model::Batch padding_micro_batch();

struct ReducedStep {
  double loss = 0;              // mean over the global step's target tokens
  bool stop_requested = false;  // a rank received a stop signal
  bool checkpoint_due = false;  // rank 0's clock says a timed checkpoint is due (every rank agrees)
  double replan_t = 0;          // > 0: rank 0's cut-cost check asks every rank to re-plan with this t
  bool calibration_verdict = false;  // rank 0's calibration asks every rank to re-plan (calibration_driver.h)
  int replans_building = 0;     // ranks whose background re-plan is not built yet
  std::vector<int> nonfinite_ranks;  // ranks whose own loss or gradient was not finite
};
// Waits for the gradient reduction and sums the loss, the stop flag and the non-finite flag over
// all ranks; when a rank flagged a non-finite loss or gradient, every rank learns which (one
// allgather, only then), so every rank takes the same decision on the step.
ReducedStep reduce(StepContext& ctx, const balance::StepView& step, double local_loss_sum, int64_t step_index);

struct UpdateResult {
  double grad_norm = 0;
  double lr = 0;
  bool skipped = false;  // non-finite loss or gradient with train.on_nonfinite = skip
};
// Clips and applies AdamW for optimizer step `step_index` (0-based) of `total_steps`. A step is
// non-finite when a rank flagged its own loss or gradient, or the reduced loss or gradient norm
// is not finite: inputs every rank shares, so all ranks skip it together (train.on_nonfinite =
// skip) or all throw the same error naming the ranks (stop).
UpdateResult update(StepContext& ctx, const TrainConfig& train, const ReducedStep& reduced, int64_t step_index,
                    int64_t total_steps);

}  // namespace kilter::train
