// Per-rank diagnostics (DESIGN.md, "Run directory"; issue 6): phase timers, the time each rank
// arrives at the gradient collective, metrics/rank-NNNNN.csv, trace/rank-NNNNN.json, live
// straggler warnings on rank 0 and summary.json. Owner: diag (issue 6).
#pragma once
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace kilter::diag {

enum Phase { kDataWait = 0, kH2D, kForward, kBackward, kCommExposed, kOptimizer, kStepTotal, kNumPhases };
const char* phase_name(int phase);

struct DiagOptions {
  std::string run_dir;
  int64_t trace_steps = 50;
  double stall_factor = 2.0;
  int warn_window = 20;       // live warning: a rank last in most of this many steps
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
  // Collective: writes this rank's CSV row and trace events, gathers every rank's record of the
  // step (small allgather) and, on rank 0, watches for a persistent straggler. `loss` is the
  // global step loss (already reduced).
  void end_step(int64_t step, int64_t tokens, double loss);
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
