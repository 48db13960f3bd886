// Run statistics from the per-step records of every rank: step-time imbalance, the time ranks
// wait for the last arrival, the straggler rule, stalls and their period, memory asymmetry and
// per-phase means. Used live on rank 0 (fed by the per-step gather) and by `kilter report`
// (fed from the metrics CSVs), so both say the same thing. Memory is O(steps + ranks): only
// per-step aggregates and per-rank sums are kept, never the full rank x step table.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/diag/step_record.h"

namespace kilter::diag {

// q-th percentile (0..100) with linear interpolation between order statistics (numpy's default).
double percentile(std::vector<double> values, double q);
double median(std::vector<double> values);

// Who arrived last at the gradient collective in one step, and whether it was beyond noise.
struct LastArrival {
  int rank = -1;           // last to arrive (-1 with fewer than two ranks)
  double lag = 0;          // its arrival minus the median arrival of the other ranks (s)
  double noise = 0;        // the lag that counts as noise in this step (s)
  bool significant = false;
};
// The noise rule: a lag counts when it exceeds 5% of the step's median step_total, and at least
// 100 microseconds (clock alignment and scheduler jitter).
constexpr double kLagNoiseFraction = 0.05;
constexpr double kLagNoiseFloorSeconds = 1e-4;
LastArrival find_last_arrival(const StepRecord* ranks, int world_size);

// The component (see step_record.h) in which `rank` exceeds the other ranks' median by most, over
// the per-rank component sums given as sums[rank * kNumComponents + component]; comm_exposed,
// gather_wait and scatter_wait are never the answer (they measure waiting for others). Returns -1
// when no component exceeds.
int slowest_component(const std::vector<double>& sums, int world_size, int rank, double* excess);

struct StragglerVerdict {
  int rank = -1;              // -1: no straggler beyond noise
  int candidate = -1;         // the rank most often last beyond noise, named or not
  int64_t steps_last = 0;     // steps the candidate was last beyond noise
  double share = 0;           // steps_last / steps
  double threshold = 0;       // share needed to be named
  double mean_lag_seconds = 0;
  std::string phase;          // its slowest component relative to the other ranks' median
  double phase_excess_seconds = 0;  // per step, over that median
  // phase kv_wait: the rank whose K/V (or dK/dV) the candidate waited for in most steps: the
  // rank that really held it back (-1 otherwise).
  int kv_wait_for_rank = -1;
};

// The rank with the highest count in `counts` (rank -> steps), the lowest rank on ties; -1 when empty.
int most_common_peer(const std::map<int, int64_t>& counts);

struct Stall {
  int64_t step = 0;
  double seconds = 0;          // the step's wall time (slowest rank, outside time included)
  std::string phase;           // the component that grew most over its median
  double excess_seconds = 0;
};

class RunStatistics {
 public:
  explicit RunStatistics(int world_size, double stall_factor = 2.0);
  // One step: `ranks` holds world_size records, indexed by rank.
  void add_step(const StepRecord* ranks);

  int world_size() const { return world_size_; }
  int64_t steps() const { return int64_t(steps_.size()); }
  double step_time_imbalance_percentile(double q) const;
  double sync_wait_fraction() const;
  // The last step added: max / mean of the ranks' compute time, and the share of the ranks' step
  // time spent waiting for the last one at the gradient collective.
  double last_step_imbalance() const { return steps_.empty() ? 1.0 : steps_.back().imbalance; }
  double last_step_sync_wait_share() const { return steps_.empty() ? 0.0 : steps_.back().sync_wait_share; }
  StragglerVerdict straggler() const;
  std::vector<Stall> stalls() const;
  // The period of recurring stalls (steps), or 0 when they do not recur regularly.
  int64_t stall_period() const;
  double median_step_seconds() const;
  // Mean seconds per step of `component` on `rank`.
  double component_mean(int rank, int component) const;
  double compute_mean(int rank) const;
  uint64_t peak_rss_bytes(int rank) const { return peak_rss_[rank]; }
  uint64_t device_peak_bytes(int rank) const { return device_peak_[rank]; }

  // The summary.json fields this module owns (docs/design.md plus the diagnostics detail).
  nlohmann::json to_json() const;

 private:
  struct StepAggregate {
    int64_t step = 0;
    double wall = 0;                 // max over ranks of step_total + outside
    double imbalance = 1;            // max / mean of per-rank compute time
    double sync_wait_share = 0;      // sum of (last arrival - arrival) / sum of step_total
    double component_max[kNumComponents] = {};
  };
  int world_size_;
  double stall_factor_;
  std::vector<StepAggregate> steps_;
  std::vector<double> component_sums_;   // [rank * kNumComponents + c]
  std::vector<double> compute_sums_;
  std::vector<int64_t> last_counts_;     // steps each rank was last beyond noise
  std::vector<double> last_lag_sums_;
  std::vector<uint64_t> peak_rss_;
  std::vector<uint64_t> device_peak_;
  std::vector<std::map<int, int64_t>> kv_wait_peers_;  // per rank: steps it waited longest for each rank
  int64_t kv_tokens_ = 0;                // sum over ranks and steps
  int64_t kv_bytes_ = 0;                 // sum over ranks and steps (each byte counted at both ends)
  double kv_wait_seconds_ = 0;           // sum over ranks and steps
  double gather_wait_seconds_ = 0;       // sum over ranks and steps
  double scatter_wait_seconds_ = 0;      // sum over ranks and steps
  double wait_seconds_ = 0;              // sum over ranks and steps of (last arrival - arrival)
  double step_total_seconds_ = 0;        // sum over ranks and steps of step_total
};

}  // namespace kilter::diag
