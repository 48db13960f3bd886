// The MPI K/V exchange (lib/comm/kv_exchange_mpi.h) on 2 and 3 ranks, driven by a fake backend
// that calls it exactly in kv_exchange.h's order for hand-made steps (pieces cut into 2 and 3
// parts, a middle part, two slots, a rank earlier for one piece and later for another in one
// slot). K/V values are known functions of (document, token, layer, column), so every prefix row
// is checked against what its owner computed; every later part writes known dK/dV into its
// prefix, so every owner checks the sum it gets. All values are small integers: sums are exact.
// Then the no-hang guarantee: a rank that never sends makes the others fail within
// comm.timeout_s with a message naming it, the layer, the step and the piece.
#include <gtest/gtest.h>

#include <climits>
#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "io/base/error.h"
#include "lib/comm/kv_exchange_mpi.h"
#include "lib/train/cut_schedule.h"
#include "tests/mpi/comm_test_main.h"
#include "tests/unit/cut_steps_testing.h"

namespace kilter::comm {
namespace {

constexpr int kLayers = 3;
constexpr int kC = 4;  // n_embd: rows of 3C = 12 floats, k|v = 8

// What the owner of token t of the piece (doc, piece_start) computes as q, k, v in `layer`.
float q_value(uint64_t doc, uint32_t t, int layer, int j) { return -float(doc * 1000 + t * 10 + layer) - 0.5f * j; }
float kv_value(uint64_t doc, uint32_t piece_start, uint32_t t, int layer, int j) {
  return float((doc * 131 + piece_start / 256 * 17 + t * 7 + uint32_t(layer) * 3 + uint32_t(j)) % 1009);
}
// What the later part at `offset` adds to the gradient of earlier token t's k|v column j.
float dkv_value(uint64_t doc, uint32_t t, uint32_t later_offset, int layer, int j) {
  return float((doc * 5 + t * 3 + later_offset * 11 + uint32_t(layer) * 13 + uint32_t(j)) % 257);
}

struct Ranks {
  int rank = 0, size = 1;
  MPI_Comm comm = MPI_COMM_NULL;
  Ranks() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);  // the exchange's own communicator
  }
  ~Ranks() { MPI_Comm_free(&comm); }
};

