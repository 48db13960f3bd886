// The K/V exchange schedule of a step's cut pieces: from the plan's step and one of
// this rank's micro-batches, what that micro-batch sends and receives each layer
// (comm::KvSchedule). An earlier part sends its rows to every later part of its piece (a later
// part attends to ALL earlier tokens); a later part receives its prefix [0, s) from the earlier
// parts' ranks, in token order. Every rank derives the same lists from the same plan, so both
// ends of a message agree on its layout without asking.
#pragma once
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "lib/balance/plan.h"
#include "lib/comm/kv_exchange_mpi.h"

namespace kilter::train {

class StepCuts {
 public:
  StepCuts() = default;
  explicit StepCuts(std::vector<balance::CutPiece> cuts);
  // step_cuts(step), indexed (throws where the step breaks the plan's rules for cut pieces).
  static StepCuts of(const balance::StepView& step);
  static StepCuts of(const balance::Step& step);

  bool empty() const { return cuts_.empty(); }
  const std::vector<balance::CutPiece>& cuts() const { return cuts_; }

  // The exchange of `mb`, rank `rank`'s local micro-batch `slot`, its pieces in batch order (as
  // assemble_batch appends them). Empty when no piece of `mb` is cut. Throws when `mb` disagrees
  // with the step's cuts (a part on another rank or slot than the cut lists, a padded
  // micro-batch holding a part).
  comm::KvSchedule schedule(const balance::MicroBatch& mb, int rank, uint32_t slot, int64_t step) const;

 private:
  std::vector<balance::CutPiece> cuts_;
  std::map<std::pair<uint64_t, uint32_t>, size_t> index_;  // (doc, piece_start) -> cuts_ index
};

}  // namespace kilter::train
