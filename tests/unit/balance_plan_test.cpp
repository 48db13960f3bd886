// Unit tests of the balanced batch plan and the naive baseline (lib/balance/plan.h): coverage of
// every piece, equal steps per rank, world-size independence, determinism, token budgets, tails.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <tuple>

#include "io/error.h"
#include "lib/balance/plan.h"
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

// Steps are equal in content: same micro-batches, same pieces, same order.
void expect_same_content(const EpochPlan& x, const EpochPlan& y) {
  ASSERT_EQ(x.steps.size(), y.steps.size());
  for (size_t s = 0; s < x.steps.size(); ++s) {
    const Step& a = x.steps[s];
    const Step& b = y.steps[s];
    ASSERT_EQ(a.micro_batches.size(), b.micro_batches.size()) << "step " << s;
    EXPECT_EQ(a.target_tokens, b.target_tokens);
    for (size_t m = 0; m < a.micro_batches.size(); ++m) {
      const MicroBatch& p = a.micro_batches[m];
      const MicroBatch& q = b.micro_batches[m];
      ASSERT_EQ(p.pieces.size(), q.pieces.size());
      EXPECT_EQ(p.padded_len, q.padded_len);
      for (size_t i = 0; i < p.pieces.size(); ++i) EXPECT_EQ(key_of(p.pieces[i]), key_of(q.pieces[i]));
    }
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
      for (const Step& step : plan.steps)
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
      for (const Step& step : plan.steps) {
        ASSERT_EQ(step.rank_batches.size(), size_t(world)) << "every rank has an entry in every step";
        std::vector<int> seen(step.micro_batches.size(), 0);
        for (const auto& batches : step.rank_batches)
          for (uint32_t m : batches) ++seen.at(m);
        for (int count : seen) EXPECT_EQ(count, 1);
      }
      if (sampler == "naive") {
        for (const Step& step : plan.steps)
          for (const auto& batches : step.rank_batches)
            EXPECT_EQ(batches.size(), step.rank_batches[0].size()) << "naive: same micro-batches per rank";
      }
    }
  }
}

TEST(BalancePlan, StepContentIsIndependentOfWorldSize) {
  const auto lengths = lognormal_corpus(4000, 5.0, 1.0, 3000);
  const auto docs = all_documents(lengths.size());
  const EpochPlan one = build_epoch_plan(lengths, docs, small_options(), 1, 3);
  for (const Step& step : one.steps) {
    // World size 1 runs the step's micro-batches in order: the concatenation of the same list.
    std::vector<uint32_t> in_order(step.micro_batches.size());
    std::iota(in_order.begin(), in_order.end(), 0u);
    ASSERT_EQ(step.rank_batches.size(), 1u);
    EXPECT_EQ(step.rank_batches[0], in_order);
  }
  for (int world : {2, 3, 8, 64}) {
    const EpochPlan plan = build_epoch_plan(lengths, docs, small_options(), world, 3);
    expect_same_content(one, plan);
    EXPECT_EQ(plan.stats.steps_per_epoch, one.stats.steps_per_epoch);
    EXPECT_EQ(plan.stats.padding_efficiency, one.stats.padding_efficiency);
  }
}