// The fake backend: one micro-batch's forward over all layers, then its backward from the last
// layer down, calling the exchange in kv_exchange.h's order. Returns the mismatches it found
// (and describes the first in *first).
long run_micro_batch(const balance::MicroBatch& mb, const std::vector<balance::CutPiece>& cuts,
                     model::KvExchange& ex, std::string* first) {
  long bad = 0;
  auto mismatch = [&](const std::string& what) {
    if (bad++ == 0) *first = what;
  };
  int64_t N = 0;
  for (const balance::Piece& p : mb.pieces) N += p.len;
  // The later parts' offsets of each (doc, piece_start), to know who adds to an owner's rows.
  std::map<std::pair<uint64_t, uint32_t>, std::vector<uint32_t>> part_offsets;
  for (const balance::CutPiece& c : cuts)
    for (const balance::CutPart& part : c.parts) part_offsets[{c.doc, c.piece_start}].push_back(part.offset);

  for (int layer = 0; layer < kLayers; ++layer) {
    std::vector<float> qkv(size_t(N * 3 * kC));
    int64_t row = 0;
    for (const balance::Piece& p : mb.pieces)
      for (uint32_t i = 0; i < p.len; ++i, ++row)
        for (int j = 0; j < kC; ++j) {
          qkv[size_t(row * 3 * kC + j)] = q_value(p.doc, p.offset + i, layer, j);
          qkv[size_t(row * 3 * kC + kC + j)] = kv_value(p.doc, p.piece_start(), p.offset + i, layer, j);
          qkv[size_t(row * 3 * kC + 2 * kC + j)] = kv_value(p.doc, p.piece_start(), p.offset + i, layer, kC + j);
        }
    ex.forward_send(layer, qkv.data());
    // The backend's copy of qkv may change once forward_send returned.
    std::fill(qkv.begin(), qkv.end(), -7.0f);
    ex.forward_wait(layer);
    for (size_t p = 0; p < mb.pieces.size(); ++p) {
      const balance::Piece& piece = mb.pieces[p];
      if (piece.offset == 0) continue;
      const float* prefix = ex.prefix_kv(layer, int(p));
      for (uint32_t t = 0; t < piece.offset; ++t)
        for (int j = 0; j < 2 * kC; ++j) {
          const float want = kv_value(piece.doc, piece.piece_start(), t, layer, j);
          if (prefix[t * 2 * kC + j] != want)
            mismatch("layer " + std::to_string(layer) + " doc " + std::to_string(piece.doc) + " prefix row " +
                     std::to_string(t) + " col " + std::to_string(j) + ": got " +
                     std::to_string(prefix[t * 2 * kC + j]) + ", want " + std::to_string(want));
        }
    }
  }
  for (int layer = kLayers - 1; layer >= 0; --layer) {
    for (size_t p = 0; p < mb.pieces.size(); ++p) {
      const balance::Piece& piece = mb.pieces[p];
      if (piece.offset == 0) continue;
      float* dkv = ex.prefix_dkv(layer, int(p));
      for (uint32_t t = 0; t < piece.offset; ++t)
        for (int j = 0; j < 2 * kC; ++j) {
          if (dkv[t * 2 * kC + j] != 0.0f) mismatch("prefix_dkv not zeroed");
          dkv[t * 2 * kC + j] += dkv_value(piece.doc, t, piece.offset, layer, j);
        }
    }
    ex.backward_send(layer);
    std::vector<float> dqkv(size_t(N * 3 * kC), 1.0f);
    ex.backward_wait_add(layer, dqkv.data());
    int64_t row = 0;
    for (const balance::Piece& p : mb.pieces) {
      const auto it = part_offsets.find({p.doc, p.piece_start()});
      for (uint32_t i = 0; i < p.len; ++i, ++row)
        for (int j = 0; j < 3 * kC; ++j) {
          float want = 1.0f;
          if (j >= kC && it != part_offsets.end())
            for (uint32_t later : it->second)
              if (later > p.offset) want += dkv_value(p.doc, p.offset + i, later, layer, j - kC);
          if (dqkv[size_t(row * 3 * kC + j)] != want)
            mismatch("layer " + std::to_string(layer) + " doc " + std::to_string(p.doc) + " token " +
                     std::to_string(p.offset + i) + " dqkv col " + std::to_string(j) + ": got " +
                     std::to_string(dqkv[size_t(row * 3 * kC + j)]) + ", want " + std::to_string(want));
        }
    }
  }
  return bad;
}

// Runs every rank's micro-batches of `step` in order, an exchange for each that holds a part.
long run_step(const balance::Step& step, const Ranks& ranks, std::string* first, double* waited) {
  const train::StepCuts cuts = train::StepCuts::of(step);
  KvExchangeOptions opts;
  opts.n_layer = kLayers;
  opts.rows = {3 * kC, kC, 2 * kC};  // GPT-2 rows: q|k|v, K at column C
  opts.timeout_s = 60;
  long bad = 0;
  const std::vector<uint32_t>& mine = step.rank_batches[size_t(ranks.rank)];
  for (uint32_t slot = 0; slot < mine.size(); ++slot) {
    const balance::MicroBatch& mb = step.micro_batches[mine[slot]];
    KvSchedule schedule = cuts.schedule(mb, ranks.rank, slot, 5);
    if (schedule.empty()) continue;
    MpiKvExchange ex(ranks.comm, std::move(schedule), opts);
    bad += run_micro_batch(mb, cuts.cuts(), ex, first);
    ex.finish();
    *waited += ex.wait_seconds();
  }
  return bad;
}

