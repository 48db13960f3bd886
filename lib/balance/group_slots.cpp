// The division of a step for shard groups (see group_slots.h): groups by whole pieces, each
// group's pieces into slots of even cost, each slot among the group's ranks with one micro-batch
// per rank.
#include "lib/balance/group_slots.h"

#include <algorithm>
#include <numeric>

#include "io/base/error.h"

namespace kilter::balance {

GroupSlotDivider::GroupSlotDivider(const CostModel& cost, uint64_t max_tokens, int world_size, int group,
                                   bool cut_pieces, uint32_t context)
    : cost_(cost),
      max_tokens_(max_tokens),
      world_size_(world_size),
      group_(group),
      cut_pieces_(cut_pieces),
      context_(context),
      group_divider_(cost, uint64_t(std::max(group, 1)) * max_tokens, std::max(world_size / std::max(group, 1), 1),
                     false),
      slot_divider_(cost, max_tokens, std::max(group, 1), cut_pieces),
      slot_whole_(cost, max_tokens, std::max(group, 1), false) {
  KILTER_CHECK(group > 1 && world_size % group == 0,
               "plan: a shard group of " << group << " ranks does not divide the world size " << world_size
               << " (train.shard_group)");
  KILTER_CHECK(uint64_t(context) <= uint64_t(group) * max_tokens,
               "plan: a piece of model.block_size = " << context << " tokens does not fit one slot of a shard group ("
               << group << " ranks x data.max_tokens = " << max_tokens << "); raise data.max_tokens to >= "
               << (context + group - 1) / group << " or use a larger train.shard_group");
}

bool GroupSlotDivider::fill_slots(const std::vector<Piece>& group_pieces, size_t m) {
  const uint64_t room = uint64_t(group_) * max_tokens_;
  slots_.assign(m, {});
  slot_cost_.assign(m, 0.0);
  slot_tokens_.assign(m, 0);
  // group_pieces come longest first: each to the cheapest slot with room for it.
  for (const Piece& p : group_pieces) {
    size_t best = m;
    for (size_t s = 0; s < m; ++s)
      if (slot_tokens_[s] + p.len <= room && (best == m || slot_cost_[s] < slot_cost_[best])) best = s;
    if (best == m) return false;
    slots_[best].push_back(p);
    slot_cost_[best] += cost_.piece(p.len);
    slot_tokens_[best] += p.len;
  }
  // Empty slots (more slots than pieces) run nothing on any rank: drop them.
  slots_.erase(std::remove_if(slots_.begin(), slots_.end(), [](const std::vector<Piece>& s) { return s.empty(); }),
               slots_.end());
  return true;
}

namespace {

// Rank by rank, the micro-batches of a one-step plan, as pieces.
std::vector<std::vector<std::vector<Piece>>> micro_batches_of(const PlanSteps& steps) {
  const StepView step = steps[0];
  std::vector<std::vector<std::vector<Piece>>> out(size_t(step.world_size()));
  MicroBatch mb;
  for (int r = 0; r < step.world_size(); ++r) {
    const auto [first, end] = step.rank_micro_batches(r);
    for (uint32_t id = first; id < end; ++id) {
      step.micro_batch(id, mb);
      out[size_t(r)].push_back(mb.pieces);
    }
  }
  return out;
}

bool one_each(const std::vector<std::vector<std::vector<Piece>>>& slot) {
  return std::all_of(slot.begin(), slot.end(), [](const auto& mbs) { return mbs.size() == 1; });
}

}  // namespace

void GroupSlotDivider::divide_group(const std::vector<Piece>& group_pieces, int first_rank) {
  uint64_t tokens = 0;
  for (const Piece& p : group_pieces) tokens += p.len;
  if (tokens == 0) return;  // an idle group (fewer pieces than groups)
  const uint64_t room = uint64_t(group_) * max_tokens_;
  const size_t least = size_t(std::max<uint64_t>(1, (tokens + room - 1) / room));
  // Per slot, per rank of the group: its micro-batches.
  using SlotResult = std::vector<std::vector<std::vector<Piece>>>;
  std::vector<SlotResult> result;
  const auto divide_slots = [&](StepDivider& divider) {
    result.clear();
    for (const std::vector<Piece>& slot : slots_) {
      PlanSteps one(context_, group_, false, cost_);
      divider.divide(slot.data(), slot.size(), one);
      result.push_back(micro_batches_of(one));
    }
  };
  bool filled = false;
  for (size_t m = least; m <= least + size_t(kMaxExtraSlots); ++m) {
    if (!fill_slots(group_pieces, m)) continue;
    filled = true;
    divide_slots(slot_divider_);
    bool over = false;
    for (const SlotResult& slot : result)
      for (const auto& mbs : slot) over = over || mbs.size() > 1;
    // A rank idle in a slot: more slots only make them smaller; take this m.
    if (!over) break;
  }
  if (!filled) {  // one piece per slot always fits (pieces are at most a slot's room)
    fill_slots(group_pieces, group_pieces.size());
    divide_slots(slot_divider_);
  }
  // Slots where a rank has no micro-batch or more than one: divided again without cuts (no part
  // then needs a meeting index) and run after the even slots.
  std::vector<size_t> order(result.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_partition(order.begin(), order.end(), [&](size_t s) { return one_each(result[s]); });
  for (size_t s : order) {
    if (one_each(result[s])) continue;
    PlanSteps one(context_, group_, false, cost_);
    slot_whole_.divide(slots_[s].data(), slots_[s].size(), one);
    result[s] = micro_batches_of(one);
  }
  for (int i = 0; i < group_; ++i) {
    auto& mbs = rank_mbs_[size_t(first_rank + i)];
    for (size_t s : order)
      for (auto& mb : result[s][size_t(i)]) mbs.push_back(std::move(mb));
  }
}

void GroupSlotDivider::divide(const Piece* pieces, size_t n, PlanSteps& out) {
  KILTER_CHECK(out.world_size() == world_size_,
               "plan: steps for " << out.world_size() << " ranks given to a group divider for " << world_size_);
  const int groups = world_size_ / group_;
  rank_mbs_.assign(size_t(world_size_), {});
  uint64_t target_tokens = 0;
  for (size_t i = 0; i < n; ++i) target_tokens += pieces[i].len;
  // Step 1: whole pieces among the groups (one group: all of them).
  std::vector<std::vector<Piece>> group_pieces(static_cast<size_t>(groups));
  if (groups == 1) {
    group_pieces[0].assign(pieces, pieces + n);
  } else {
    PlanSteps by_group(context_, groups, false, cost_);
    group_divider_.divide(pieces, n, by_group);
    const auto mbs = micro_batches_of(by_group);
    for (int g = 0; g < groups; ++g) {
      std::vector<Piece>& gp = group_pieces[size_t(g)];
      for (const auto& mb : mbs[size_t(g)]) gp.insert(gp.end(), mb.begin(), mb.end());
    }
  }
  for (int g = 0; g < groups; ++g) {
    std::vector<Piece>& gp = group_pieces[size_t(g)];
    for (const Piece& p : gp)
      KILTER_CHECK(p.offset == 0, "plan: a piece cut between shard groups (internal: groups divide whole pieces)");
    // Longest first, then by document and start: an order of the pieces alone.
    std::sort(gp.begin(), gp.end(), [](const Piece& x, const Piece& y) {
      if (x.len != y.len) return x.len > y.len;
      return x.doc != y.doc ? x.doc < y.doc : x.start < y.start;
    });
    divide_group(gp, g * group_);
  }
  // Steps 2-3 done: the step, rank by rank.
  for (int r = 0; r < world_size_; ++r) {
    for (const auto& mb : rank_mbs_[size_t(r)]) {
      for (const Piece& p : mb) out.add_piece(p);
      out.end_micro_batch();
    }
    out.end_rank();
  }
  out.end_step(target_tokens);
}

StepDivision::StepDivision(const CostModel& cost, const PlanOptions& opts, int world_size)
    : group_(opts.shard_group > 1 ? opts.shard_group : 0),
      divider_(cost, opts.max_tokens, world_size, opts.cut_pieces, opts.rank_speed) {
  if (group_ > 1)
    by_group_ = std::make_unique<GroupSlotDivider>(cost, opts.max_tokens, world_size, group_, opts.cut_pieces,
                                                   opts.context);
}

void StepDivision::divide(const Piece* pieces, size_t n, EpochPlan& plan) {
  if (by_group_) return by_group_->divide(pieces, n, plan.steps);
  divider_.divide(pieces, n, plan.steps);
  plan.uncut_imbalance.push_back(divider_.uncut_imbalance());
}

void StepDivision::add_stats(EpochPlan& plan) const {
  if (!by_group_) return;
  const GroupSlotStats slots = group_slot_stats(plan, group_);
  PlanStats& stats = plan.stats;
  stats.shard_group = group_;
  stats.slot_imbalance_p50 = slots.slot_imbalance_p50;
  stats.slot_imbalance_p95 = slots.slot_imbalance_p95;
  stats.slotted_imbalance_p50 = slots.slotted_imbalance_p50;
  stats.slotted_imbalance_p95 = slots.slotted_imbalance_p95;
  stats.uneven_group_steps = slots.uneven_group_steps;
}

GroupSlotStats group_slot_stats(const EpochPlan& plan, int group) {
  KILTER_CHECK(group >= 1 && plan.world_size % group == 0,
               "plan: a shard group of " << group << " ranks does not divide the world size " << plan.world_size);
  GroupSlotStats st;
  std::vector<double> slot_imbalance, slotted;
  MicroBatch mb;
  for (uint64_t s = 0; s < plan.steps.size(); ++s) {
    const StepView step = plan.steps[s];
    // Per rank: its micro-batches' costs in the order it runs them.
    std::vector<std::vector<double>> costs(size_t(plan.world_size));
    double total = 0;
    for (int r = 0; r < plan.world_size; ++r) {
      const auto [first, end] = step.rank_micro_batches(r);
      for (uint32_t id = first; id < end; ++id) {
        step.micro_batch(id, mb);
        costs[size_t(r)].push_back(mb.cost);
        total += mb.cost;
      }
    }
    if (total <= 0) continue;
    double slowest_group = 0;
    for (int g = 0; g * group < plan.world_size; ++g) {
      size_t slots = 0, fewest = SIZE_MAX;
      for (int i = 0; i < group; ++i) {
        slots = std::max(slots, costs[size_t(g * group + i)].size());
        fewest = std::min(fewest, costs[size_t(g * group + i)].size());
      }
      if (fewest != slots) ++st.uneven_group_steps;
      double group_time = 0;
      for (size_t k = 0; k < slots; ++k) {
        double top = 0, sum = 0;
        for (int i = 0; i < group; ++i) {
          const auto& c = costs[size_t(g * group + i)];
          const double v = k < c.size() ? c[k] : 0.0;
          top = std::max(top, v);
          sum += v;
        }
        group_time += top;
        if (sum > 0) slot_imbalance.push_back(top * double(group) / sum);
      }
      slowest_group = std::max(slowest_group, group_time);
    }
    slotted.push_back(slowest_group * double(plan.world_size) / total);
  }
  st.slot_imbalance_p50 = quantile_of(slot_imbalance, 0.50);
  st.slot_imbalance_p95 = quantile_of(slot_imbalance, 0.95);
  st.slot_imbalance_max = quantile_of(slot_imbalance, 1.0);
  st.slotted_imbalance_p50 = quantile_of(slotted, 0.50);
  st.slotted_imbalance_p95 = quantile_of(slotted, 0.95);
  return st;
}

}  // namespace kilter::balance
