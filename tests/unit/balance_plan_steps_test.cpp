// Unit tests of the plan's compact step storage (PlanSteps, StepView in lib/balance/plan.h):
// pieces round-trip through their 8-byte form, micro-batches and rank ranges read back as built,
// the limits are checked with errors, and the storage costs what docs/plan.md says.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "io/base/error.h"
#include "lib/balance/plan.h"
#include "lib/balance/synthetic_lengths.h"

namespace kilter::balance {
namespace {

CostModel unit_cost() {
  CostModel cost;
  cost.a = 1;
  cost.b = 0.01;
  cost.c = 5;
  return cost;
}

TEST(BalancePlanSteps, PiecesMicroBatchesAndRanksReadBackAsBuilt) {
  const uint32_t context = 100;
  const uint64_t top_doc = std::numeric_limits<uint32_t>::max();
  // Rank 0: two micro-batches; rank 1 idle; rank 2: one. Pieces of length 1 and of a full context,
  // at the first and at a late context of long documents.
  const std::vector<std::vector<std::vector<Piece>>> ranks = {
      {{{7, 0, 100}, {3, 4000000000u, 1}}, {{top_doc, 300, 57}}},
      {},
      {{{0, 0, 1}, {5, 4294967200u, 96}}},
  };
  for (bool padded : {false, true}) {
    PlanSteps steps(context, 3, padded, unit_cost());
    uint64_t tokens = 0;
    for (const auto& rank : ranks) {
      for (const auto& mb : rank) {
        for (const Piece& p : mb) steps.add_piece(p), tokens += p.len;
        steps.end_micro_batch();
      }
      steps.end_rank();
    }
    steps.end_step(tokens);
    ASSERT_EQ(steps.size(), 1u);
    const StepView step = steps[0];
    EXPECT_EQ(step.target_tokens(), tokens);
    EXPECT_EQ(step.micro_batch_count(), 3u);
    EXPECT_EQ(step.rank_micro_batches(0), std::make_pair(0u, 2u));
    EXPECT_EQ(step.rank_micro_batches(1), std::make_pair(2u, 2u));
    EXPECT_EQ(step.rank_micro_batches(2), std::make_pair(2u, 3u));
    uint32_t id = 0;
    for (const auto& rank : ranks) {
      for (const auto& built : rank) {
        const MicroBatch mb = step.micro_batch(id++);
        ASSERT_EQ(mb.pieces.size(), built.size());
        uint32_t longest = 0;
        uint64_t mb_tokens = 0;
        for (size_t i = 0; i < built.size(); ++i) {
          EXPECT_EQ(mb.pieces[i].doc, built[i].doc);
          EXPECT_EQ(mb.pieces[i].start, built[i].start);
          EXPECT_EQ(mb.pieces[i].len, built[i].len);
          longest = std::max(longest, built[i].len);
          mb_tokens += built[i].len;
        }
        EXPECT_EQ(mb.target_tokens, mb_tokens);
        EXPECT_EQ(mb.padded_len, padded ? longest : 0u);
        EXPECT_DOUBLE_EQ(mb.cost, unit_cost()(mb));
      }
    }
    EXPECT_THROW(step.micro_batch(3), Error);
    EXPECT_THROW(step.rank_micro_batches(3), Error);
  }
}

TEST(BalancePlanSteps, RefusesWhatItCannotStore) {
  PlanSteps steps(128, 2);
  EXPECT_THROW(steps.add_piece(Piece{uint64_t(1) << 32, 0, 10}), Error) << "a document id beyond 32 bits";
  EXPECT_THROW(steps.add_piece(Piece{1, 5, 10}), Error) << "a piece not starting at a multiple of the context";
  EXPECT_THROW(steps.add_piece(Piece{1, 0, 129}), Error) << "longer than the context";
  EXPECT_THROW(steps.add_piece(Piece{1, 0, 0}), Error) << "empty";
  EXPECT_THROW(steps.end_micro_batch(), Error) << "an empty micro-batch";
  steps.end_rank();
  EXPECT_THROW(steps.end_step(0), Error) << "a step with fewer ranks than the world size";
  steps.end_rank();
  EXPECT_THROW(steps.end_rank(), Error) << "more ranks than the world size";
  EXPECT_THROW(PlanSteps(0, 2), Error);
}

TEST(BalancePlanSteps, APlanHoldsEightBytesPerPieceAndFourPerMicroBatchAndRank) {
  const auto lengths = synthetic_lengths(parse_length_spec("lognormal:5,1.2,3000"), 20000, 3);
  PlanOptions o;
  o.context = 512;
  o.max_tokens = 2048;
  o.tokens_per_step = 65536;
  for (const std::string sampler : {"balanced", "naive"}) {
    o.sampler = sampler;
    for (int world : {1, 8, 64}) {
      const EpochPlan plan = build_epoch_plan(lengths, all_documents(lengths.size()), o, world, 0);
      uint64_t pieces = 0, later_parts = 0;
      for (uint64_t s = 0; s < plan.steps.size(); ++s)
        for (uint32_t m = 0; m < plan.steps[s].micro_batch_count(); ++m)
          for (const Piece& p : plan.steps[s].micro_batch(m).pieces) ++pieces, later_parts += p.offset > 0;
      const uint64_t steps = plan.steps.size();
      // Later parts of cut pieces: 8 bytes each in the side table, plus its end per step.
      EXPECT_EQ(plan.steps.heap_bytes(), 8 * pieces + 4 * plan.stats.micro_batches + 4 * steps * uint64_t(world) +
                                             4 * 8 * steps + 8 * later_parts)
          << sampler << " on " << world << " ranks: every array at its size";
    }
  }
}

}  // namespace
}  // namespace kilter::balance
