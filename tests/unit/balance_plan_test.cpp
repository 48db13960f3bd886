// Unit tests of the balanced batch plan and the naive baseline (lib/balance/plan.h): coverage of
// every piece, equal steps per rank, world-size independent step piece sets, determinism, packed
// micro-batches within the budget, tails, idle ranks, resume positions, bad options.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <tuple>

#include "io/base/error.h"
#include "lib/balance/plan.h"
#include "lib/balance/rng.h"
#include "lib/balance/synthetic_lengths.h"

namespace kilter::balance {
namespace {

using PieceKey = std::tuple<uint64_t, uint32_t, uint32_t>;
PieceKey key_of(const Piece& p) { return {p.doc, p.start, p.len}; }

std::vector<uint32_t> lognormal_corpus(uint64_t docs, double mu, double sigma, uint32_t max, uint64_t seed = 7) {
  LengthSpec spec = parse_length_spec("lognormal:" + std::to_string(mu) + "," + std::to_string(sigma) + "," +
                                      std::to_string(max));
  return synthetic_lengths(spec, docs, seed);
}

PlanOptions small_options() {
  PlanOptions o;
  o.context = 128;
  o.max_tokens = 512;
  o.tokens_per_step = 8192;
  o.seed = 99;
  return o;
}

// The plan's steps as plain vectors.
std::vector<Step> expanded(const EpochPlan& plan) {
  std::vector<Step> steps;
  for (uint64_t s = 0; s < plan.steps.size(); ++s) steps.push_back(plan.steps[s].expand());
  return steps;
}

// The pieces of one step, sorted: what the step trains on, whatever the division (the parts of a
// cut piece joined again: cuts decide who computes which tokens, never which tokens a step holds).
std::vector<PieceKey> step_pieces(const Step& step) {
  std::map<std::pair<uint64_t, uint32_t>, uint32_t> tokens;  // (doc, piece start) -> tokens
  for (const MicroBatch& mb : step.micro_batches)
    for (const Piece& p : mb.pieces) tokens[{p.doc, p.piece_start()}] += p.len;
  std::vector<PieceKey> keys;
  for (const auto& [key, len] : tokens) keys.push_back(key_of(Piece{key.first, key.second, len}));
  std::sort(keys.begin(), keys.end());
  return keys;
}

// Steps are equal in content: the same piece sets and target tokens, step by step.
void expect_same_step_pieces(const EpochPlan& x, const EpochPlan& y) {
  ASSERT_EQ(x.steps.size(), y.steps.size());
  for (size_t s = 0; s < x.steps.size(); ++s) {
    EXPECT_EQ(x.steps[s].target_tokens(), y.steps[s].target_tokens()) << "step " << s;
    EXPECT_EQ(step_pieces(x.steps[s].expand()), step_pieces(y.steps[s].expand())) << "step " << s;
  }
}

TEST(BalancePlan, CutDocumentsCoversEveryTokenOnce) {
  const std::vector<uint32_t> lengths = {0, 1, 127, 128, 129, 300, 256};
  uint64_t empty = 0;
  const auto pieces = cut_documents(lengths, all_documents(lengths.size()), 128, &empty);
  EXPECT_EQ(empty, 1u);
  std::map<uint64_t, uint64_t> covered;
  for (const Piece& p : pieces) {
    EXPECT_GE(p.len, 1u);
    EXPECT_LE(p.len, 128u);
    EXPECT_EQ(p.start, covered[p.doc]) << "pieces of a document are contiguous";
    covered[p.doc] += p.len;
  }
  for (uint64_t d = 0; d < lengths.size(); ++d) EXPECT_EQ(covered[d], lengths[d]) << "doc " << d;
  EXPECT_EQ(pieces.size(), 0u + 1 + 1 + 1 + 2 + 3 + 2);
}

TEST(BalancePlan, EveryPieceUsedOnceOrReportedDropped) {
  std::vector<uint32_t> lengths = lognormal_corpus(5000, 4.0, 1.2, 2000);
  for (size_t i = 0; i < lengths.size(); i += 97) lengths[i] = 0;  // empty documents
  const auto docs = all_documents(lengths.size());
  uint64_t empty_expected = 0;
  const auto expected_pieces = cut_documents(lengths, docs, 128, &empty_expected);
  for (const std::string tail : {"drop", "redistribute"}) {
    for (const std::string sampler : {"balanced", "naive"}) {
      PlanOptions o = small_options();
      o.tail = tail;
      o.sampler = sampler;
      const EpochPlan plan = build_epoch_plan(lengths, docs, o, 5, 0);
      std::multiset<PieceKey> used;
      uint64_t used_tokens = 0;
      for (const Step& step : expanded(plan))
        for (const MicroBatch& mb : step.micro_batches)
          for (const Piece& p : mb.pieces) used.insert(key_of(p)), used_tokens += p.len;
      std::set<PieceKey> all;
      for (const Piece& p : expected_pieces) all.insert(key_of(p));
      EXPECT_EQ(std::set<PieceKey>(used.begin(), used.end()).size(), used.size()) << "a piece used twice";
      for (const PieceKey& k : used) EXPECT_TRUE(all.count(k)) << "a piece that is not in the corpus";
      EXPECT_EQ(used.size() + plan.stats.dropped_pieces, expected_pieces.size()) << sampler << "/" << tail;
      EXPECT_EQ(plan.stats.pieces, expected_pieces.size());
      EXPECT_EQ(plan.stats.empty_docs, empty_expected);
      EXPECT_EQ(plan.stats.target_tokens, used_tokens);
      uint64_t total = 0;
      for (const Piece& p : expected_pieces) total += p.len;
      EXPECT_EQ(used_tokens + plan.stats.dropped_tokens, total);
      if (sampler == "balanced" && tail == "redistribute") {
        EXPECT_EQ(plan.stats.dropped_pieces, 0u);
      }
      if (sampler == "balanced" && tail == "drop") {
        EXPECT_EQ(plan.stats.dropped_tokens, plan.stats.tail_tokens);
      }
    }
  }
}

TEST(BalancePlan, EveryRankHasEveryStepAndEachMicroBatchOnce) {
  const auto lengths = lognormal_corpus(3000, 4.5, 1.0, 1000);
  for (const std::string sampler : {"balanced", "naive"}) {
    for (int world : {1, 2, 3, 8, 64}) {
      PlanOptions o = small_options();
      o.sampler = sampler;
      const EpochPlan plan = build_epoch_plan(lengths, all_documents(lengths.size()), o, world, 1);
      ASSERT_GT(plan.steps.size(), 1u);
      for (const Step& step : expanded(plan)) {
        ASSERT_EQ(step.rank_batches.size(), size_t(world)) << "every rank has an entry in every step";
        std::vector<int> seen(step.micro_batches.size(), 0);
        for (const auto& batches : step.rank_batches)
          for (uint32_t m : batches) ++seen.at(m);
        for (int count : seen) EXPECT_EQ(count, 1);
      }
      if (sampler == "naive") {
        for (const Step& step : expanded(plan))
          for (const auto& batches : step.rank_batches)
            EXPECT_EQ(batches.size(), step.rank_batches[0].size()) << "naive: same micro-batches per rank";
      }
    }
  }
}

TEST(BalancePlan, StepPieceSetsAreIndependentOfWorldSize) {
  const auto lengths = lognormal_corpus(4000, 5.0, 1.0, 3000);
  const auto docs = all_documents(lengths.size());
  for (const std::string tail : {"drop", "redistribute"}) {
    PlanOptions o = small_options();
    o.tail = tail;
    const EpochPlan one = build_epoch_plan(lengths, docs, o, 1, 3);
    ASSERT_GT(one.steps.size(), 5u);
    for (int world : {2, 3, 8, 64, 256}) {
      const EpochPlan plan = build_epoch_plan(lengths, docs, o, world, 3);
      expect_same_step_pieces(one, plan);
      EXPECT_EQ(plan.stats.steps_per_epoch, one.stats.steps_per_epoch);
      EXPECT_EQ(plan.stats.target_tokens, one.stats.target_tokens);
      EXPECT_EQ(plan.stats.dropped_tokens, one.stats.dropped_tokens);
    }
  }
}

TEST(BalancePlan, ResumeAtAPositionFindsTheSameStepOnAnotherWorldSize) {
  // A checkpoint stores (epoch, step_in_epoch); resuming on another world size rebuilds the plan
  // of that epoch and must find the same pieces there, also after the epoch boundary.
  const auto lengths = lognormal_corpus(3000, 4.5, 1.2, 2000);
  const auto docs = all_documents(lengths.size());
  const PlanOptions o = small_options();
  PlanPosition pos{0, 0};
  const uint64_t steps = build_epoch_plan(lengths, docs, o, 2, 0).steps.size();
  ASSERT_GT(steps, 3u);
  for (uint64_t i = 0; i < steps + 2; ++i) pos = next_position(pos, steps);
  EXPECT_EQ(pos.epoch, 1u);
  EXPECT_EQ(pos.step_in_epoch, 2u);
  const EpochPlan on_two = build_epoch_plan(lengths, docs, o, 2, pos.epoch);
  const EpochPlan on_five = build_epoch_plan(lengths, docs, o, 5, pos.epoch);
  EXPECT_EQ(step_pieces(on_two.steps[pos.step_in_epoch].expand()),
            step_pieces(on_five.steps[pos.step_in_epoch].expand()));
  EXPECT_NE(step_pieces(on_two.steps[pos.step_in_epoch].expand()),
            step_pieces(build_epoch_plan(lengths, docs, o, 2, 0).steps[pos.step_in_epoch].expand()))
      << "another epoch, other steps";
}

TEST(BalancePlan, IdenticalAcrossCallsDeterministicFromSeedAndEpoch) {
  const auto lengths = lognormal_corpus(3000, 4.0, 1.5, 5000);
  const auto docs = all_documents(lengths.size());
  const PlanOptions o = small_options();
  const EpochPlan a = build_epoch_plan(lengths, docs, o, 8, 2);
  const EpochPlan b = build_epoch_plan(lengths, docs, o, 8, 2);
  expect_same_step_pieces(a, b);
  const std::vector<Step> a_steps = expanded(a), b_steps = expanded(b);
  for (size_t s = 0; s < a_steps.size(); ++s) {
    ASSERT_EQ(a_steps[s].micro_batches.size(), b_steps[s].micro_batches.size());
    for (size_t m = 0; m < a_steps[s].micro_batches.size(); ++m) {
      const auto& p = a_steps[s].micro_batches[m].pieces;
      const auto& q = b_steps[s].micro_batches[m].pieces;
      ASSERT_EQ(p.size(), q.size());
      for (size_t i = 0; i < p.size(); ++i) EXPECT_EQ(key_of(p[i]), key_of(q[i]));
    }
  }
  for (size_t s = 0; s < a_steps.size(); ++s) EXPECT_EQ(a_steps[s].rank_batches, b_steps[s].rank_batches);
  EXPECT_EQ(plan_fingerprint(a), plan_fingerprint(b));

  const EpochPlan next_epoch = build_epoch_plan(lengths, docs, o, 8, 3);
  EXPECT_NE(plan_fingerprint(a), plan_fingerprint(next_epoch)) << "epochs must differ";
  PlanOptions other_seed = o;
  other_seed.seed = o.seed + 1;
  EXPECT_NE(plan_fingerprint(a), plan_fingerprint(build_epoch_plan(lengths, docs, other_seed, 8, 2)));
  // Same statistics of content across epochs: the same pieces, another order.
  EXPECT_EQ(a.stats.pieces, next_epoch.stats.pieces);
}

TEST(BalancePlan, MicroBatchesRespectTheTokenBudget) {
  const auto lengths = lognormal_corpus(4000, 5.5, 1.2, 20000);
  for (const std::string sampler : {"balanced", "naive"}) {
    PlanOptions o = small_options();
    o.sampler = sampler;
    o.context = 256;
    o.max_tokens = 1024;
    o.naive_batch_size = 4;
    const EpochPlan plan = build_epoch_plan(lengths, all_documents(lengths.size()), o, 4, 0);
    for (const Step& step : expanded(plan)) {
      uint64_t step_tokens = 0;
      for (const MicroBatch& mb : step.micro_batches) {
        ASSERT_FALSE(mb.pieces.empty());
        uint32_t longest = 0;
        uint64_t tokens = 0;
        for (const Piece& p : mb.pieces) longest = std::max(longest, p.len), tokens += p.len;
        if (sampler == "balanced") {
          EXPECT_TRUE(mb.packed());
          EXPECT_EQ(mb.tokens_computed(), tokens) << "a packed micro-batch computes no padding";
        } else {
          EXPECT_EQ(mb.padded_len, longest);
          EXPECT_EQ(mb.tokens_computed(), longest * mb.pieces.size());
        }
        EXPECT_EQ(mb.target_tokens, tokens);
        EXPECT_LE(mb.tokens_computed(), o.max_tokens) << sampler;
        EXPECT_DOUBLE_EQ(mb.cost, plan.cost(mb));
        step_tokens += tokens;
      }
      EXPECT_EQ(step.target_tokens, step_tokens);
    }
  }
}

TEST(BalancePlan, StepsHoldAboutTokensPerStepAndMixLengths) {
  const auto lengths = lognormal_corpus(20000, 5.0, 1.0, 4000);
  PlanOptions o = small_options();
  o.context = 512;
  o.max_tokens = 1024;
  o.tokens_per_step = 32768;
  const EpochPlan plan = build_epoch_plan(lengths, all_documents(lengths.size()), o, 8, 0);
  ASSERT_GT(plan.steps.size(), 20u);
  std::vector<double> mean_len;
  for (const Step& step : expanded(plan)) {
    // Cut piece by piece: within half a context of the target.
    EXPECT_GE(step.target_tokens + o.context / 2, o.tokens_per_step);
    EXPECT_LE(step.target_tokens, o.tokens_per_step + o.context / 2);
    uint64_t rows = 0;
    for (const MicroBatch& mb : step.micro_batches) rows += mb.pieces.size();
    mean_len.push_back(double(step.target_tokens) / double(rows));
  }
  // Steps are not sorted by length: mean lengths go up and down from step to step.
  int ups = 0, downs = 0;
  for (size_t i = 1; i < mean_len.size(); ++i) (mean_len[i] > mean_len[i - 1] ? ups : downs)++;
  EXPECT_GT(ups, int(mean_len.size()) / 4);
  EXPECT_GT(downs, int(mean_len.size()) / 4);
}

TEST(BalancePlan, BalancedBeatsNaiveOnPaddingAndCost) {
  const auto lengths = lognormal_corpus(40000, 5.0, 1.0, 8000);
  const auto docs = all_documents(lengths.size());
  PlanOptions o;
  o.context = 1024;
  o.max_tokens = 2048;
  o.tokens_per_step = 16 * 8 * 2048;
  o.naive_batch_size = 2;
  const EpochPlan balanced = build_epoch_plan(lengths, docs, o, 16, 0);
  o.sampler = "naive";
  const EpochPlan naive = build_epoch_plan(lengths, docs, o, 16, 0);
  EXPECT_EQ(balanced.stats.padding_efficiency, 1.0);
  EXPECT_LE(balanced.stats.cost_imbalance_p95, 1.02);
  EXPECT_LT(balanced.stats.critical_cost_per_token, naive.stats.critical_cost_per_token);
  EXPECT_LT(naive.stats.padding_efficiency, balanced.stats.padding_efficiency);
  EXPECT_GT(naive.stats.cost_imbalance_p95, balanced.stats.cost_imbalance_p95);
  EXPECT_LT(balanced.stats.cost_wait_fraction, naive.stats.cost_wait_fraction);
  EXPECT_GE(balanced.stats.cost_wait_fraction, 0.0);
}

TEST(BalancePlan, TailDroppedOrRedistributedAndReported) {
  const auto lengths = lognormal_corpus(2000, 4.0, 1.0, 500);
  const auto docs = all_documents(lengths.size());
  PlanOptions o = small_options();
  o.tokens_per_step = 5000;
  const EpochPlan dropped = build_epoch_plan(lengths, docs, o, 4, 0);
  o.tail = "redistribute";
  const EpochPlan spread = build_epoch_plan(lengths, docs, o, 4, 0);
  ASSERT_GT(dropped.stats.tail_pieces, 0u) << "pick a corpus whose last step is partial";
  EXPECT_FALSE(dropped.stats.tail_redistributed);
  EXPECT_TRUE(spread.stats.tail_redistributed);
  EXPECT_EQ(dropped.stats.steps_per_epoch, spread.stats.steps_per_epoch);
  EXPECT_EQ(dropped.stats.dropped_pieces, dropped.stats.tail_pieces);
  EXPECT_EQ(spread.stats.dropped_tokens, 0u);
  EXPECT_EQ(dropped.stats.target_tokens + dropped.stats.tail_tokens, spread.stats.target_tokens);
}

TEST(BalancePlan, TinyCorpusIsOneStepAndIdleRanksAreReported) {
  const std::vector<uint32_t> lengths = {10, 20, 0, 30};
  PlanOptions o = small_options();
  o.cut_pieces = false;  // cuts would give every rank a part (balance_cut_test)
  const EpochPlan plan = build_epoch_plan(lengths, all_documents(lengths.size()), o, 4, 0);
  ASSERT_EQ(plan.steps.size(), 1u);
  EXPECT_EQ(plan.stats.empty_docs, 1u);
  EXPECT_EQ(plan.stats.target_tokens, 60u);
  EXPECT_EQ(plan.steps[0].world_size(), 4);
  const uint64_t mbs = plan.steps[0].micro_batch_count();
  EXPECT_LT(mbs, 4u);
  EXPECT_EQ(plan.stats.idle_rank_steps, 4u - mbs);
  EXPECT_EQ(plan.stats.steps_with_idle_ranks, 1u);
}

TEST(BalancePlan, NaiveSamplerShape) {
  const auto lengths = lognormal_corpus(3000, 4.0, 1.0, 1000);
  PlanOptions o = small_options();
  o.sampler = "naive";
  o.naive_batch_size = 3;
  const int world = 4;
  const EpochPlan plan = build_epoch_plan(lengths, all_documents(lengths.size()), o, world, 0);
  ASSERT_GT(plan.steps.size(), 1u);
  const size_t per_rank = plan.steps[0].expand().rank_batches[0].size();
  ASSERT_GE(per_rank, 1u);
  // The sequences as a distributed sampler deals them: the step's pieces in the shuffled order
  // of the epoch, sequence k to rank k mod P. Micro-step j of rank r holds the step's sequences
  // r + P (3j + i), i < 3.
  std::vector<Piece> order = cut_documents(lengths, all_documents(lengths.size()), o.context);
  Xoshiro256 rng(o.seed, 0, RngStream::kNaiveOrder);
  fisher_yates(order.data(), order.size(), rng);
  const size_t per_step = per_rank * world * 3;
  std::vector<Piece> dealt;
  size_t s = 0;
  for (const Step& step : expanded(plan)) {
    EXPECT_EQ(step.micro_batches.size(), per_rank * world);
    dealt.assign(per_step, Piece{});
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(step.rank_batches[r].size(), per_rank);
      for (size_t j = 0; j < per_rank; ++j) {
        EXPECT_EQ(step.rank_batches[r][j], uint32_t(r * per_rank + j)) << "stored rank by rank";
        const MicroBatch& mb = step.micro_batches[step.rank_batches[r][j]];
        ASSERT_EQ(mb.pieces.size(), 3u);
        for (size_t i = 0; i < 3; ++i) dealt[r + world * (3 * j + i)] = mb.pieces[i];
      }
    }
    for (size_t k = 0; k < per_step; ++k)
      EXPECT_EQ(key_of(dealt[k]), key_of(order[s * per_step + k])) << "step " << s << " sequence " << k;
    ++s;
  }
  // Naive content depends on the world size (that is the baseline's nature).
  const EpochPlan other = build_epoch_plan(lengths, all_documents(lengths.size()), o, 2, 0);
  EXPECT_NE(plan_fingerprint(plan), plan_fingerprint(other));
}

TEST(BalancePlan, IdleRanksWhenTheStepIsTooSmallForTheWorldSize) {
  // Every document one full context: a step of 4 contexts over 8 ranks leaves 4 idle.
  const std::vector<uint32_t> lengths(64, 128);
  PlanOptions o = small_options();
  o.cut_pieces = false;  // with cuts, no rank idles and no warning is due
  o.tokens_per_step = 4 * 128;
  const EpochPlan plan = build_epoch_plan(lengths, all_documents(lengths.size()), o, 8, 0);
  ASSERT_EQ(plan.steps.size(), 16u);
  EXPECT_EQ(plan.stats.steps_with_idle_ranks, 16u);
  EXPECT_EQ(plan.stats.idle_rank_steps, 16u * 4u);
  EXPECT_EQ(plan.stats.idle_ranks_max, 4u);
  for (const Step& step : expanded(plan)) ASSERT_EQ(step.rank_batches.size(), 8u) << "idle ranks keep their entry";
  const std::string warning = idle_rank_warning(o, 8);
  EXPECT_NE(warning.find("train.tokens_per_step"), std::string::npos) << warning;
  EXPECT_NE(warning.find(std::to_string(8 * 128)), std::string::npos) << "names the step that avoids it: " << warning;
  EXPECT_EQ(idle_rank_warning(o, 4), "") << "4 ranks x 128 = the step";
  o.cut_pieces = true;
  EXPECT_EQ(idle_rank_warning(o, 8), "") << "cut pieces fill every rank";
  o.sampler = "naive";
  EXPECT_EQ(idle_rank_warning(o, 8), "") << "naive ranks always get their sequences";
}

// least_busiest_cost is a true lower bound: never above the best division, found by trying every
// assignment of small random steps (ties included). And its pairs see what "k+1 of the kP+1
// longest" misses: costs 10, 6, 5, 4 on 2 ranks need 14 (10+4 | 6+5), where that rule gives 11.
TEST(BalancePlan, LeastBusiestCostNeverExceedsTheBestDivision) {
  std::vector<double> example{4, 10, 5, 6};
  EXPECT_DOUBLE_EQ(least_busiest_cost(example, 2, 0.0), 14.0);
  example = {4, 10, 5, 6};
  EXPECT_DOUBLE_EQ(least_busiest_cost(example, 2, 3.0), 17.0) << "c: the busiest rank runs a micro-batch";
  uint64_t state = 12345;
  auto next = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 33;
  };
  int tight = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const size_t P = 1 + next() % 4, n = 1 + next() % 8;
    std::vector<double> costs(n);
    for (double& x : costs) x = double(1 + next() % (trial % 2 ? 6 : 100));  // odd trials: many ties
    // Every assignment of n pieces to P ranks: the least busiest rank.
    double best = 1e300;
    std::vector<size_t> rank_of(n, 0);
    for (;;) {
      std::vector<double> load(P, 0.0);
      for (size_t j = 0; j < n; ++j) load[rank_of[j]] += costs[j];
      best = std::min(best, *std::max_element(load.begin(), load.end()));
      size_t j = 0;
      while (j < n && ++rank_of[j] == P) rank_of[j++] = 0;
      if (j == n) break;
    }
    std::vector<double> sorted = costs;
    const double bound = least_busiest_cost(sorted, P, 0.0);
    ASSERT_LE(bound, best + 1e-9) << "trial " << trial << ": P " << P << ", n " << n;
    tight += bound >= best - 1e-9;
  }
  EXPECT_GT(tight, 1000) << "the bound meets the best division in most small steps";
}

