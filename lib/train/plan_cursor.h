// The batch plan as the trainer walks it: each epoch's plan built on demand (identically on every
// rank, no communication) and this rank's micro-batches in the order training consumes them, so
// the reader can be fed ahead of the trainer.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "io/dataset.h"
#include "io/reader.h"
#include "lib/balance/mixture.h"
#include "lib/balance/plan.h"

namespace kilter::train {

// The plan of each epoch, built on demand and dropped once passed.
class PlanCache {
 public:
  PlanCache(const io::DatasetIndex& index, std::vector<uint64_t> docs, balance::PlanOptions opts, int world_size);
  // A mixture's plans (data.sources): drawn by `mixture` over the merged index.
  PlanCache(const io::DatasetIndex& index, std::shared_ptr<balance::MixturePlanner> mixture, int world_size);
  // Throws kilter::Error when the epoch has no step (too few tokens for train.tokens_per_step).
  const balance::EpochPlan& get(uint64_t epoch);
  void drop_before(uint64_t epoch);
  // A mixture's sources that wrap into their next epoch during `epoch` (after get(epoch)).
  const std::vector<balance::SourceWrap>& wraps(uint64_t epoch) { return wraps_[epoch]; }

 private:
  const io::DatasetIndex& index_;
  std::vector<uint64_t> docs_;
  balance::PlanOptions opts_;
  int world_size_;
  std::map<uint64_t, balance::EpochPlan> plans_;
  std::shared_ptr<balance::MixturePlanner> mixture_;
  std::map<uint64_t, std::vector<balance::SourceWrap>> wraps_;
};

// Walks this rank's micro-batches across steps and epochs from a plan position.
class PrefetchCursor {
 public:
  PrefetchCursor(PlanCache& plans, int rank, balance::PlanPosition start, int64_t steps_left);
  // Next micro-batch's pieces, or false when the run's steps are all queued.
  bool next(std::vector<io::PieceRequest>& out);

 private:
  PlanCache& plans_;
  int rank_;
  balance::PlanPosition pos_;
  int64_t steps_left_;
  size_t mb_ = 0;
  balance::MicroBatch scratch_;
};

// The reader's requests for one micro-batch's pieces, in order.
void piece_requests(const balance::MicroBatch& mb, std::vector<io::PieceRequest>& out);

}  // namespace kilter::train
