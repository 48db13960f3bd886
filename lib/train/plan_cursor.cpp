// PlanCache and PrefetchCursor (plan_cursor.h).
#include "lib/train/plan_cursor.h"

#include <utility>

#include "io/error.h"

namespace kilter::train {

PlanCache::PlanCache(const io::DatasetIndex& index, std::vector<uint64_t> docs, balance::PlanOptions opts,
                     int world_size)
    : index_(index), docs_(std::move(docs)), opts_(std::move(opts)), world_size_(world_size) {}

PlanCache::PlanCache(const io::DatasetIndex& index, std::shared_ptr<balance::MixturePlanner> mixture, int world_size)
    : index_(index), world_size_(world_size), mixture_(std::move(mixture)) {}

const balance::EpochPlan& PlanCache::get(uint64_t epoch) {
  auto it = plans_.find(epoch);
  if (it != plans_.end()) return it->second;
  if (mixture_) return plans_.emplace(epoch, mixture_->build(epoch, world_size_, &wraps_[epoch])).first->second;
  balance::EpochPlan plan = balance::build_epoch_plan(index_.doc_lengths, docs_, opts_, world_size_, epoch);
  KILTER_CHECK(!plan.steps.empty(),
               "dataset " << index_.dir << ": the plan of epoch " << epoch
                          << " has no step: the split holds too few tokens for train.tokens_per_step = "
                          << opts_.tokens_per_step << " (" << docs_.size() << " documents)");
  return plans_.emplace(epoch, std::move(plan)).first->second;
}

void PlanCache::drop_before(uint64_t epoch) {
  while (!plans_.empty() && plans_.begin()->first < epoch) plans_.erase(plans_.begin());
}

PrefetchCursor::PrefetchCursor(PlanCache& plans, int rank, balance::PlanPosition start, int64_t steps_left)
    : plans_(plans), rank_(rank), pos_(start), steps_left_(steps_left) {}

bool PrefetchCursor::next(std::vector<io::PieceRequest>& out) {
  while (steps_left_ > 0) {
    const balance::EpochPlan& plan = plans_.get(pos_.epoch);
    if (pos_.step_in_epoch >= plan.steps.size()) {
      ++pos_.epoch;
      pos_.step_in_epoch = 0;
      mb_ = 0;
      continue;
    }
    const balance::StepView step = plan.steps[pos_.step_in_epoch];
    const auto [first, end] = step.rank_micro_batches(rank_);
    if (mb_ >= end - first) {
      ++pos_.step_in_epoch;
      mb_ = 0;
      --steps_left_;
      continue;
    }
    step.micro_batch(uint32_t(first + mb_++), scratch_);
    piece_requests(scratch_, out);
    return true;
  }
  return false;
}

void piece_requests(const balance::MicroBatch& mb, std::vector<io::PieceRequest>& out) {
  out.clear();
  for (const auto& p : mb.pieces) out.push_back({p.doc, p.start, p.len});
}

}  // namespace kilter::train