TEST(BalancePlan, ImbalanceNeverBeatsTheBoundAndMeetsItWhenStepsAreCoarse) {
  // A share of about one context per rank: full-length pieces cost more than a rank's mean share,
  // so the bound exceeds 1, and the division should reach it.
  const auto lengths = lognormal_corpus(6000, 5.0, 1.2, 4000);
  PlanOptions o = small_options();
  o.cut_pieces = false;  // whole pieces: the bound holds
  o.context = 256;
  o.max_tokens = 4096;
  o.tokens_per_step = 64 * 200;
  const EpochPlan coarse = build_epoch_plan(lengths, all_documents(lengths.size()), o, 64, 0);
  EXPECT_GT(coarse.stats.cost_imbalance_bound_p95, 1.02);
  EXPECT_GE(coarse.stats.cost_imbalance_p95, coarse.stats.cost_imbalance_bound_p95 - 1e-12);
  EXPECT_LE(coarse.stats.cost_imbalance_p95, coarse.stats.cost_imbalance_bound_p95 * 1.01);
  EXPECT_EQ(coarse.stats.cuts, 0u);
  // Cut pieces go below the whole-piece bound, which stays reported; the whole-piece division
  // before the cuts is the plan without them.
  o.cut_pieces = true;
  const EpochPlan cut = build_epoch_plan(lengths, all_documents(lengths.size()), o, 64, 0);
  EXPECT_LE(cut.stats.cost_imbalance_p95, 1.02);
  EXPECT_GT(cut.stats.cuts, 0u);
  // (Against a mean that now holds the micro-batches of every rank: c each.)
  EXPECT_GT(cut.stats.cost_imbalance_bound_p95, 1.02);
  EXPECT_LE(cut.stats.cost_imbalance_bound_p95, coarse.stats.cost_imbalance_bound_p95 + 1e-12);
  EXPECT_NEAR(cut.stats.cost_imbalance_uncut_p95, coarse.stats.cost_imbalance_p95, 1e-9);
  o.cut_pieces = false;
  // 3200 tokens per rank: one micro-batch each (a share just above a multiple of max_tokens would
  // force one rank into one more micro-batch, an imbalance of c that no division avoids).
  const EpochPlan fine = build_epoch_plan(lengths, all_documents(lengths.size()), o, 4, 0);
  EXPECT_EQ(fine.stats.cost_imbalance_bound_p95, 1.0);
  EXPECT_LE(fine.stats.cost_imbalance_p95, 1.01);
  o.sampler = "naive";
  EXPECT_EQ(build_epoch_plan(lengths, all_documents(lengths.size()), o, 4, 0).stats.cost_imbalance_bound_p95, 0.0);

  // Three equal pieces on two ranks: one rank holds two of them, 2/1.5 of the mean.
  PlanOptions three = small_options();
  three.cut_pieces = false;
  three.context = 16;
  three.max_tokens = 64;
  three.tokens_per_step = 30;
  three.cost = CostModel{1.0, 1e-12, 0.0};
  const EpochPlan plan = build_epoch_plan({10, 10, 10}, all_documents(3), three, 2, 0);
  ASSERT_EQ(plan.steps.size(), 1u);
  EXPECT_NEAR(plan.stats.cost_imbalance_bound_p95, 20.0 / 15.0, 1e-9);
  EXPECT_NEAR(plan.stats.cost_imbalance_p95, 20.0 / 15.0, 1e-9);
  // The rank holding one piece waits 10 of the 2 x 20 rank-time units.
  EXPECT_NEAR(plan.stats.cost_wait_fraction, 10.0 / 40.0, 1e-9);
}