TEST(KvExchange, EveryPrefixRowArrivesAndEveryGradientIsSummedAtItsOwner) {
  Ranks ranks;
  if (ranks.size != 2 && ranks.size != 3) GTEST_SKIP() << "runs on 2 or 3 ranks";
  const balance::Step step = ranks.size == 3 ? kilter::testing::three_rank_step() : kilter::testing::two_rank_step();
  std::string first;
  double waited = 0;
  const long bad = run_step(step, ranks, &first, &waited);
  EXPECT_EQ(bad, 0) << "rank " << ranks.rank << ": " << first;
  EXPECT_EQ(testing::global_failures(bad), 0);
}

// The same step twice in a row and the slots interleaved with uneven work: messages of one slot
// never meet another's.
TEST(KvExchange, RepeatedStepsStayApart) {
  Ranks ranks;
  if (ranks.size != 2 && ranks.size != 3) GTEST_SKIP() << "runs on 2 or 3 ranks";
  const balance::Step step = ranks.size == 3 ? kilter::testing::three_rank_step() : kilter::testing::two_rank_step();
  long bad = 0;
  std::string first;
  double waited = 0;
  for (int repeat = 0; repeat < 4; ++repeat) bad += run_step(step, ranks, &first, &waited);
  EXPECT_EQ(bad, 0) << "rank " << ranks.rank << ": " << first;
}

// Random steps (the same on every rank from one seed): pieces cut into 1..P parts over random
// ranks, several cut pieces between the same ranks in one slot, three slots, uncut pieces mixed in
// and the batch order shuffled.
balance::Step random_step(int world, uint32_t seed) {
  std::mt19937 rng(seed);
  auto pick = [&](int n) { return int(rng() % uint32_t(n)); };
  const int slots = 3;
  std::vector<std::vector<std::vector<balance::Piece>>> ranks(static_cast<size_t>(world),
                                                               std::vector<std::vector<balance::Piece>>(slots));
  uint64_t doc = 100;
  for (int slot = 0; slot < slots; ++slot) {
    for (int r = 0; r < world; ++r)
      ranks[size_t(r)][size_t(slot)].push_back(kilter::testing::part(doc++, 0, 0, 1 + uint32_t(pick(5))));
    const int pieces = 1 + pick(4);
    for (int k = 0; k < pieces; ++k, ++doc) {
      std::vector<int> order(static_cast<size_t>(world));
      for (int r = 0; r < world; ++r) order[size_t(r)] = r;
      std::shuffle(order.begin(), order.end(), rng);
      const int parts = 1 + pick(world);
      uint32_t offset = 0;
      const uint32_t piece_start = uint32_t(pick(4)) * 256;
      for (int i = 0; i < parts; ++i) {
        const uint32_t len = 1 + uint32_t(pick(6));
        ranks[size_t(order[size_t(i)])][size_t(slot)].push_back(kilter::testing::part(doc, piece_start, offset, len));
        offset += len;
      }
    }
    for (auto& rank_slots : ranks) std::shuffle(rank_slots[size_t(slot)].begin(), rank_slots[size_t(slot)].end(), rng);
  }
  return kilter::testing::make_step(ranks);
}

TEST(KvExchange, RandomStepsDeliverEveryRowAndSum) {
  Ranks ranks;
  if (ranks.size < 2) GTEST_SKIP() << "needs 2 ranks";
  long bad = 0;
  std::string first;
  double waited = 0;
  int cut = 0;
  for (uint32_t seed = 1; seed <= 12; ++seed) {
    const balance::Step step = random_step(ranks.size, seed);
    cut += int(train::StepCuts::of(step).cuts().size());
    bad += run_step(step, ranks, &first, &waited);
  }
  EXPECT_GT(cut, 12);  // the generator really cuts
  EXPECT_EQ(bad, 0) << "rank " << ranks.rank << ": " << first;
  EXPECT_EQ(testing::global_failures(bad), 0);
}

