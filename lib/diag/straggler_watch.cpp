// Live straggler warning over a sliding window (see straggler_watch.h).
#include "lib/diag/straggler_watch.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "io/base/error.h"
#include "lib/diag/run_statistics.h"

namespace kilter::diag {

StragglerWatch::StragglerWatch(int world_size, int window, double share)
    : world_size_(world_size),
      window_(std::max(1, window)),
      share_(share),
      last_rank_(window_, -1),
      lag_(window_, 0.0),
      step_seconds_(window_, 0.0),
      components_(size_t(window_) * world_size * kNumComponents, 0.0),
      kv_wait_peers_(size_t(window_) * world_size, -1) {
  KILTER_CHECK(world_size >= 1, "diagnostics: world size " << world_size << " must be positive");
}

std::string StragglerWatch::add_step(const StepRecord* ranks) {
  const int slot = int(seen_ % window_);
  ++seen_;
  LastArrival last = find_last_arrival(ranks, world_size_);
  last_rank_[slot] = last.significant ? last.rank : -1;
  lag_[slot] = last.lag;
  std::vector<double> totals;
  for (int r = 0; r < world_size_; ++r) {
    totals.push_back(ranks[r].phase[kStepTotal]);
    kv_wait_peers_[size_t(slot) * world_size_ + r] = ranks[r].kv_wait_peer;
    for (int c = 0; c < kNumComponents; ++c)
      components_[(size_t(slot) * world_size_ + r) * kNumComponents + c] = component_seconds(ranks[r], c);
  }
  step_seconds_[slot] = median(totals);
  if (world_size_ < 2 || seen_ < window_) return "";

  std::vector<int> counts(world_size_, 0);
  for (int s = 0; s < window_; ++s)
    if (last_rank_[s] >= 0) counts[last_rank_[s]] += 1;
  int rank = int(std::max_element(counts.begin(), counts.end()) - counts.begin());
  // The same test as the run summary's rule, over the window: being last by chance has
  // probability 1/P per step, so the share must also clear 1/P + 3 sigma (with 2 ranks and a
  // 20-step window: 17 of 20).
  const double p0 = 1.0 / world_size_;
  const double needed = std::max(share_, p0 + 3.0 * std::sqrt(p0 * (1 - p0) / double(window_)));
  if (counts[rank] < int(std::ceil(needed * window_ - 1e-9))) return "";

  double lag_sum = 0, step_sum = 0;
  std::vector<double> sums(size_t(world_size_) * kNumComponents, 0.0);
  for (int s = 0; s < window_; ++s) {
    step_sum += step_seconds_[s];
    if (last_rank_[s] == rank) lag_sum += lag_[s];
    for (size_t i = 0; i < sums.size(); ++i) sums[i] += components_[size_t(s) * sums.size() + i];
  }
  double mean_lag = lag_sum / counts[rank];
  double mean_step = step_sum / window_;
  double excess = 0;
  int comp = slowest_component(sums, world_size_, rank, &excess);
  if (rank == warned_rank_ && comp == warned_component_) {
    if (seen_ - warned_at_ < repeat_after_) return "";
    repeat_after_ *= 2;
  } else {
    repeat_after_ = window_;
  }
  warned_rank_ = rank;
  warned_component_ = comp;
  warned_at_ = seen_;
  char line[512];
  std::snprintf(line, sizeof line,
                "kilter: warning: rank %d arrived last at the gradient collective in %d of the last "
                "%d steps (mean lag %.4f s, %.0f%% of a step); slowest phase: %s (+%.4f s per step "
                "over the other ranks' median)",
                rank, counts[rank], window_, mean_lag, mean_step > 0 ? 100.0 * mean_lag / mean_step : 0.0,
                comp >= 0 ? component_name(comp) : "none", excess / window_);
  std::string warning = line;
  if (comp == kCompKvWait) {
    // Waiting for a cut piece's K/V: the rank that held it back is the one to look at.
    std::map<int, int64_t> peers;
    for (int s = 0; s < window_; ++s) {
      const int peer = kv_wait_peers_[size_t(s) * world_size_ + rank];
      if (peer >= 0) peers[peer] += 1;
    }
    const int peer = most_common_peer(peers);
    if (peer >= 0) warning += "; it waited for the K/V of cut pieces held by rank " + std::to_string(peer);
  }
  return warning;
}

}  // namespace kilter::diag