TEST(BalancePlan, SplitIsDeterministicDisjointAndExact) {
  const auto lengths = lognormal_corpus(1000, 4.0, 1.0, 1000);
  const Split a = split_documents(lengths, 0.1, 5);
  const Split b = split_documents(lengths, 0.1, 5);
  EXPECT_EQ(a.eval_docs, b.eval_docs);
  EXPECT_EQ(a.eval_docs.size(), 100u);
  EXPECT_EQ(a.train_docs.size(), 900u);
  std::vector<uint64_t> all = a.train_docs;
  all.insert(all.end(), a.eval_docs.begin(), a.eval_docs.end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, all_documents(1000));
  EXPECT_NE(split_documents(lengths, 0.1, 6).eval_docs, a.eval_docs);
  EXPECT_TRUE(split_documents(lengths, 0.0, 5).eval_docs.empty());
  EXPECT_EQ(split_documents({5, 6}, 0.01, 5).eval_docs.size(), 1u) << "a positive fraction holds out >= 1 doc";
}

TEST(BalancePlan, PositionAdvancesAcrossEpochs) {
  EXPECT_EQ(next_position({0, 0}, 3).step_in_epoch, 1u);
  const PlanPosition last = next_position({2, 2}, 3);
  EXPECT_EQ(last.epoch, 3u);
  EXPECT_EQ(last.step_in_epoch, 0u);
}