// Rank 0 holds the earlier part of a cut piece and never sends: rank 1 fails within the timeout
// with a message naming rank 0, the layer, the step and the piece.
TEST(KvExchange, MissingForwardSendFailsNamingTheRank) {
  Ranks ranks;
  if (ranks.size < 2) GTEST_SKIP() << "needs 2 ranks";
  const balance::Step step = kilter::testing::make_step({{{kilter::testing::part(7, 512, 0, 6)}}, {{kilter::testing::part(7, 512, 6, 3)}}});
  const train::StepCuts cuts = train::StepCuts::of(step);
  KvExchangeOptions opts;
  opts.n_layer = kLayers;
  opts.rows = {3 * kC, kC, 2 * kC};  // GPT-2 rows: q|k|v, K at column C
  opts.timeout_s = 0.5;
  std::string message;
  if (ranks.rank == 1) {
    const balance::MicroBatch& mb = step.micro_batches[step.rank_batches[1][0]];
    MpiKvExchange ex(ranks.comm, cuts.schedule(mb, 1, 0, 42), opts);
    std::vector<float> qkv(size_t(3 * 3 * kC), 0.0f);
    ex.forward_send(0, qkv.data());
    try {
      ex.forward_wait(0);
    } catch (const Error& e) {
      message = e.what();
    }
    EXPECT_NE(message.find("rank 0"), std::string::npos) << message;
    EXPECT_NE(message.find("step 42"), std::string::npos) << message;
    EXPECT_NE(message.find("layer 0"), std::string::npos) << message;
    EXPECT_NE(message.find("document 7, tokens 518-520"), std::string::npos) << message;
    EXPECT_NE(message.find("document 7, tokens 512-517, needed by"), std::string::npos) << message;
    EXPECT_NE(message.find("comm.timeout_s"), std::string::npos) << message;
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// Rank 1 holds the later part, takes the forward K/V and never sends the dK/dV back: rank 0,
// the owner, fails within the timeout naming rank 1.
TEST(KvExchange, MissingBackwardSendFailsNamingTheRank) {
  Ranks ranks;
  if (ranks.size < 2) GTEST_SKIP() << "needs 2 ranks";
  const balance::Step step = kilter::testing::make_step({{{kilter::testing::part(7, 0, 0, 6)}}, {{kilter::testing::part(7, 0, 6, 3)}}});
  const train::StepCuts cuts = train::StepCuts::of(step);
  KvExchangeOptions opts;
  opts.n_layer = 1;
  opts.rows = {3 * kC, kC, 2 * kC};  // GPT-2 rows: q|k|v, K at column C
  opts.timeout_s = 0.5;
  if (ranks.rank <= 1) {
    const balance::MicroBatch& mb = step.micro_batches[step.rank_batches[size_t(ranks.rank)][0]];
    MpiKvExchange ex(ranks.comm, cuts.schedule(mb, ranks.rank, 0, 9), opts);
    std::vector<float> qkv(size_t(mb.target_tokens * 3 * kC), 0.0f);
    ex.forward_send(0, qkv.data());
    ex.forward_wait(0);
    if (ranks.rank == 0) {
      ex.backward_send(0);
      std::string message;
      try {
        ex.backward_wait_add(0, qkv.data());
      } catch (const Error& e) {
        message = e.what();
      }
      EXPECT_NE(message.find("rank 1"), std::string::npos) << message;
      EXPECT_NE(message.find("dK/dV"), std::string::npos) << message;
      EXPECT_NE(message.find("step 9"), std::string::npos) << message;
      EXPECT_NE(message.find("document 7, tokens 0-5"), std::string::npos) << message;
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(KvExchange, TagsStayUnderTheUpperBoundAndApart) {
  Ranks ranks;
  int* tag_ub = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(ranks.comm, MPI_TAG_UB, &tag_ub, &flag);
  ASSERT_TRUE(flag);
  std::map<int, int> seen;
  for (uint32_t slot = 0; slot < 3; ++slot)
    for (int layer = 0; layer < 48; ++layer)
      for (bool backward : {false, true}) {
        const int tag = kv_exchange_tag(ranks.comm, slot, layer, backward, 48);
        EXPECT_GE(tag, 0);
        EXPECT_LE(tag, *tag_ub);
        seen[tag] += 1;
      }
  EXPECT_EQ(seen.size(), 3u * 48 * 2);
  EXPECT_THROW(kv_exchange_tag(ranks.comm, 0, 0, false, INT_MAX), Error);
}

}  // namespace
}  // namespace kilter::comm