TEST(BalancePlan, IdenticalAcrossCallsDeterministicFromSeedAndEpoch) {
  const auto lengths = lognormal_corpus(3000, 4.0, 1.5, 5000);
  const auto docs = all_documents(lengths.size());
  const PlanOptions o = small_options();
  const EpochPlan a = build_epoch_plan(lengths, docs, o, 8, 2);
  const EpochPlan b = build_epoch_plan(lengths, docs, o, 8, 2);
  expect_same_content(a, b);
  for (size_t s = 0; s < a.steps.size(); ++s) EXPECT_EQ(a.steps[s].rank_batches, b.steps[s].rank_batches);
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
    for (const Step& step : plan.steps) {
      uint64_t step_tokens = 0;
      for (const MicroBatch& mb : step.micro_batches) {
        ASSERT_FALSE(mb.pieces.empty());
        uint32_t longest = 0;
        uint64_t tokens = 0;
        for (const Piece& p : mb.pieces) longest = std::max(longest, p.len), tokens += p.len;
        EXPECT_EQ(mb.padded_len, longest);
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
  for (const Step& step : plan.steps) {
    EXPECT_GE(step.target_tokens + o.max_tokens / 2, o.tokens_per_step);
    EXPECT_LE(step.target_tokens, o.tokens_per_step + o.max_tokens);
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
  EXPECT_GE(balanced.stats.padding_efficiency, 0.95);
  EXPECT_LE(balanced.stats.cost_imbalance_p95, 1.05);
  EXPECT_LT(naive.stats.padding_efficiency, balanced.stats.padding_efficiency);
  EXPECT_GT(naive.stats.cost_imbalance_p95, balanced.stats.cost_imbalance_p95);
}

TEST(BalancePlan, TailDroppedOrRedistributedAndReported) {
  const auto lengths = lognormal_corpus(2000, 4.0, 1.0, 500);
  const auto docs = all_documents(lengths.size());
  PlanOptions o = small_options();
  o.tokens_per_step = 5000;
  const EpochPlan dropped = build_epoch_plan(lengths, docs, o, 4, 0);
  o.tail = "redistribute";
  const EpochPlan spread = build_epoch_plan(lengths, docs, o, 4, 0);
  ASSERT_GT(dropped.stats.tail_micro_batches, 0u) << "pick a corpus whose last step is partial";
  EXPECT_FALSE(dropped.stats.tail_redistributed);
  EXPECT_TRUE(spread.stats.tail_redistributed);
  EXPECT_EQ(dropped.stats.steps_per_epoch, spread.stats.steps_per_epoch);
  EXPECT_EQ(dropped.stats.micro_batches + dropped.stats.tail_micro_batches, spread.stats.micro_batches);
  EXPECT_EQ(spread.stats.dropped_tokens, 0u);
  EXPECT_EQ(dropped.stats.target_tokens + dropped.stats.tail_tokens, spread.stats.target_tokens);
}

TEST(BalancePlan, TinyCorpusIsOneStepAndIdleRanksAreReported) {
  const std::vector<uint32_t> lengths = {10, 20, 0, 30};
  PlanOptions o = small_options();
  const EpochPlan plan = build_epoch_plan(lengths, all_documents(lengths.size()), o, 4, 0);
  ASSERT_EQ(plan.steps.size(), 1u);
  EXPECT_EQ(plan.stats.empty_docs, 1u);
  EXPECT_EQ(plan.stats.target_tokens, 60u);
  EXPECT_EQ(plan.steps[0].rank_batches.size(), 4u);
  const uint64_t mbs = plan.steps[0].micro_batches.size();
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
  const size_t per_rank = plan.steps[0].rank_batches[0].size();
  ASSERT_GE(per_rank, 1u);
  for (const Step& step : plan.steps) {
    EXPECT_EQ(step.micro_batches.size(), per_rank * world);
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(step.rank_batches[r].size(), per_rank);
      for (size_t j = 0; j < per_rank; ++j) {
        // Micro-step j of rank r is micro-batch j * P + r: sequences r, r+P, ... of the step.
        EXPECT_EQ(step.rank_batches[r][j], uint32_t(j * world + r));
        EXPECT_EQ(step.micro_batches[step.rank_batches[r][j]].pieces.size(), 3u);
      }
    }
  }
  // Naive content depends on the world size (that is the baseline's nature).
  const EpochPlan other = build_epoch_plan(lengths, all_documents(lengths.size()), o, 2, 0);
  EXPECT_NE(plan_fingerprint(plan), plan_fingerprint(other));
}

TEST(BalancePlan, BucketWidthBoundsPadding) {
  const auto lengths = lognormal_corpus(20000, 4.5, 0.8, 400);
  PlanOptions o = small_options();
  o.context = 256;
  o.max_tokens = 4096;
  o.bucket_width = 4;
  const EpochPlan plan = build_epoch_plan(lengths, all_documents(lengths.size()), o, 2, 0);
  EXPECT_GT(plan.stats.padding_efficiency, 0.97);
  for (const Step& step : plan.steps)
    for (const MicroBatch& mb : step.micro_batches)
      EXPECT_LE(mb.tokens_computed() - mb.target_tokens, mb.tokens_computed() / 32 + mb.padded_len);
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
  o.max_tokens = 64;  // < context
  try {
    build_epoch_plan(lengths, all_documents(2), o, 2, 0);
    FAIL() << "max_tokens < context must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("data.max_tokens"), std::string::npos) << e.what();
  }
  o = small_options();
  o.tail = "keep";
  EXPECT_THROW(build_epoch_plan(lengths, all_documents(2), o, 2, 0), Error);
  EXPECT_THROW(build_epoch_plan(lengths, {0, 5}, small_options(), 2, 0), Error);
}

TEST(BalancePlan, CostModelDefaults) {
  CostModel c;
  EXPECT_EQ(resolve_cost_model(c, 1024).b, default_attention_cost(1024));
  c.b = 0.5;
  EXPECT_EQ(resolve_cost_model(c, 1024).b, 0.5);
  // GPT-2 124M: attention is a small share at short lengths, a larger one at full context.
  const double b = attention_cost_coefficient(12, 768, 50257);
  EXPECT_GT(b * 1024, 0.05);
  EXPECT_LT(b * 1024, 0.5);
  MicroBatch mb;
  mb.pieces = {{0, 0, 3}, {1, 0, 4}};
  mb.padded_len = 4;
  CostModel unit{2.0, 1.0};
  EXPECT_DOUBLE_EQ(unit(mb), 2.0 * 8 + 9 + 16);
}

}  // namespace
}  // namespace kilter::balance
