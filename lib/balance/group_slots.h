// The division of a step for fully sharded training (train.shard = parameters): every micro-batch
// is a meeting point of the shard group (its layers' parameters are all-gathered inside the group
// before the forward and the backward, its gradients reduce-scattered after), so the group's
// ranks must run the same number of micro-batches, and each slot (the k-th micro-batch of every
// rank of the group) must cost the same on each of them: a rank ahead in one slot waits at the
// next gather. docs/plan.md, "Shard groups", explains the design and its figures. Internal to
// lib/balance; build_epoch_plan() runs it where PlanOptions::shard_group > 1.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "lib/balance/divide.h"
#include "lib/balance/plan.h"

namespace kilter::balance {

// Divides steps for groups of `group` consecutive ranks (world_size a multiple of it, > 1):
// 1. the step's whole pieces among the world_size / group groups by cost (the StepDivider with a
//    group's budget, group x max_tokens per slot, and no cuts: a piece never spans two groups);
// 2. per group, its pieces into m slots of even cost, each of at most group x max_tokens tokens,
//    m the fewest for which step 3 gives every rank exactly one micro-batch per slot;
// 3. each slot among the group's ranks by the StepDivider (cuts allowed): one micro-batch per
//    rank, so the parts of a cut piece sit on distinct ranks at the same local micro-batch index.
// Where no m up to kMaxExtraSlots above the least gives every rank one micro-batch per slot (a
// group with fewer tokens than ranks can split), the slots that leave a rank idle are divided
// without cuts and run last.
class GroupSlotDivider {
 public:
  static constexpr int kMaxExtraSlots = 8;
  GroupSlotDivider(const CostModel& cost, uint64_t max_tokens, int world_size, int group, bool cut_pieces,
                   uint32_t context);
  void divide(const Piece* pieces, size_t n, PlanSteps& out);

 private:
  // One group's pieces into `m` slots of even cost (longest first to the cheapest slot that has
  // room); false where they do not fit.
  bool fill_slots(const std::vector<Piece>& group_pieces, size_t m);
  void divide_group(const std::vector<Piece>& group_pieces, int first_rank);

  CostModel cost_;
  uint64_t max_tokens_;
  int world_size_, group_;
  bool cut_pieces_;
  uint32_t context_;
  StepDivider group_divider_;  // step 1: world_size / group "ranks", no cuts
  StepDivider slot_divider_;   // step 3: group ranks, cuts as configured
  StepDivider slot_whole_;     // the fallback: group ranks, no cuts
  std::vector<std::vector<Piece>> slots_;
  std::vector<double> slot_cost_;
  std::vector<uint64_t> slot_tokens_;
  // Per rank of the step: its micro-batches, in the order it runs them.
  std::vector<std::vector<std::vector<Piece>>> rank_mbs_;
};

// The division every balanced planner runs step by step (one dataset's plan, a mixture's): by
// slots where PlanOptions::shard_group > 1, else the StepDivider as always (its rank speeds, its
// whole-piece figure). Shard groups leave rank speeds aside: a group's ranks meet every slot.
class StepDivision {
 public:
  StepDivision(const CostModel& cost, const PlanOptions& opts, int world_size);
  // Appends the step of pieces[0, n) to plan.steps (and, without groups, its uncut figure).
  void divide(const Piece* pieces, size_t n, EpochPlan& plan);
  // After compute_plan_stats(): the slot statistics into plan.stats (shard groups only).
  void add_stats(EpochPlan& plan) const;

 private:
  int group_ = 0;
  StepDivider divider_;
  std::unique_ptr<GroupSlotDivider> by_group_;
};

// Per-slot balance of a plan for shard groups of `group` consecutive ranks, any plan (slot k of
// a group = the k-th micro-batch of each of its ranks; a rank with fewer micro-batches counts 0
// there): per (step, group, slot) the busiest rank's micro-batch cost over the mean of the
// group's; per step, the meeting-bound time max over groups of sum over slots of the busiest
// rank's cost, over the mean rank cost of the step (1 = every slot even and the groups even).
struct GroupSlotStats {
  double slot_imbalance_p50 = 0, slot_imbalance_p95 = 0, slot_imbalance_max = 0;
  double slotted_imbalance_p50 = 0, slotted_imbalance_p95 = 0;
  uint64_t uneven_group_steps = 0;  // (step, group) pairs whose ranks run different counts
};
GroupSlotStats group_slot_stats(const EpochPlan& plan, int group);

}  // namespace kilter::balance
