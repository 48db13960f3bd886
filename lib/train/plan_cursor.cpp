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

balance::EpochPlan PlanCache::build(uint64_t epoch) {
  if (mixture_) {
    wraps_[epoch].clear();  // built again after a replan(): the same wraps
    return mixture_->build(epoch, world_size_, &wraps_[epoch]);
  }
  balance::EpochPlan plan = balance::build_epoch_plan(index_.doc_lengths, docs_, opts_, world_size_, epoch);
  KILTER_CHECK(!plan.steps.empty(),
               "dataset " << index_.dir << ": the plan of epoch " << epoch
                          << " has no step: the split holds too few tokens for train.tokens_per_step = "
                          << opts_.tokens_per_step << " (" << docs_.size() << " documents)");
  return plan;
}

PlanCache::Entry& PlanCache::entry(uint64_t epoch) {
  auto it = plans_.find(epoch);
  if (it != plans_.end()) return it->second;
  Entry e;
  e.plan = build(epoch);
  return plans_.emplace(epoch, std::move(e)).first->second;
}

const balance::EpochPlan& PlanCache::get(uint64_t epoch) { return entry(epoch).plan; }

const balance::EpochPlan& PlanCache::plan_at(balance::PlanPosition pos) {
  const Entry& e = entry(pos.epoch);
  return pos.step_in_epoch >= e.switch_step ? *e.later : e.plan;
}

balance::StepView PlanCache::step(balance::PlanPosition pos) { return plan_at(pos).steps[pos.step_in_epoch]; }

const balance::CostModel& PlanCache::cost(balance::PlanPosition pos) { return plan_at(pos).cost; }

void PlanCache::drop_before(uint64_t epoch) {
  while (!plans_.empty() && plans_.begin()->first < epoch) plans_.erase(plans_.begin());
}

void PlanCache::replan(balance::PlanPosition from, double t) {
  balance::CostModel cost = mixture_ ? mixture_->options().cost : opts_.cost;
  cost.t = t;
  cost.layers = 0;  // as given: the link-bound rule raises only a derived t
  if (mixture_)
    mixture_->set_cost(cost);
  else
    opts_.cost = cost;
  for (auto it = plans_.begin(); it != plans_.end();) {
    if (it->first < from.epoch) {
      ++it;
    } else if (it->first == from.epoch && from.step_in_epoch > 0) {
      it->second.later = std::make_unique<balance::EpochPlan>(build(it->first));
      it->second.switch_step = from.step_in_epoch;
      ++it;
    } else {
      it = plans_.erase(it);  // nothing has been read from it: built again on demand
    }
  }
}

PrefetchCursor::PrefetchCursor(PlanCache& plans, int rank, balance::PlanPosition start, int64_t steps_left)
    : plans_(plans), rank_(rank), pos_(start), steps_left_(steps_left) {}

bool PrefetchCursor::next(std::vector<io::PieceRequest>& out) {
  while (steps_left_ > 0) {
    if (pos_.step_in_epoch >= plans_.get(pos_.epoch).steps.size()) {
      ++pos_.epoch;
      pos_.step_in_epoch = 0;
      mb_ = 0;
      continue;
    }
    const balance::StepView step = plans_.step(pos_);
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
