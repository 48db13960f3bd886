// PlanCache::replan (lib/train/plan_cursor.h), the cut-cost check's re-plan: the steps before the
// switch are the first plan's, the steps from it on the new plan's, every step holds the same
// pieces either way (cuts decide who computes which tokens, never which tokens a step holds), the
// prefetch cursor reads what the trainer will run, and a later epoch is planned with the new
// charge from its start.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <thread>
#include <tuple>
#include <vector>

#include "io/dataset.h"
#include "lib/balance/plan.h"
#include "lib/train/plan_cursor.h"

namespace kilter::train {
namespace {

// (doc, start, len) of every piece of a step, sorted: its tokens, whoever computes them.
std::vector<std::tuple<uint32_t, uint32_t, uint32_t>> tokens_of(const balance::StepView& step) {
  std::vector<std::tuple<uint32_t, uint32_t, uint32_t>> out;
  balance::MicroBatch mb;
  for (uint32_t id = 0; id < step.micro_batch_count(); ++id) {
    step.micro_batch(id, mb);
    for (const balance::Piece& p : mb.pieces) out.emplace_back(p.doc, p.start, p.len);
  }
  std::sort(out.begin(), out.end());
  // Parts of one piece next to each other: merge them into the piece.
  std::vector<std::tuple<uint32_t, uint32_t, uint32_t>> merged;
  for (const auto& [doc, start, len] : out) {
    if (!merged.empty() && std::get<0>(merged.back()) == doc &&
        std::get<1>(merged.back()) + std::get<2>(merged.back()) == start)
      std::get<2>(merged.back()) += len;
    else
      merged.emplace_back(doc, start, len);
  }
  return merged;
}

uint64_t cuts_of(const balance::StepView& step) { return balance::step_cuts(step).size(); }

struct Fixture {
  io::DatasetIndex index;
  balance::PlanOptions opts;
  int world = 4;
  Fixture() {
    index.dir = "in-memory";
    // Skewed lengths around one context, one context per rank per step: the plan cuts.
    for (uint32_t i = 0; i < 400; ++i) index.doc_lengths.push_back(20 + (i * 2654435761u) % 300);
    opts.context = 64;
    opts.max_tokens = 128;
    opts.tokens_per_step = 256;
    opts.cost.t = 0.001;
  }
};

TEST(TrainPlanCache, ReplanKeepsEarlierStepsAndEveryStepsTokens) {
  Fixture f;
  PlanCache reference(f.index, balance::all_documents(f.index.num_docs()), f.opts, f.world);
  PlanCache plans(f.index, balance::all_documents(f.index.num_docs()), f.opts, f.world);
  const uint64_t steps = plans.get(0).steps.size();
  ASSERT_GT(steps, 20u);
  uint64_t cuts_before = 0;
  for (uint64_t s = 0; s < steps; ++s) cuts_before += cuts_of(reference.step({0, s}));
  ASSERT_GT(cuts_before, 0u) << "the plan does not cut: the test proves nothing";

  const balance::PlanPosition from{0, 7};
  plans.replan(from, 1e6);  // so dear that no cut for balance pays
  EXPECT_DOUBLE_EQ(plans.cost({0, 6}).t, reference.cost({0, 6}).t);
  EXPECT_DOUBLE_EQ(plans.cost({0, 7}).t, 1e6);
  uint64_t cuts_after = 0;
  for (uint64_t s = 0; s < steps; ++s) {
    const balance::StepView mine = plans.step({0, s}), theirs = reference.step({0, s});
    EXPECT_EQ(tokens_of(mine), tokens_of(theirs)) << "step " << s << " holds other tokens after the re-plan";
    EXPECT_EQ(mine.target_tokens(), theirs.target_tokens());
    if (s < from.step_in_epoch) {
      EXPECT_EQ(cuts_of(mine), cuts_of(theirs)) << "step " << s << " before the switch changed";
      for (int r = 0; r < f.world; ++r) EXPECT_EQ(mine.rank_micro_batches(r), theirs.rank_micro_batches(r));
    } else {
      cuts_after += cuts_of(mine);
    }
  }
  EXPECT_EQ(cuts_after, 0u) << "a charge of 1e6 per earlier token still cut";
  // The next epoch is planned with the new charge from its start.
  EXPECT_DOUBLE_EQ(plans.cost({1, 0}).t, 1e6);
  EXPECT_EQ(tokens_of(plans.step({1, 3})), tokens_of(reference.step({1, 3})));
}

TEST(TrainPlanCache, CursorFollowsTheSwitch) {
  Fixture f;
  PlanCache plans(f.index, balance::all_documents(f.index.num_docs()), f.opts, f.world);
  const int rank = 2;
  PrefetchCursor cursor(plans, rank, {0, 0}, 30);
  std::vector<io::PieceRequest> got, out;
  // Feed up to step 5 (part of it), then re-plan from step 9, as the trainer does: after the
  // furthest step any reader was fed from.
  while (cursor.steps_left() > 30 - 5 && cursor.next(out)) got.insert(got.end(), out.begin(), out.end());
  plans.replan({0, 9}, 1e6);
  while (cursor.next(out)) got.insert(got.end(), out.begin(), out.end());
  EXPECT_EQ(cursor.steps_left(), 0);
  // What the trainer will run, step by step, from the cache after the switch.
  std::vector<io::PieceRequest> expected;
  balance::MicroBatch mb;
  for (uint64_t s = 0; s < 30; ++s) {
    const balance::StepView step = plans.step({0, s});
    const auto [first, end] = step.rank_micro_batches(rank);
    for (uint32_t id = first; id < end; ++id) {
      step.micro_batch(id, mb);
      piece_requests(mb, out);
      expected.insert(expected.end(), out.begin(), out.end());
    }
  }
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].doc, expected[i].doc) << i;
    EXPECT_EQ(got[i].start, expected[i].start) << i;
    EXPECT_EQ(got[i].len, expected[i].len) << i;
  }
}

