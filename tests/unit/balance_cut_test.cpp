// Unit tests of cut pieces (issue 23): the plan cuts pieces between ranks for balance and cuts
// pieces longer than a micro-batch over several ranks; every step obeys step_cuts()'s rules, holds
// the same tokens with cuts on and off and on every world size, and cuts never raise the busiest
// rank's cost.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "io/base/error.h"
#include "lib/balance/divide.h"
#include "lib/balance/mixture.h"
#include "lib/balance/plan.h"
#include "lib/balance/plan_config.h"
#include "lib/balance/synthetic_lengths.h"

namespace kilter::balance {
namespace {

std::vector<uint32_t> corpus(uint64_t docs, const char* spec, uint64_t seed) {
  return synthetic_lengths(parse_length_spec(spec), docs, seed);
}

// Coarse steps (about half a context per rank on the larger world sizes): cuts are needed.
PlanOptions cut_options(double t) {
  PlanOptions o;
  o.context = 256;
  o.max_tokens = 1024;
  o.tokens_per_step = 4096;
  o.seed = 7;
  o.cost.b = 1.0 / 1536;
  o.cost.c = 16;
  o.cost.t = t;
  return o;
}

// (doc, token) targets of a step as merged intervals: what the step trains on.
std::vector<std::tuple<uint64_t, uint32_t, uint32_t>> step_targets(const Step& step) {
  std::vector<std::tuple<uint64_t, uint32_t, uint32_t>> spans;
  for (const MicroBatch& mb : step.micro_batches)
    for (const Piece& p : mb.pieces) spans.emplace_back(p.doc, p.start, p.start + p.len);
  std::sort(spans.begin(), spans.end());
  std::vector<std::tuple<uint64_t, uint32_t, uint32_t>> merged;
  for (const auto& [doc, begin, end] : spans) {
    if (!merged.empty() && std::get<0>(merged.back()) == doc && std::get<2>(merged.back()) == begin)
      std::get<2>(merged.back()) = end;
    else
      merged.emplace_back(doc, begin, end);
  }
  return merged;
}

double busiest(const StepView& step) {
  const std::vector<double> loads = rank_costs(step);
  return *std::max_element(loads.begin(), loads.end());
}

uint64_t cuts_in(const std::vector<CutPiece>& cuts) {
  uint64_t n = 0;
  for (const CutPiece& c : cuts) n += c.parts.size() - 1;
  return n;
}

TEST(BalanceCut, RandomCorporaObeyTheRulesHoldTheSameTokensAndNeverRaiseTheBusiest) {
  uint64_t total_cuts = 0;
  for (uint64_t seed : {1, 2, 3}) {
    const auto lengths = corpus(1500, seed == 2 ? "uniform:1,600" : "lognormal:4.8,1.1", seed);
    const auto docs = all_documents(lengths.size());
    for (double t : {0.0, 0.3}) {
      PlanOptions on = cut_options(t), off = cut_options(t);
      off.cut_pieces = false;
      const EpochPlan one = build_epoch_plan(lengths, docs, off, 1, 0);
      for (int world : {2, 3, 7, 16, 24}) {
        const EpochPlan cut = build_epoch_plan(lengths, docs, on, world, 0);
        const EpochPlan whole = build_epoch_plan(lengths, docs, off, world, 0);
        ASSERT_EQ(cut.steps.size(), one.steps.size());
        ASSERT_EQ(whole.steps.size(), one.steps.size());
        for (uint64_t s = 0; s < cut.steps.size(); ++s) {
          const Step step = cut.steps[s].expand();
          std::vector<CutPiece> cuts;
          ASSERT_NO_THROW(cuts = step_cuts(step)) << "seed " << seed << " world " << world << " step " << s;
          EXPECT_LE(cuts_in(cuts), 2 * uint64_t(world - 1)) << "twice the wrap-around rule's count";
          total_cuts += cuts_in(cuts);
          EXPECT_EQ(step_targets(step), step_targets(one.steps[s].expand())) << "step " << s << " world " << world;
          EXPECT_EQ(step_targets(whole.steps[s].expand()), step_targets(one.steps[s].expand()));
          for (const MicroBatch& mb : step.micro_batches) EXPECT_LE(mb.target_tokens, on.max_tokens);
          EXPECT_LE(busiest(cut.steps[s]), busiest(whole.steps[s]) * (1 + 1e-12))
              << "cuts lowered, never raised, the busiest rank: world " << world << " step " << s;
        }
        EXPECT_NEAR(cut.stats.cost_imbalance_uncut_p95, whole.stats.cost_imbalance_p95, 1e-9)
            << "the figure without cuts is the plan without cuts";
        EXPECT_LE(cut.stats.cost_imbalance_p95, whole.stats.cost_imbalance_p95 + 1e-12);
        EXPECT_LE(cut.stats.cuts_per_step_max, 2.0 * double(world - 1));
      }
    }
  }
  EXPECT_GT(total_cuts, 100u) << "the corpora exercise cuts";
}

TEST(BalanceCut, CoarseStepsBalanceWithCutsAndTheTransferCostIsCounted) {
  const auto lengths = corpus(3000, "lognormal:5,1.0", 4);
  const auto docs = all_documents(lengths.size());
  PlanOptions o = cut_options(0.1);
  o.kv_bytes_per_token = 1000;
  o.cut_pieces = false;
  const EpochPlan whole = build_epoch_plan(lengths, docs, o, 16, 0);
  o.cut_pieces = true;
  const EpochPlan cut = build_epoch_plan(lengths, docs, o, 16, 0);
  EXPECT_GT(whole.stats.cost_imbalance_p95, 1.05) << "one context per rank";
  EXPECT_LT(cut.stats.cost_imbalance_p95, 1.02);
  EXPECT_GT(cut.stats.cuts_per_step_p50, 0);
  EXPECT_GT(cut.stats.kv_bytes_per_step_max, 0);
  EXPECT_GE(cut.stats.kv_bytes_per_step_max, cut.stats.kv_bytes_per_rank_max / 2);
  EXPECT_EQ(whole.stats.kv_bytes_per_step_max, 0);
  // A part's cost: a len + b (e^2 - s^2) + t s, in the micro-batch costs the stats sum.
  bool seen_part = false;
  for (uint64_t s = 0; s < cut.steps.size() && !seen_part; ++s)
    for (uint32_t m = 0; m < cut.steps[s].micro_batch_count(); ++m) {
      const MicroBatch mb = cut.steps[s].micro_batch(m);
      double expect = cut.cost.c;
      for (const Piece& p : mb.pieces) {
        expect += cut.cost.part(p.offset, p.len);
        seen_part |= p.offset > 0;
      }
      EXPECT_NEAR(mb.cost, expect, 1e-9 * expect);
    }
  EXPECT_TRUE(seen_part);
  // A prohibitive transfer cost: cutting never pays, and the plan is the whole-piece one.
  o.cost.t = 1e6;
  EXPECT_EQ(plan_fingerprint(build_epoch_plan(lengths, docs, o, 16, 0)), plan_fingerprint(whole));
}

// A mixture of datasets (data.sources) divides its steps as one dataset does: it cuts pieces where
// data.cut_pieces allows, and its statistics show the cuts, their K/V and the whole-piece imbalance.
TEST(BalanceCut, MixturesCutAsOneDatasetDoes) {
  const auto lengths = corpus(3000, "lognormal:5,1.0", 4);
  std::vector<uint64_t> first, second;
  for (uint64_t d = 0; d < lengths.size(); ++d) (d < 2000 ? first : second).push_back(d);
  PlanOptions o = cut_options(0.1);
  o.kv_bytes_per_token = 1000;
  const auto plan = [&](bool cut_pieces) {
    o.cut_pieces = cut_pieces;
    MixturePlanner mixture(lengths, {MixtureSource{"a", 0.7, first}, MixtureSource{"b", 0.3, second}}, o);
    return mixture.build(0, 16);
  };
  const EpochPlan whole = plan(false), cut = plan(true);
  EXPECT_GT(whole.stats.cost_imbalance_p95, 1.05) << "one context per rank";
  EXPECT_EQ(whole.stats.cuts, 0u);
  EXPECT_GT(cut.stats.cuts_per_step_p50, 0);
  EXPECT_LT(cut.stats.cost_imbalance_p95, 1.02);
  EXPECT_GT(cut.stats.kv_bytes_per_step_max, 0);
  EXPECT_NEAR(cut.stats.cost_imbalance_uncut_p95, whole.stats.cost_imbalance_p95, 1e-9);
  // The same steps, the same tokens: cuts only move tokens between ranks.
  ASSERT_EQ(cut.steps.size(), whole.steps.size());
  for (uint64_t s = 0; s < cut.steps.size(); ++s)
    ASSERT_EQ(step_targets(cut.steps[s].expand()), step_targets(whole.steps[s].expand())) << "step " << s;
}

TEST(BalanceCut, DeterministicAndTheFingerprintCoversParts) {
  const auto lengths = corpus(2000, "lognormal:5,1.0", 5);
  const auto docs = all_documents(lengths.size());
  const PlanOptions o = cut_options(0.05);
  const EpochPlan a = build_epoch_plan(lengths, docs, o, 12, 1);
  const EpochPlan b = build_epoch_plan(lengths, docs, o, 12, 1);
  EXPECT_EQ(plan_fingerprint(a), plan_fingerprint(b));
  ASSERT_GT(a.stats.cuts, 0u);
  PlanOptions off = o;
  off.cut_pieces = false;
  EXPECT_NE(plan_fingerprint(a), plan_fingerprint(build_epoch_plan(lengths, docs, off, 12, 1)));
  // Moving one cut changes the fingerprint: the same pieces with another offset.
  PlanSteps x(256, 2), y(256, 2);
  for (uint32_t cut_at : {100u, 101u}) {
    PlanSteps& steps = cut_at == 100 ? x : y;
    steps.add_piece(Piece{3, 0, cut_at, 0});
    steps.end_micro_batch();
    steps.end_rank();
    steps.add_piece(Piece{3, cut_at, 256 - cut_at, cut_at});
    steps.end_micro_batch();
    steps.end_rank();
    steps.end_step(256);
  }
  EpochPlan px, py;
  px.steps = std::move(x);
  py.steps = std::move(y);
  EXPECT_NE(plan_fingerprint(px), plan_fingerprint(py));
}

TEST(BalanceCut, PartsAreStoredWithTheirOffsets) {
  PlanSteps steps(512, 3, false, CostModel{1.0, 0.01, 0.0, 0.5});
  steps.add_piece(Piece{9, 1024, 200, 0});   // the first part of the piece at 1024
  steps.add_piece(Piece{4, 0, 17, 0});       // an uncut piece beside it
  steps.end_micro_batch();
  steps.end_rank();
  steps.add_piece(Piece{9, 1224, 250, 200});
  steps.end_micro_batch();
  steps.end_rank();
  steps.add_piece(Piece{9, 1474, 62, 450});
  steps.end_micro_batch();
  steps.end_rank();
  steps.end_step(529);
  const MicroBatch mid = steps[0].micro_batch(1);
  ASSERT_EQ(mid.pieces.size(), 1u);
  EXPECT_EQ(mid.pieces[0].start, 1224u);
  EXPECT_EQ(mid.pieces[0].len, 250u);
  EXPECT_EQ(mid.pieces[0].offset, 200u);
  EXPECT_EQ(mid.pieces[0].piece_start(), 1024u);
  EXPECT_DOUBLE_EQ(mid.attention_work(), 450.0 * 450 - 200.0 * 200);
  EXPECT_DOUBLE_EQ(mid.kv_tokens(), 200);
  EXPECT_DOUBLE_EQ(mid.cost, 250 + 0.01 * (450.0 * 450 - 200.0 * 200) + 0.5 * 200);
  EXPECT_EQ(steps[0].micro_batch(2).pieces[0].offset, 450u);
  EXPECT_EQ(steps[0].micro_batch(0).pieces[1].offset, 0u);
  const std::vector<CutPiece> cuts = step_cuts(steps[0]);
  ASSERT_EQ(cuts.size(), 1u);
  EXPECT_EQ(cuts[0].piece_start, 1024u);
  ASSERT_EQ(cuts[0].parts.size(), 3u);
  EXPECT_EQ(cuts[0].parts[2].rank, 2);
  EXPECT_EQ(cuts[0].parts[2].offset, 450u);
  // A part reaching past its piece's context is refused.
  PlanSteps bad(512, 1);
  EXPECT_THROW(bad.add_piece(Piece{9, 1224, 400, 200}), Error);
}

TEST(BalanceCut, TheSlotRuleIsChecked) {
  // Two parts of one piece at local micro-batches 0 and 1: step_cuts refuses the step.
  PlanSteps steps(256, 2);
  steps.add_piece(Piece{1, 0, 100, 0});
  steps.end_micro_batch();
  steps.end_rank();
  steps.add_piece(Piece{2, 0, 50, 0});
  steps.end_micro_batch();
  steps.add_piece(Piece{1, 100, 50, 100});
  steps.end_micro_batch();
  steps.end_rank();
  steps.end_step(200);
  EXPECT_THROW(step_cuts(steps[0]), Error);
}

TEST(BalanceCut, LongContextsAreChainsOfPartsWithinMaxTokens) {
  const auto lengths = corpus(600, "lognormal:6.5,0.8", 6);
  const auto docs = all_documents(lengths.size());
  for (bool cut : {false, true}) {
    PlanOptions o = cut_options(0.2);
    o.context = 1024;
    o.max_tokens = 256;
    o.tokens_per_step = 8192;
    o.cut_pieces = cut;
    const EpochPlan one = build_epoch_plan(lengths, docs, [&] { PlanOptions w = o; w.max_tokens = 1024; return w; }(), 1, 0);
    for (int world : {4, 5, 8}) {
      const EpochPlan plan = build_epoch_plan(lengths, docs, o, world, 0);
      EXPECT_GT(plan.stats.long_pieces, 0u);
      EXPECT_EQ(plan.stats.long_piece_ranks_max, 4u);
      ASSERT_EQ(plan.steps.size(), one.steps.size());
      for (uint64_t s = 0; s < plan.steps.size(); ++s) {
        const Step step = plan.steps[s].expand();
        std::vector<CutPiece> cuts;
        ASSERT_NO_THROW(cuts = step_cuts(step)) << "world " << world << " step " << s;
        for (const MicroBatch& mb : step.micro_batches) ASSERT_LE(mb.target_tokens, 256u);
        for (const CutPiece& c : cuts) EXPECT_LE(c.parts.size(), size_t(world));
        EXPECT_EQ(step_targets(step), step_targets(one.steps[s].expand()));
      }
    }
    try {
      build_epoch_plan(lengths, docs, o, 3, 0);
      FAIL() << "3 ranks cannot hold a 1024-token piece in 256-token micro-batches";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(">= 4 ranks"), std::string::npos) << e.what();
    }
    // A mixture of datasets: the same chains, counted, and the same refusal before any step.
    std::vector<uint64_t> first(docs.begin(), docs.begin() + 400), second(docs.begin() + 400, docs.end());
    MixturePlanner mixture(lengths, {MixtureSource{"a", 0.5, first}, MixtureSource{"b", 0.5, second}}, o);
    const EpochPlan mixed = mixture.build(0, 4);
    EXPECT_GT(mixed.stats.long_pieces, 0u);
    EXPECT_EQ(mixed.stats.long_piece_ranks_max, 4u);
    for (uint64_t s = 0; s < mixed.steps.size(); ++s)
      for (const MicroBatch& mb : mixed.steps[s].expand().micro_batches) ASSERT_LE(mb.target_tokens, 256u);
    try {
      mixture.build(0, 3);
      FAIL() << "a mixture on 3 ranks cannot hold a 1024-token piece in 256-token micro-batches";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("pieces of 1024 tokens"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(">= 4 ranks"), std::string::npos) << e.what();
    }
  }
}

TEST(BalanceCut, TransferCoefficientFromShapeAndLink) {
  // GPT-2 124M, bf16 K/V: 2 x 2 x 768 x 12 x 2 bytes per earlier token over 25 GB/s, against
  // 6 (12 x 12 x 768^2 + 768 x 50257) FLOPs at 400 TFLOP/s: the full transfer.
  const model::ModelSpec gpt2{12, 12, 768, 1024, 50257}, one_layer{1, 12, 768, 1024, 50257};
  const double full = kv_link_cost_coefficient(gpt2, 2, 200, 400);
  const double expect = (4.0 * 768 * 12 * 2 / 25e9) / (6.0 * (12.0 * 12 * 768 * 768 + 768.0 * 50257) / 400e12);
  EXPECT_NEAR(full, expect, 1e-12 * expect);
  EXPECT_NEAR(kv_link_cost_coefficient(gpt2, 2, 400, 400), full / 2, 1e-12);
  // The floor of what the plan charges: one layer's transfer each way, the others overlapped.
  EXPECT_NEAR(transfer_cost_coefficient(gpt2, 2, 200, 400), full / 12, 1e-12 * full);
  EXPECT_NEAR(transfer_cost_coefficient(one_layer, 2, 200, 400), kv_link_cost_coefficient(one_layer, 2, 200, 400),
              1e-15);
  EXPECT_DOUBLE_EQ(model::kv_bytes_per_token(gpt2, 2), 2.0 * 768 * 12 * 2);
  EXPECT_THROW(transfer_cost_coefficient(gpt2, 2, 0, 400), Error);
  EXPECT_THROW(kv_link_cost_coefficient(gpt2, 2, 400, 0), Error);
}

TEST(BalanceCut, LinkBoundTransferCostFollowsTheLayerPipeline) {
  // A slow link: t_link 4, 8 layers, a rank's load 1000, a reference prefix of 500 tokens. One
  // layer's transfer each way x = 500 x 4 / 16 = 125 outlasts a layer's forward (1000 / 24) and
  // backward (2000 / 24): exposed = x + 7 (x - c) each way.
  const double x = 500.0 * 4 / 16, c_fwd = 1000.0 / 24, c_bwd = 2000.0 / 24;
  const double slow = ((x + 7 * (x - c_fwd)) + (x + 7 * (x - c_bwd))) / 500;
  EXPECT_NEAR(link_bound_transfer_cost(4, 8, 1000, 500), slow, 1e-12);
  EXPECT_GT(slow, 4.0 / 8);
  // In between: x = 500 x 0.3 / 16 = 9.375 outlasts a layer's forward (150 / 24) but not its
  // backward (300 / 24): the backward exposes only its first layer.
  const double x_mid = 500.0 * 0.3 / 16;
  EXPECT_NEAR(link_bound_transfer_cost(0.3, 8, 150, 500), ((x_mid + 7 * (x_mid - 150.0 / 24)) + x_mid) / 500, 1e-12);
  // A link far slower than the compute: t approaches t_link (every layer's transfer exposed).
  EXPECT_NEAR(link_bound_transfer_cost(1e6, 8, 1000, 500) / 1e6, 1.0, 1e-3);
  // A fast link (x <= c both ways): one layer's transfer each way, t_link / n_layer exactly.
  EXPECT_DOUBLE_EQ(link_bound_transfer_cost(0.01, 12, 2048, 2048), 0.01 / 12);
  // One layer: the whole transfer, whatever the compute.
  EXPECT_DOUBLE_EQ(link_bound_transfer_cost(0.5, 1, 1e6, 1024), 0.5);
  EXPECT_THROW(link_bound_transfer_cost(1, 0, 1000, 500), Error);
  EXPECT_THROW(link_bound_transfer_cost(1, 4, 1000, 0), Error);
}

// The cut section of bench/balance_effect.sh on scripts/vcluster: 4 x 128 CPU model (fp32 K/V,
// byte vocab, 0.1 TFLOP/s), comm.link_gbps = 1, context 1024, one context per rank on 4 ranks.
Config vcluster_config() {
  Config cfg;
  cfg.model.n_layer = 4;
  cfg.model.n_head = 2;
  cfg.model.n_embd = 128;
  cfg.model.vocab_size = 256;
  cfg.model.block_size = 1024;
  cfg.data.max_tokens = 2048;
  cfg.train.tokens_per_step = 4 * 1024;
  cfg.train.backend = "cpu";
  cfg.comm.link_gbps = 1;
  return cfg;
}

TEST(BalanceCut, DerivedTransferCostIsRaisedWhereTheLinkSetsThePace) {
  Config cfg = vcluster_config();
  const PlanOptions slow = plan_options_from_config(cfg, 256);
  // t_link = 8192 bytes over 125 MB/s against 4.9152 MFLOP at 0.1 TFLOP/s = 4/3; floor t_link / 4.
  EXPECT_NEAR(slow.cost.t_link, 4.0 / 3, 1e-12);
  EXPECT_NEAR(slow.cost.t, 1.0 / 3, 1e-12);
  EXPECT_EQ(slow.cost.layers, 4);
  // s_ref = min(1024, 4096 / 4) = 1024, a rank's load 1024: x = 1024 x (4/3) / 8 = 512/3,
  // c_fwd = 1024 / 12 = 256/3 (exposed x + 3 (x - c_fwd) = 1280/3), c_bwd = 512/3 (exposed x):
  // t = (1280/3 + 512/3) / 1024 = 7/12.
  const CostModel resolved = resolve_cost_model(slow.cost, 1024, 4096, 4);
  EXPECT_NEAR(resolved.t, 7.0 / 12, 1e-12);
  EXPECT_EQ(resolved.t_link, slow.cost.t_link);
  // The plans charge it: the epoch plan and the mixture planner.
  const auto lengths = corpus(300, "lognormal:6,0.8,1024", 3);
  const auto docs = all_documents(lengths.size());
  EXPECT_NEAR(build_epoch_plan(lengths, docs, slow, 4, 0).cost.t, 7.0 / 12, 1e-12);
  MixturePlanner mixture(lengths, {MixtureSource{"all", 1.0, docs}}, slow);
  EXPECT_NEAR(mixture.build(0, 4).cost.t, 7.0 / 12, 1e-12);

  // A fast link (the default 400 Gbit/s): x << c, t stays t_link / n_layer.
  cfg.comm.link_gbps = 400;
  const PlanOptions fast = plan_options_from_config(cfg, 256);
  EXPECT_DOUBLE_EQ(resolve_cost_model(fast.cost, 1024, 4096, 4).t, fast.cost.t);
  EXPECT_DOUBLE_EQ(build_epoch_plan(lengths, docs, fast, 4, 0).cost.t, fast.cost.t);

  // A given data.cost_t (the user's or `kilter plan --calibrate`'s) stays, however slow the link.
  cfg.comm.link_gbps = 1;
  cfg.data.cost_t = 0.25;
  const PlanOptions given = plan_options_from_config(cfg, 256);
  EXPECT_EQ(given.cost.layers, 0);
  EXPECT_EQ(resolve_cost_model(given.cost, 1024, 4096, 4).t, 0.25);
  EXPECT_EQ(build_epoch_plan(lengths, docs, given, 4, 0).cost.t, 0.25);
  // So does a t set in code with t_link for the statistics only (layers 0).
  CostModel counted;
  counted.t = 0.01;
  counted.t_link = 1e9;
  EXPECT_EQ(resolve_cost_model(counted, 1024, 4096, 4).t, 0.01);
}

TEST(BalanceCut, LinkBoundPartsCountLaterPartsWhoseFullTransferOutlastsTheirRank) {
  const auto lengths = corpus(1500, "lognormal:4.8,1.1", 5);
  const auto docs = all_documents(lengths.size());
  PlanOptions o = cut_options(0.01);
  const EpochPlan unknown = build_epoch_plan(lengths, docs, o, 16, 0);
  ASSERT_GT(unknown.stats.cuts, 0u);
  EXPECT_EQ(unknown.stats.link_bound_parts, 0u);  // t_link unknown: not counted
  o.cost.t_link = 1e9;                              // every later part outlasts its rank
  const EpochPlan slow = build_epoch_plan(lengths, docs, o, 16, 0);
  EXPECT_EQ(slow.stats.link_bound_parts, slow.stats.cuts);
  // t_link only counts; the division is the same.
  EXPECT_EQ(plan_fingerprint(slow), plan_fingerprint(unknown));
  // In between: exactly the later parts with t_link x offset above their rank's cost.
  o.cost.t_link = 1.0;
  const EpochPlan mid = build_epoch_plan(lengths, docs, o, 16, 0);
  uint64_t expect = 0;
  for (uint64_t i = 0; i < mid.steps.size(); ++i) {
    const StepView step = mid.steps[i];
    const std::vector<double> loads = rank_costs(step);
    for (const CutPiece& cut : step_cuts(step))
      for (size_t k = 1; k < cut.parts.size(); ++k)
        expect += double(cut.parts[k].offset) > loads[size_t(cut.parts[k].rank)];
  }
  EXPECT_EQ(mid.stats.link_bound_parts, expect);
  EXPECT_LE(expect, mid.stats.cuts);
}

TEST(BalanceCut, DeviceRateDefaultsToTheBackends) {
  Config cfg;
  cfg.model.n_layer = 4;
  cfg.model.n_embd = 256;
  cfg.model.vocab_size = 256;
  cfg.train.backend = "cpu";
  cfg.train.threads = 2;
  ASSERT_EQ(cfg.comm.device_tflops, 0);  // auto
  EXPECT_DOUBLE_EQ(device_tflops(cfg), 2 * kCpuTflopsPerThread);
  const PlanOptions cpu = plan_options_from_config(cfg, 256);
  EXPECT_NEAR(cpu.cost.t, cfg.data.cost_a * transfer_cost_coefficient(cfg.model, 4, cfg.comm.link_gbps, 0.2), 1e-12);
  EXPECT_LT(cpu.cost.t, 0.1);  // a CPU rank's link is fast next to its compute
  cfg.train.backend = "cuda";
  EXPECT_DOUBLE_EQ(device_tflops(cfg), kGpuTflops);
  cfg.comm.device_tflops = 7;  // an explicit rate wins
  EXPECT_DOUBLE_EQ(device_tflops(cfg), 7);
  cfg.data.cost_t = 0.25;  // and so does an explicit t
  EXPECT_DOUBLE_EQ(plan_options_from_config(cfg, 256).cost.t, 0.25);
}

TEST(BalanceCut, MicroBatchCostDefaultsToTheBackends) {
  Config cfg;
  cfg.data.cost_a = 2;
  ASSERT_LT(cfg.data.cost_c, 0);  // the default: derived
  cfg.train.backend = "cpu";
  const PlanOptions cpu = plan_options_from_config(cfg, 256);
  EXPECT_EQ(cpu.cost.c, kCpuMicroBatchTokens * 2);
  EXPECT_EQ(resolve_cost_model(cpu.cost, 1024, 16384, 2).c, kCpuMicroBatchTokens * 2);
  cfg.train.backend = "cuda";
  const PlanOptions gpu = plan_options_from_config(cfg, 256);
  EXPECT_EQ(resolve_cost_model(gpu.cost, 1024, 16384, 2).c, kDefaultMicroBatchTokens * 2);
  // The two defaults differ, so a plan for a GPU job made on a CPU node must say cuda.
  EXPECT_NE(kCpuMicroBatchTokens, kDefaultMicroBatchTokens);
  cfg.train.backend = "auto";  // this process's device decides
  EXPECT_EQ(resolve_cost_model(plan_options_from_config(cfg, 256).cost, 1024, 16384, 2).c,
            (runs_on_cpu(cfg) ? kCpuMicroBatchTokens : kDefaultMicroBatchTokens) * 2);
  for (const char* backend : {"cpu", "cuda"}) {  // a given c wins on either
    cfg.train.backend = backend;
    cfg.data.cost_c = 190;
    EXPECT_EQ(resolve_cost_model(plan_options_from_config(cfg, 256).cost, 1024, 16384, 2).c, 190);
  }
}

}  // namespace
}  // namespace kilter::balance
