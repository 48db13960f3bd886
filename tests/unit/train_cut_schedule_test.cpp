// The K/V exchange schedule (lib/train/cut_schedule.h): for hand-made steps with pieces cut into
// 2 and 3 parts, what each micro-batch sends to and receives from which rank, row by row, and
// that both ends of every pair list the same rows in the same order.
#include <gtest/gtest.h>

#include <map>
#include <tuple>
#include <vector>

#include "io/base/error.h"
#include "lib/train/cut_schedule.h"
#include "tests/unit/cut_steps_testing.h"

namespace kilter::train {
namespace {

using testing::part;

comm::KvSchedule schedule_of(const balance::Step& step, const StepCuts& cuts, int rank, uint32_t slot) {
  return cuts.schedule(step.micro_batches[step.rank_batches[size_t(rank)][slot]], rank, slot, 3);
}

std::vector<std::tuple<int32_t, int32_t, int32_t>> runs(const comm::KvPeer& peer) {
  std::vector<std::tuple<int32_t, int32_t, int32_t>> out;
  for (const comm::KvRun& r : peer.runs) out.emplace_back(r.piece, r.row, r.rows);
  return out;
}

TEST(TrainCutSchedule, ThreeRanksEarlierLaterAndMiddleParts) {
  const balance::Step step = testing::three_rank_step();
  const StepCuts cuts = StepCuts::of(step);
  ASSERT_EQ(cuts.cuts().size(), 3u);  // A, B, C in (doc, piece_start) order

  // Rank 0, slot 0: pieces A[0,5) (batch rows 0-4), doc 9 (rows 5-7), B[4,7) (rows 8-10).
  const comm::KvSchedule r0 = schedule_of(step, cuts, 0, 0);
  EXPECT_EQ(r0.slot, 0u);
  EXPECT_EQ(r0.step, 3);
  // A's rows go to ranks 1 and 2, B's to rank 2 (its later part); cut order A then B.
  ASSERT_EQ(r0.later.size(), 2u);
  EXPECT_EQ(r0.later[0].rank, 1);
  EXPECT_EQ(runs(r0.later[0]), (std::vector<std::tuple<int32_t, int32_t, int32_t>>{{0, 0, 5}}));
  EXPECT_EQ(r0.later[1].rank, 2);
  EXPECT_EQ(runs(r0.later[1]), (std::vector<std::tuple<int32_t, int32_t, int32_t>>{{0, 0, 5}, {2, 8, 3}}));
  // B's prefix [0, 4) comes from rank 1.
  ASSERT_EQ(r0.earlier.size(), 1u);
  EXPECT_EQ(r0.earlier[0].rank, 1);
  EXPECT_EQ(runs(r0.earlier[0]), (std::vector<std::tuple<int32_t, int32_t, int32_t>>{{2, 0, 4}}));
  EXPECT_EQ(r0.kv_tokens(), 4);
  EXPECT_EQ(r0.sent_rows(), 5 + 5 + 3);
  EXPECT_TRUE(r0.pieces[0].cut);
  EXPECT_FALSE(r0.pieces[1].cut);
  EXPECT_EQ(r0.pieces[2].offset, 4u);
  EXPECT_EQ(r0.pieces[2].piece_start, 1024u);

  // Rank 1, slot 0: A[5,9) (rows 0-3, the middle part), B[0,4) (rows 4-7).
  const comm::KvSchedule r1 = schedule_of(step, cuts, 1, 0);
  ASSERT_EQ(r1.later.size(), 2u);
  EXPECT_EQ(r1.later[0].rank, 0);  // B's later part
  EXPECT_EQ(runs(r1.later[0]), (std::vector<std::tuple<int32_t, int32_t, int32_t>>{{1, 4, 4}}));
  EXPECT_EQ(r1.later[1].rank, 2);  // A and B
  EXPECT_EQ(runs(r1.later[1]), (std::vector<std::tuple<int32_t, int32_t, int32_t>>{{0, 0, 4}, {1, 4, 4}}));
  ASSERT_EQ(r1.earlier.size(), 1u);
  EXPECT_EQ(r1.earlier[0].rank, 0);
  EXPECT_EQ(runs(r1.earlier[0]), (std::vector<std::tuple<int32_t, int32_t, int32_t>>{{0, 0, 5}}));
  EXPECT_EQ(r1.kv_tokens(), 5);

  // Rank 2, slot 0: B[7,12) first in its batch, then A[9,11): prefixes from two ranks each.
  const comm::KvSchedule r2 = schedule_of(step, cuts, 2, 0);
  EXPECT_TRUE(r2.later.empty());
  ASSERT_EQ(r2.earlier.size(), 2u);
  EXPECT_EQ(r2.earlier[0].rank, 0);
  EXPECT_EQ(runs(r2.earlier[0]), (std::vector<std::tuple<int32_t, int32_t, int32_t>>{{1, 0, 5}, {0, 4, 3}}));
  EXPECT_EQ(r2.earlier[1].rank, 1);
  EXPECT_EQ(runs(r2.earlier[1]), (std::vector<std::tuple<int32_t, int32_t, int32_t>>{{1, 5, 4}, {0, 0, 4}}));
  EXPECT_EQ(r2.kv_tokens(), 7 + 9);
  EXPECT_EQ(r2.bytes_per_step(2, 2 * 8), (0 + 16) * 2 * 2 * 8 * 4 * 2);

  // Slot 1: C between ranks 0 and 1; rank 2's slot 1 has no cut piece.
  const comm::KvSchedule c0 = schedule_of(step, cuts, 0, 1);
  ASSERT_EQ(c0.later.size(), 1u);
  EXPECT_EQ(c0.later[0].rank, 1);
  EXPECT_TRUE(c0.earlier.empty());
  const comm::KvSchedule c1 = schedule_of(step, cuts, 1, 1);
  ASSERT_EQ(c1.earlier.size(), 1u);
  EXPECT_EQ(runs(c1.earlier[0]), (std::vector<std::tuple<int32_t, int32_t, int32_t>>{{1, 0, 6}}));
  EXPECT_TRUE(schedule_of(step, cuts, 2, 1).empty());
}

// Every message's two ends agree: what rank a lists for later peer b, in order, are the rows of
// the same pieces, of the same lengths, that b lists for earlier peer a.
TEST(TrainCutSchedule, BothEndsOfEveryMessageAgree) {
  for (const balance::Step& step : {testing::three_rank_step(), testing::two_rank_step()}) {
    const StepCuts cuts = StepCuts::of(step);
    const int ranks = int(step.rank_batches.size());
    for (uint32_t slot = 0; slot < 2; ++slot) {
      std::vector<comm::KvSchedule> s;
      for (int r = 0; r < ranks; ++r) s.push_back(schedule_of(step, cuts, r, slot));
      int messages = 0;
      for (int a = 0; a < ranks; ++a)
        for (const comm::KvPeer& to : s[size_t(a)].later) {
          const comm::KvPeer* back = nullptr;
          for (const comm::KvPeer& from : s[size_t(to.rank)].earlier)
            if (from.rank == a) back = &from;
          ASSERT_NE(back, nullptr) << "rank " << a << " sends to " << to.rank << " which expects nothing";
          ASSERT_EQ(to.runs.size(), back->runs.size());
          for (size_t k = 0; k < to.runs.size(); ++k) {
            const comm::KvPieceInfo& sent = s[size_t(a)].pieces[size_t(to.runs[k].piece)];
            const comm::KvPieceInfo& into = s[size_t(to.rank)].pieces[size_t(back->runs[k].piece)];
            EXPECT_EQ(sent.doc, into.doc);
            EXPECT_EQ(to.runs[k].rows, back->runs[k].rows);
            EXPECT_EQ(uint32_t(back->runs[k].row), sent.offset);  // the sender's rows sit at its offset
            EXPECT_LT(sent.offset, into.offset);
          }
          ++messages;
        }
      int expected = 0;
      for (int r = 0; r < ranks; ++r) expected += int(s[size_t(r)].earlier.size());
      EXPECT_EQ(messages, expected);
      EXPECT_GT(messages, 0);
    }
  }
}

TEST(TrainCutSchedule, UncutStepHasNoExchange) {
  const balance::Step step = testing::make_step({{{part(1, 0, 0, 5)}}, {{part(2, 0, 0, 7), part(3, 0, 0, 2)}}});
  const StepCuts cuts = StepCuts::of(step);
  EXPECT_TRUE(cuts.empty());
  EXPECT_TRUE(schedule_of(step, cuts, 1, 0).empty());
}

TEST(TrainCutSchedule, MicroBatchThatDisagreesWithTheCutsIsRefused) {
  const balance::Step step = testing::two_rank_step();
  const StepCuts cuts = StepCuts::of(step);
  // Rank 0's slot 0 asked for as if it were rank 1's, or slot 1's.
  const balance::MicroBatch& mb = step.micro_batches[step.rank_batches[0][0]];
  EXPECT_THROW(cuts.schedule(mb, 1, 0, 0), Error);
  EXPECT_THROW(cuts.schedule(mb, 0, 1, 0), Error);
  // A part in a padded (naive) micro-batch.
  balance::MicroBatch padded = mb;
  padded.padded_len = 5;
  EXPECT_THROW(cuts.schedule(padded, 0, 0, 0), Error);
}

TEST(TrainCutSchedule, DescribesPiecesInDocumentTokens) {
  const balance::Step step = testing::two_rank_step();
  const comm::KvSchedule s = schedule_of(step, StepCuts::of(step), 0, 0);
  EXPECT_EQ(s.describe_piece(2), "document 2, tokens 1028-1030 (part at offset 4 of the piece at token 1024)");
}

}  // namespace
}  // namespace kilter::train