// The in-run calibration's re-plan (issue 39): built on a thread of its own, the same plan as one
// built in place; put in force from a step on; a second re-plan in the same epoch keeps the steps
// of the first that were fed.
TEST(TrainPlanCache, BackgroundBuildSwitchesLikeAReplan) {
  Fixture f;
  PlanCache in_place(f.index, balance::all_documents(f.index.num_docs()), f.opts, f.world);
  PlanCache plans(f.index, balance::all_documents(f.index.num_docs()), f.opts, f.world);
  PlanCache reference(f.index, balance::all_documents(f.index.num_docs()), f.opts, f.world);
  const uint64_t steps = plans.get(0).steps.size();
  in_place.get(0);
  reference.get(0);
  PlanModel slow = plans.model();
  slow.rank_speed = {1.0, 1.5, 1.0, 1.0};
  plans.start_build(0, slow);
  EXPECT_TRUE(plans.build_pending());
  while (!plans.build_ready()) std::this_thread::yield();
  ASSERT_TRUE(plans.switch_to({0, 5}));
  EXPECT_FALSE(plans.build_pending());
  in_place.replan({0, 5}, slow);
  for (uint64_t s = 0; s < steps; ++s) {
    const balance::StepView a = plans.step({0, s}), b = in_place.step({0, s});
    for (int r = 0; r < f.world; ++r) EXPECT_EQ(a.rank_micro_batches(r), b.rank_micro_batches(r)) << "step " << s;
    EXPECT_EQ(tokens_of(a), tokens_of(reference.step({0, s})));
  }
  EXPECT_EQ(plans.rank_speed({0, 4}), std::vector<double>{});
  EXPECT_EQ(plans.rank_speed({0, 5}), slow.rank_speed);
  EXPECT_EQ(plans.rank_speed({1, 0}), slow.rank_speed) << "the next epoch is planned with the new model";
  // A second re-plan later in the epoch: the steps of the first stay as they were before it.
  PlanModel dearer = slow;
  dearer.cost.t = 1e6;
  plans.start_build(0, dearer);
  while (!plans.build_ready()) std::this_thread::yield();
  ASSERT_TRUE(plans.switch_to({0, 12}));
  for (uint64_t s = 5; s < 12; ++s)
    for (int r = 0; r < f.world; ++r)
      EXPECT_EQ(plans.step({0, s}).rank_micro_batches(r), in_place.step({0, s}).rank_micro_batches(r)) << "step " << s;
  EXPECT_DOUBLE_EQ(plans.cost({0, 11}).t, in_place.cost({0, 11}).t);
  EXPECT_DOUBLE_EQ(plans.cost({0, 12}).t, 1e6);
  // Built for epoch 0 while the readers crossed into epoch 1 past its first step: not switched.
  plans.start_build(0, slow);
  while (!plans.build_ready()) std::this_thread::yield();
  EXPECT_FALSE(plans.switch_to({1, 2}));
  plans.drop_build();
  EXPECT_FALSE(plans.build_pending());
}

}  // namespace
}  // namespace kilter::train
