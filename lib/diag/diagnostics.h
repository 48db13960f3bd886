// Per-rank diagnostics (docs/design.md, "Run directory"): phase timers, the time each rank
// arrives at the gradient collective, metrics/rank-NNNNN.csv, trace/rank-NNNNN.json, live
// straggler warnings on rank 0 and summary.json. Owner: diag.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace kilter::diag {

struct StepRecord;  // lib/diag/step_record.h

// The waits nested in forward and backward: kv_wait is time blocked in the K/V exchange of cut
// pieces; gather_wait and scatter_wait (train.shard = parameters) the time blocked on a unit's
// parameter all-gather and on a unit's gradient reduce-scatter (what their prefetch and overlap
// did not hide). They are taken out of the phase they lie in (forward and backward are the rank's
// own work, the waits are waiting for other ranks or the network), so the phases still add up to
// the step. A scatter waited at the step's reduction lies in no timed phase.
enum Phase {
  kDataWait = 0, kH2D, kForward, kBackward, kKvWait, kGatherWait, kScatterWait, kCommExposed, kOptimizer, kStepTotal,
  kNumPhases
};
const char* phase_name(int phase);
// The phase called `name` (as phase_name writes it), or -1.
int phase_from_name(const std::string& name);

// `--train.inject_delay=RANK:SECONDS[:PHASE]`, a diagnostics drill: rank RANK sleeps SECONDS
// inside PHASE (default forward) once in every step. `RANK:SHARE%[:PHASE]`: a rank that runs
// SHARE% slower on all its work: at the end of each forward and backward (or of each PHASE) it
// sleeps SHARE% of the time it just spent there (a throttled device, a slower node).
struct InjectDelay {
  bool active = false;
  int rank = -1;
  double seconds = 0;
  double share = 0;          // > 0: proportional (RANK:SHARE%)
  bool every_compute = false;  // proportional without PHASE: forward and backward
  Phase phase = kForward;
};
// Parses the drill string ("" means no drill). Throws kilter::Error naming train.inject_delay
// for a malformed value, a negative or non-finite delay, or a phase that cannot be delayed
// (the waits, comm_exposed and step_total are not timed by phase_begin/phase_end). Call it before MPI work
// to refuse a bad value early; the RankDiagnostics constructor also checks RANK < world size.
InjectDelay parse_inject_delay(const std::string& text);

struct DiagOptions {
  std::string run_dir;
  int64_t trace_steps = 50;
  double stall_factor = 2.0;
  int warn_window = 20;       // live warning: a rank last in most of this many steps
  std::string inject_delay;   // [train] inject_delay, parsed with parse_inject_delay
  bool resume = false;        // `train --resume`: append to the existing metrics CSVs
  // TensorBoard event files under RUN_DIR/tensorboard/ (output.tensorboard): rank 0's step
  // scalars there, each rank's phase seconds in tensorboard/rank-NNNNN/, every log_every steps.
  bool tensorboard = false;
  int64_t log_every = 10;
};

// One per rank. Collective calls are marked; every rank makes them in the same order.
class RankDiagnostics {
 public:
  // Collective over `world`: estimates this rank's clock offset to rank 0 so arrival times
  // compare across nodes; creates metrics/ and trace/ files.
  RankDiagnostics(MPI_Comm world, const DiagOptions& opts);
  ~RankDiagnostics();

  void begin_step(int64_t step);
  void phase_begin(Phase p);
  void phase_end(Phase p);    // accumulates; a phase may be entered several times per step
  void add_phase_seconds(Phase p, double seconds);  // for time measured elsewhere (e.g. comm_exposed)
  void mark_arrival();        // just before this rank enters the gradient collective
  // One wait of the K/V exchange (steady clock, steady_now_ns()), inside forward or backward:
  // added to kv_wait and taken out of the phase it lies in; a trace span "kv_wait" whose args
  // name the layer, the direction, the rank waited for and the piece.
  struct KvWait {
    int64_t begin_ns = 0;
    int64_t end_ns = 0;
    int layer = 0;
    bool backward = false;
    int peer = -1;      // the rank whose message arrived last
    std::string piece;  // the piece that message carried, in document tokens
  };
  void kv_wait(const KvWait& wait);
  // One wait on a sharded unit's collective (gather_wait or scatter_wait; steady clock), taken out
  // of the phase it lies in like kv_wait; a trace span whose args name the unit. Ignored between
  // steps (an evaluation's gathers).
  void unit_wait(Phase wait, int64_t begin_ns, int64_t end_ns, int unit);
  // The work this rank did in the current step, for cost-model calibration: padded tokens
  // computed (padding included), sum(len^2) over its attention segments, and its micro-batches.
  // kv_tokens: earlier tokens of cut pieces whose K/V the rank received in the step; kv_bytes:
  // the bytes of K/V and dK/dV it sent and received.
  void set_step_work(int64_t tokens_computed, double attn_work, int32_t micro_batches, int64_t kv_tokens = 0,
                     int64_t kv_bytes = 0);
  // Optional: peak device memory of this rank so far (bytes; GPU backends), kept per step.
  void set_device_peak_bytes(uint64_t bytes);
  // Collective: writes this rank's CSV row and trace events, gathers every rank's record of the
  // step (small allgather) and, on rank 0, watches for a persistent straggler. `loss` is the
  // global step loss (already reduced).
  void end_step(int64_t step, int64_t tokens, double loss);
  // Rank 0: called with every rank's record of a step (indexed by rank) once it has been gathered,
  // which is during the next end_step() or finish(). Other ranks never call it.
  void on_step_records(std::function<void(const StepRecord* records, int ranks)> fn);
  // Rank 0 with output.tensorboard: the run's scalars at `step` (steps completed) in
  // RUN_DIR/tensorboard/, e.g. {"train/loss", 3.2}; elsewhere nothing. Non-finite values are left out.
  void log_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);
  // Collective: rank 0 writes RUN_DIR/summary.json from every rank's records plus `extra`
  // (plan statistics, tokens_per_second, ...) and returns it; other ranks return {}.
  nlohmann::json finish(const nlohmann::json& extra);
  // Peak resident memory of this process (bytes).
  static uint64_t peak_rss_bytes();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kilter::diag
