// Unit tests of the division for shard groups (train.shard = parameters): every piece of a step
// once, equal micro-batch counts within each group, the cut-piece rules, the same steps on every
// world size, and slots more even than the whole-step division leaves them, on the skewed corpus
// the balance bench uses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <tuple>
#include <vector>

#include "io/base/error.h"
#include "lib/balance/group_slots.h"
#include "lib/balance/mixture.h"
#include "lib/balance/plan.h"
#include "lib/balance/synthetic_lengths.h"

namespace kilter::balance {
namespace {

// bench/balance_effect.sh's skewed corpus and step: context 512, 2048-token micro-batches,
// 16384-token steps.
std::vector<uint32_t> bench_corpus() {
  return synthetic_lengths(parse_length_spec("lognormal:4.8,1.1,1024"), 3000, 11);
}
PlanOptions bench_options(int group) {
  PlanOptions o;
  o.context = 512;
  o.max_tokens = 2048;
  o.tokens_per_step = 16384;
  o.seed = 1337;
  o.cost.b = 1.0 / 3072;
  o.cost.c = 0;
  o.shard_group = group;
  return o;
}

// A step's targets as sorted (doc, first token, end) runs, adjacent parts merged.
std::vector<std::tuple<uint64_t, uint32_t, uint32_t>> targets(const Step& step) {
  std::vector<std::tuple<uint64_t, uint32_t, uint32_t>> runs;
  for (const MicroBatch& mb : step.micro_batches)
    for (const Piece& p : mb.pieces) runs.emplace_back(p.doc, p.start, p.start + p.len);
  std::sort(runs.begin(), runs.end());
  std::vector<std::tuple<uint64_t, uint32_t, uint32_t>> merged;
  for (const auto& r : runs) {
    if (!merged.empty() && std::get<0>(merged.back()) == std::get<0>(r) && std::get<2>(merged.back()) == std::get<1>(r))
      std::get<2>(merged.back()) = std::get<2>(r);
    else
      merged.push_back(r);
  }
  return merged;
}

TEST(BalanceGroupSlots, EveryPieceOnceEqualCountsAndTheSameStepsOnEveryWorldSize) {
  const auto lengths = bench_corpus();
  const auto docs = all_documents(lengths.size());
  const EpochPlan whole = build_epoch_plan(lengths, docs, bench_options(0), 2, 0);
  for (int world : {2, 4, 8}) {
    for (int group : {2, 4}) {
      if (group > world) continue;
      const EpochPlan plan = build_epoch_plan(lengths, docs, bench_options(group), world, 0);
      ASSERT_EQ(plan.steps.size(), whole.steps.size()) << "P=" << world << " G=" << group;
      EXPECT_EQ(plan.stats.uneven_group_steps, 0u) << "P=" << world << " G=" << group;
      EXPECT_EQ(plan.stats.shard_group, group);
      for (uint64_t s = 0; s < plan.steps.size(); ++s) {
        const Step step = plan.steps[s].expand();
        // The same targets as the plan without groups on 2 ranks: each piece once, nothing lost.
        ASSERT_EQ(targets(step), targets(whole.steps[s].expand())) << "step " << s << " P=" << world << " G=" << group;
        ASSERT_EQ(step.target_tokens, whole.steps[s].target_tokens());
        // Equal micro-batch counts within each group (every rank of the group meets every slot).
        for (int g = 0; g < world / group; ++g)
          for (int i = 1; i < group; ++i)
            ASSERT_EQ(step.rank_batches[size_t(g * group + i)].size(), step.rank_batches[size_t(g * group)].size())
                << "step " << s << " group " << g << " P=" << world << " G=" << group;
        // The cut-piece rules: distinct ranks, the same local micro-batch index, inside one group.
        for (const CutPiece& cut : step_cuts(step))
          for (const CutPart& part : cut.parts) ASSERT_EQ(part.rank / group, cut.parts[0].rank / group);
      }
    }
  }
}

TEST(BalanceGroupSlots, SlotsAreMoreEvenThanTheWholeStepDivision) {
  const auto lengths = bench_corpus();
  const auto docs = all_documents(lengths.size());
  for (int world : {2, 4, 8}) {
    for (int group : {2, 4}) {
      if (group > world) continue;
      const EpochPlan whole = build_epoch_plan(lengths, docs, bench_options(0), world, 0);
      const EpochPlan slotted = build_epoch_plan(lengths, docs, bench_options(group), world, 0);
      const GroupSlotStats before = group_slot_stats(whole, group);
      std::printf("P=%d G=%d  whole-step division: slot imbalance p50 %.3f p95 %.3f, meeting-bound step %.3f p50 "
                  "%.3f p95 (step imbalance p95 %.3f) | slots: slot imbalance p50 %.3f p95 %.3f, meeting-bound "
                  "step %.3f p50 %.3f p95 (step imbalance p95 %.3f)\n",
                  world, group, before.slot_imbalance_p50, before.slot_imbalance_p95, before.slotted_imbalance_p50,
                  before.slotted_imbalance_p95, whole.stats.cost_imbalance_p95, slotted.stats.slot_imbalance_p50,
                  slotted.stats.slot_imbalance_p95, slotted.stats.slotted_imbalance_p50,
                  slotted.stats.slotted_imbalance_p95, slotted.stats.cost_imbalance_p95);
      EXPECT_LT(slotted.stats.slotted_imbalance_p95, before.slotted_imbalance_p95) << "P=" << world << " G=" << group;
      EXPECT_LE(slotted.stats.slot_imbalance_p95, before.slot_imbalance_p95) << "P=" << world << " G=" << group;
      EXPECT_LT(slotted.stats.slotted_imbalance_p95, 1.10) << "P=" << world << " G=" << group;
    }
  }
}

// Without cuts (data.cut_pieces = false): whole pieces only, slots still even.
TEST(BalanceGroupSlots, WholePiecesOnlyStillEvenTheSlots) {
  const auto lengths = bench_corpus();
  const auto docs = all_documents(lengths.size());
  for (int world : {2, 4, 8}) {
    for (int group : {2, 4}) {
      if (group > world) continue;
      PlanOptions whole_opts = bench_options(0), slot_opts = bench_options(group);
      whole_opts.cut_pieces = slot_opts.cut_pieces = false;
      const EpochPlan whole = build_epoch_plan(lengths, docs, whole_opts, world, 0);
      const EpochPlan slotted = build_epoch_plan(lengths, docs, slot_opts, world, 0);
      const GroupSlotStats before = group_slot_stats(whole, group);
      std::printf("no cuts P=%d G=%d  whole-step division: slot p95 %.3f, meeting-bound p95 %.3f, uneven %llu | slots: "
                  "slot p95 %.3f, meeting-bound p50 %.3f p95 %.3f, uneven %llu\n",
                  world, group, before.slot_imbalance_p95, before.slotted_imbalance_p95,
                  static_cast<unsigned long long>(before.uneven_group_steps), slotted.stats.slot_imbalance_p95,
                  slotted.stats.slotted_imbalance_p50, slotted.stats.slotted_imbalance_p95,
                  static_cast<unsigned long long>(slotted.stats.uneven_group_steps));
      EXPECT_EQ(slotted.stats.cuts, 0u);
      EXPECT_EQ(slotted.stats.uneven_group_steps, 0u) << "P=" << world << " G=" << group;
      EXPECT_LT(slotted.stats.slotted_imbalance_p95, before.slotted_imbalance_p95) << "P=" << world << " G=" << group;
      for (uint64_t s = 0; s < slotted.steps.size(); ++s)
        ASSERT_EQ(targets(slotted.steps[s].expand()), targets(whole.steps[s].expand())) << "step " << s;
    }
  }
}

TEST(BalanceGroupSlots, MixturesDivideBySlotsToo) {
  const auto lengths = bench_corpus();
  std::vector<MixtureSource> sources = {{"a", 0.7, {}}, {"b", 0.3, {}}};
  for (uint64_t d = 0; d < lengths.size(); ++d) sources[d % 3 == 0 ? 1 : 0].docs.push_back(d);
  MixturePlanner whole(lengths, sources, bench_options(0)), grouped(lengths, sources, bench_options(2));
  const EpochPlan a = whole.build(0, 4), b = grouped.build(0, 4);
  ASSERT_EQ(a.steps.size(), b.steps.size());
  EXPECT_EQ(b.stats.shard_group, 2);
  EXPECT_EQ(b.stats.uneven_group_steps, 0u);
  EXPECT_LT(b.stats.slotted_imbalance_p95, group_slot_stats(a, 2).slotted_imbalance_p95);
  for (uint64_t s = 0; s < a.steps.size(); ++s) {
    const Step step = b.steps[s].expand();
    ASSERT_EQ(targets(step), targets(a.steps[s].expand())) << "step " << s;
    for (int g = 0; g < 2; ++g)
      ASSERT_EQ(step.rank_batches[size_t(2 * g)].size(), step.rank_batches[size_t(2 * g + 1)].size()) << "step " << s;
  }
}

TEST(BalanceGroupSlots, OffKeepsThePlanAndBadGroupsAreRefused) {
  const auto lengths = bench_corpus();
  const auto docs = all_documents(lengths.size());
  const uint64_t base = plan_fingerprint(build_epoch_plan(lengths, docs, bench_options(0), 4, 0));
  EXPECT_EQ(plan_fingerprint(build_epoch_plan(lengths, docs, bench_options(1), 4, 0)), base);
  EXPECT_NE(plan_fingerprint(build_epoch_plan(lengths, docs, bench_options(2), 4, 0)), base);
  EXPECT_THROW(build_epoch_plan(lengths, docs, bench_options(3), 4, 0), Error);
  PlanOptions small = bench_options(2);
  small.max_tokens = 128;  // a 512-token piece does not fit a slot of 2 x 128
  EXPECT_THROW(build_epoch_plan(lengths, docs, small, 4, 0), Error);
}

}  // namespace
}  // namespace kilter::balance
