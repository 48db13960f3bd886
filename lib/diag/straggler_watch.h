// The live straggler warning on rank 0: over a sliding window of the last N steps, a rank that
// arrived last at the gradient collective (beyond noise) in most of them is named on stderr in
// one line, with the phase in which it is slower than the other ranks' median.
#pragma once
#include <string>
#include <vector>

#include "lib/diag/step_record.h"

namespace kilter::diag {

class StragglerWatch {
 public:
  // A rank is named when it was last beyond noise in at least `share` of `window` steps.
  StragglerWatch(int world_size, int window, double share = 0.6);
  // Feeds one step (world_size records indexed by rank). Returns the warning line to print, or
  // "" when there is nothing (new) to say. A persisting verdict (same rank and phase) is repeated
  // after 1, 2, 4, ... windows, so a long run with a permanent straggler logs O(log steps) lines;
  // a new rank or phase is reported at once.
  std::string add_step(const StepRecord* ranks);

 private:
  int world_size_;
  int window_;
  double share_;
  int64_t seen_ = 0;
  std::vector<int> last_rank_;           // ring: the rank last beyond noise, or -1
  std::vector<double> lag_;              // ring: its lag (s)
  std::vector<double> step_seconds_;     // ring: median step_total of the step
  std::vector<double> components_;       // ring: [slot][rank][component] seconds
  std::vector<int> kv_wait_peers_;       // ring: [slot][rank] the rank it waited for longest in kv_wait
  int warned_rank_ = -1;
  int warned_component_ = -1;
  int64_t warned_at_ = -1;
  int64_t repeat_after_ = 0;             // steps until the same verdict is repeated
};

}  // namespace kilter::diag
