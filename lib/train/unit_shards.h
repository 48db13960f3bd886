// What the step loop sees of fully sharded parameters (train.shard = parameters), whichever memory
// holds them: the run's GradientReducer and the model's ParamUnitHooks at once, with the watchdog
// that bounds its collectives, the step it names, and the release of everything outside this
// rank's chunks. Two implementations: host memory over MPI (param_shards.h) and device memory over
// NCCL (param_shards_nccl.h).
#pragma once
#include "lib/comm/communicator.h"
#include "lib/diag/diagnostics.h"
#include "lib/model/model.h"

namespace kilter::train {

class Watchdog;

class UnitShards : public comm::GradientReducer, public model::ParamUnitHooks {
 public:
  // The watchdog that bounds every collective (set once it exists), and the step it names.
  void set_watchdog(Watchdog* watchdog) { watchdog_ = watchdog; }
  void set_step(long step) { step_ = step; }
  Watchdog* watchdog() const { return watchdog_; }
  long step() const { return step_; }
  // Where the waits go (gather_wait, scatter_wait; null: nowhere).
  void set_diagnostics(diag::RankDiagnostics* diagnostics) { diagnostics_ = diagnostics; }
  // Waits for a reduce-scatter still in flight, before the step's reduction.
  virtual void wait_reduce_scatter() {}
  // Frees every gathered parameter and every gradient outside this rank's chunks: after a
  // whole-buffer write (initialization, a resume) and at each step's start.
  virtual void release_all() = 0;

  // comm::GradientReducer: the reduction happens unit by unit, as each unit's backward ends, so
  // the bucket calls do nothing; the parameters stay sharded after the step (the next forward
  // gathers them), so gather does nothing either.
  void begin() override {}
  void ready(size_t, size_t) override {}
  void gather(float*) override {}

 protected:
  Watchdog* watchdog_ = nullptr;
  diag::RankDiagnostics* diagnostics_ = nullptr;
  long step_ = 0;
};

}  // namespace kilter::train