TEST(BalancePlan, RefusesBadOptionsNamingTheKey) {
  const std::vector<uint32_t> lengths = {10, 20};
  PlanOptions o = small_options();
  o.max_tokens = 50;  // < context: a 128-token piece spans 3 ranks
  try {
    build_epoch_plan({10, 200}, all_documents(2), o, 2, 0);
    FAIL() << "a piece needing more ranks than the world size must be refused";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("data.max_tokens"), std::string::npos) << what;
    EXPECT_NE(what.find("model.block_size"), std::string::npos) << what;
    EXPECT_NE(what.find(">= 3 ranks"), std::string::npos) << "names the smallest world size: " << what;
  }
  EXPECT_NO_THROW(build_epoch_plan({10, 200}, all_documents(2), o, 3, 0));
  o.sampler = "naive";
  EXPECT_THROW(build_epoch_plan(lengths, all_documents(2), o, 2, 0), Error) << "naive cannot cut";
  o = small_options();
  o.tokens_per_step = 0;
  try {
    build_epoch_plan(lengths, all_documents(2), o, 2, 0);
    FAIL() << "a zero step must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.tokens_per_step"), std::string::npos) << e.what();
  }
  o = small_options();
  o.cost.a = 0;
  o.cost.b = 0;
  EXPECT_THROW(build_epoch_plan(lengths, all_documents(2), o, 2, 0), Error);
  o = small_options();
  o.tail = "keep";
  EXPECT_THROW(build_epoch_plan(lengths, all_documents(2), o, 2, 0), Error);
  EXPECT_THROW(build_epoch_plan(lengths, {0, 5}, small_options(), 2, 0), Error);
}

