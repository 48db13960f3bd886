// One rank's measurements of one training step: the fixed-size record every rank contributes to
// the per-step gather, the row of metrics/rank-NNNNN.csv, and the unit the run statistics are
// computed from. Times are seconds; `start` and `arrival` are on the rank-0-aligned clock,
// counted from the run start.
#pragma once
#include <cstdint>
#include <string>
#include <type_traits>

#include "lib/diag/diagnostics.h"

namespace kilter::diag {

struct StepRecord {
  int64_t step = 0;
  int64_t tokens = 0;            // target tokens of the global step
  int64_t tokens_computed = 0;   // tokens this rank computed (N summed; padding included for naive)
  double attn_work = 0;          // this rank's sum of len^2 over its attention segments
  double loss = 0;               // global step loss
  double phase[kNumPhases] = {}; // seconds; phase[kStepTotal]: begin_step -> end_step
  double outside = 0;            // seconds between the previous end_step and this begin_step
  double start = 0;              // aligned clock at begin_step
  double arrival = 0;            // aligned clock at mark_arrival
  uint64_t rss_bytes = 0;        // resident memory at end_step
  uint64_t peak_rss_bytes = 0;   // peak resident memory so far
  uint64_t device_peak_bytes = 0;
  int32_t rank = 0;
  int32_t micro_batches = 0;     // this rank's micro-batches in the step
  int64_t kv_tokens = 0;         // earlier tokens of cut pieces whose K/V this rank received
  int64_t kv_bytes = 0;          // bytes of K/V and dK/dV this rank sent and received
  int32_t kv_wait_peer = -1;     // the rank this one waited for longest in kv_wait (-1: none)
  int32_t reserved = 0;
};
static_assert(std::is_trivially_copyable<StepRecord>::value, "StepRecord travels as MPI_BYTE");

// Compute time: what the rank spent on its own work, i.e. the step minus the exposed wait in the
// gradient collective, the waits for other ranks' K/V and the waits on sharded parameters'
// gathers and reduce-scatters (which only reflect the other ranks and the network).
inline double compute_seconds(const StepRecord& r) {
  double c = r.phase[kStepTotal] - r.phase[kCommExposed] - r.phase[kKvWait] - r.phase[kGatherWait] -
             r.phase[kScatterWait];
  return c > 0 ? c : 0;
}

// The components a step's time is split into for attributions ("which phase made it slow"):
// the nine timed phases, `other` (inside the step but in no phase: logging, the loss reduction)
// and `outside` (between steps: checkpoints, evaluation, anything the trainer does not time).
enum Component {
  kCompDataWait = kDataWait, kCompH2D = kH2D, kCompForward = kForward, kCompBackward = kBackward,
  kCompKvWait = kKvWait, kCompGatherWait = kGatherWait, kCompScatterWait = kScatterWait,
  kCompCommExposed = kCommExposed, kCompOptimizer = kOptimizer, kCompOther, kCompOutside, kNumComponents
};
// The components that measure waiting on a collective every rank meets (comm_exposed, and the
// sharded units' gather_wait and scatter_wait): they grow on the ranks that wait for a slow one,
// so they never name the slow one's phase.
inline bool waits_for_all_ranks(int component) {
  return component == kCompCommExposed || component == kCompGatherWait || component == kCompScatterWait;
}
const char* component_name(int component);
double component_seconds(const StepRecord& r, int component);

}  // namespace kilter::diag
