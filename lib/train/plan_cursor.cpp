// PlanCache and PrefetchCursor (plan_cursor.h).
#include "lib/train/plan_cursor.h"

#include <utility>

#include "io/base/error.h"

namespace kilter::train {

PlanCache::PlanCache(const io::DatasetIndex& index, std::vector<uint64_t> docs, balance::PlanOptions opts,
                     int world_size)
    : index_(index), docs_(std::move(docs)), opts_(std::move(opts)), world_size_(world_size) {}

PlanCache::PlanCache(const io::DatasetIndex& index, std::shared_ptr<balance::MixturePlanner> mixture, int world_size)
    : index_(index), world_size_(world_size), mixture_(std::move(mixture)) {}

PlanCache::~PlanCache() {
  if (build_ && build_->thread.joinable()) build_->thread.join();
}

balance::EpochPlan PlanCache::build_with(const io::DatasetIndex& index, const std::vector<uint64_t>& docs,
                                         balance::PlanOptions opts, balance::MixturePlanner* mixture, int world_size,
                                         uint64_t epoch) {
  if (mixture) return mixture->build(epoch, world_size);
  balance::EpochPlan plan = balance::build_epoch_plan(index.doc_lengths, docs, opts, world_size, epoch);
  KILTER_CHECK(!plan.steps.empty(),
               "dataset " << index.dir << ": the plan of epoch " << epoch
                          << " has no step: the split holds too few tokens for train.tokens_per_step = "
                          << opts.tokens_per_step << " (" << docs.size() << " documents)");
  return plan;
}

balance::EpochPlan PlanCache::build(uint64_t epoch) {
  if (mixture_) {
    wraps_[epoch].clear();  // built again after a replan(): the same wraps
    return mixture_->build(epoch, world_size_, &wraps_[epoch]);
  }
  return build_with(index_, docs_, opts_, nullptr, world_size_, epoch);
}

PlanCache::Entry& PlanCache::entry(uint64_t epoch) {
  auto it = plans_.find(epoch);
  if (it != plans_.end()) return it->second;
  Entry e;
  e.plan = std::make_shared<balance::EpochPlan>(build(epoch));
  return plans_.emplace(epoch, std::move(e)).first->second;
}

const balance::EpochPlan& PlanCache::get(uint64_t epoch) { return *entry(epoch).plan; }

std::shared_ptr<const balance::EpochPlan> PlanCache::shared_plan_at(balance::PlanPosition pos) {
  const Entry& e = entry(pos.epoch);
  for (auto it = e.later.rbegin(); it != e.later.rend(); ++it)
    if (pos.step_in_epoch >= it->first) return it->second;
  return e.plan;
}

const balance::EpochPlan& PlanCache::plan_at(balance::PlanPosition pos) { return *shared_plan_at(pos); }

balance::StepView PlanCache::step(balance::PlanPosition pos) { return plan_at(pos).steps[pos.step_in_epoch]; }

const balance::CostModel& PlanCache::cost(balance::PlanPosition pos) { return plan_at(pos).cost; }

const std::vector<double>& PlanCache::rank_speed(balance::PlanPosition pos) { return plan_at(pos).rank_speed; }

void PlanCache::drop_before(uint64_t epoch) {
  while (!plans_.empty() && plans_.begin()->first < epoch) plans_.erase(plans_.begin());
}

PlanModel PlanCache::model() const {
  const balance::PlanOptions& opts = mixture_ ? mixture_->options() : opts_;
  return PlanModel{opts.cost, opts.rank_speed};
}

void PlanCache::set_model(const PlanModel& model) {
  if (mixture_) {
    mixture_->set_cost(model.cost);
    mixture_->set_rank_speed(model.rank_speed);
  } else {
    opts_.cost = model.cost;
    opts_.rank_speed = model.rank_speed;
  }
}

void PlanCache::replan(balance::PlanPosition from, double t) {
  PlanModel next = model();
  next.cost.t = t;
  next.cost.layers = 0;  // as given: the link-bound rule raises only a derived t
  replan(from, next);
}

void PlanCache::replan(balance::PlanPosition from, const PlanModel& model) {
  set_model(model);
  if (from.step_in_epoch > 0 && plans_.count(from.epoch)) {
    install(from, std::make_shared<balance::EpochPlan>(build(from.epoch)));
    return;
  }
  // Nothing has been read from the epoch: built again on demand (the later ones too).
  plans_.erase(plans_.lower_bound(from.epoch), plans_.end());
}

void PlanCache::install(balance::PlanPosition from, std::shared_ptr<balance::EpochPlan> plan) {
  plans_.erase(plans_.upper_bound(from.epoch), plans_.end());  // not read from: built again on demand
  auto it = plans_.find(from.epoch);
  if (from.step_in_epoch == 0 || it == plans_.end()) {
    Entry e;
    e.plan = std::move(plan);
    if (it != plans_.end()) plans_.erase(it);
    plans_.emplace(from.epoch, std::move(e));
    return;
  }
  Entry& e = it->second;
  while (!e.later.empty() && e.later.back().first >= from.step_in_epoch) e.later.pop_back();
  e.later.emplace_back(from.step_in_epoch, std::move(plan));
}

void PlanCache::start_build(uint64_t epoch, PlanModel model, std::function<void(const balance::EpochPlan&)> then) {
  start_job(
      epoch,
      [model = std::move(model)](PlanModel& chosen) {
        chosen = model;
        return true;
      },
      std::move(then));
}

void PlanCache::start_job(uint64_t epoch, std::function<bool(PlanModel&)> choose,
                          std::function<void(const balance::EpochPlan&)> then) {
  KILTER_CHECK(!build_, "plan: a re-plan is already being built");
  build_ = std::make_unique<Build>();
  Build& b = *build_;
  b.epoch = epoch;
  build_mixture_.reset();
  if (mixture_) build_mixture_ = std::make_unique<balance::MixturePlanner>(*mixture_);  // its own draw state
  b.thread = std::thread([&b, &index = index_, docs = docs_, opts = opts_, mixture = build_mixture_.get(),
                          world = world_size_, choose = std::move(choose), then = std::move(then)]() mutable {
    try {
      if (!choose(b.model)) {
        b.skipped = true;
      } else {
        opts.cost = b.model.cost;
        opts.rank_speed = b.model.rank_speed;
        if (mixture) {
          mixture->set_cost(b.model.cost);
          mixture->set_rank_speed(b.model.rank_speed);
        }
        b.plan = build_with(index, docs, opts, mixture, world, b.epoch);
        if (then) then(b.plan);
      }
    } catch (...) {
      b.error = std::current_exception();
    }
    b.done.store(true);
  });
}

const balance::EpochPlan& PlanCache::built_plan() {
  KILTER_CHECK(build_ready(), "plan: the re-plan is not built yet");
  if (build_->thread.joinable()) build_->thread.join();
  if (build_->error) std::rethrow_exception(build_->error);
  return build_->plan;  // empty where the build was skipped
}

bool PlanCache::switch_to(balance::PlanPosition from) {
  built_plan();
  Build& b = *build_;
  KILTER_CHECK(from.epoch >= b.epoch, "plan: a re-plan of epoch " << b.epoch << " switched to at epoch " << from.epoch);
  if (from.epoch > b.epoch && from.step_in_epoch > 0) return false;
  set_model(b.model);
  if (from.epoch == b.epoch)
    install(from, std::make_shared<balance::EpochPlan>(std::move(b.plan)));
  else
    plans_.erase(plans_.lower_bound(from.epoch), plans_.end());  // not read from: built again on demand
  build_.reset();
  build_mixture_.reset();
  return true;
}

void PlanCache::drop_build() {
  if (!build_) return;
  if (build_->thread.joinable()) build_->thread.join();
  build_.reset();
  build_mixture_.reset();
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