TEST(BalancePlan, CostModelDefaults) {
  CostModel c;
  EXPECT_EQ(resolve_cost_model(c, 1024, 16384, 8).b, default_attention_cost(1024));
  c.b = 0.5;
  EXPECT_EQ(resolve_cost_model(c, 1024, 16384, 8).b, 0.5);
  // GPT-2 124M: attention is a small share at short lengths, a larger one at full context.
  const double b = attention_cost_coefficient(model::ModelSpec{12, 12, 768, 1024, 50257});
  EXPECT_EQ(b, 12.0 / (12.0 * 12 * 768 + 50257));  // n_layer / (12 n_layer n_embd + vocab), to the bit
  EXPECT_GT(b * 1024, 0.05);
  EXPECT_LT(b * 1024, 0.5);
  EXPECT_EQ(resolve_cost_model(CostModel{}, 1024, 16384, 8).c, kDefaultMicroBatchTokens);
  CostModel calibrated{2.0, 0.5, 3.0};
  EXPECT_EQ(resolve_cost_model(calibrated, 1024, 16384, 8).c, 3.0);
  MicroBatch mb;
  mb.pieces = {{0, 0, 3}, {1, 0, 4}};
  mb.target_tokens = 7;
  CostModel unit{2.0, 1.0, 5.0};
  // Packed: 7 tokens, attention 3^2 + 4^2, one micro-batch.
  EXPECT_DOUBLE_EQ(mb.attention_work(), 9 + 16);
  EXPECT_DOUBLE_EQ(unit(mb), 2.0 * 7 + 9 + 16 + 5);
  // Naive: two rows of 4, padding computed in attention too.
  mb.padded_len = 4;
  EXPECT_DOUBLE_EQ(mb.attention_work(), 2 * 16);
  EXPECT_DOUBLE_EQ(unit(mb), 2.0 * 8 + 2 * 16 + 5);
}

}  // namespace
}  // namespace kilter::balance
