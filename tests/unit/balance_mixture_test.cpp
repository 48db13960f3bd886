// lib/balance/mixture (issue 26): data.sources parsing, and the mixture draw: shares follow the
// weights, steps hold the same pieces for every world size, an epoch is the same whether built
// first or after others, and a source that runs out wraps on its own.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "io/base/error.h"
#include "lib/balance/mixture.h"
#include "lib/core/config.h"

namespace kilter::balance {
namespace {

std::string error_of(const std::string& text) {
  try {
    parse_data_sources(text);
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

TEST(MixtureSources, ParsesAndNormalizes) {
  const auto s = parse_data_sources(" data/a:7 ,data/b:2, c:1 ");
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].first, "data/a");
  EXPECT_DOUBLE_EQ(s[0].second, 0.7);
  EXPECT_DOUBLE_EQ(s[2].second, 0.1);
  EXPECT_NE(error_of("data/a").find("is not DIR:WEIGHT"), std::string::npos);
  EXPECT_NE(error_of("a:0.5, b:-1").find("the weight of b ('-1') is not a positive number"), std::string::npos);
  EXPECT_NE(error_of("a:0.5, a:0.5").find("a is listed twice"), std::string::npos);
}

// Three sources of 100, 40 and 10 documents with lengths 1..120 (global ids in that order).
struct ThreeSources {
  std::vector<uint32_t> lengths;
  std::vector<MixtureSource> sources;
  PlanOptions opts;
  ThreeSources() {
    uint64_t doc = 0;
    const std::vector<std::pair<uint64_t, double>> spec = {{100, 0.5}, {40, 0.3}, {10, 0.2}};
    for (size_t k = 0; k < spec.size(); ++k) {
      MixtureSource s{"s" + std::to_string(k), spec[k].second, {}};
      for (uint64_t i = 0; i < spec[k].first; ++i, ++doc) {
        lengths.push_back(uint32_t(1 + (doc * 37) % 120));
        s.docs.push_back(doc);
      }
      sources.push_back(s);
    }
    opts.context = 64;
    opts.max_tokens = 256;
    opts.tokens_per_step = 512;
  }
  std::vector<uint64_t> doc_begin() const { return {0, 100, 140, 150}; }
};

// A step's tokens as (doc, start, len) spans, sorted, adjacent spans of a document merged: what the
// step holds, whoever computes it (a piece cut between ranks counts once).
std::vector<std::tuple<uint64_t, uint32_t, uint32_t>> pieces_of(const StepView& step) {
  std::vector<std::tuple<uint64_t, uint32_t, uint32_t>> spans, out;
  MicroBatch mb;
  for (uint32_t id = 0; id < step.micro_batch_count(); ++id) {
    step.micro_batch(id, mb);
    for (const Piece& p : mb.pieces) spans.emplace_back(p.doc, p.start, p.len);
  }
  std::sort(spans.begin(), spans.end());
  for (const auto& [doc, start, len] : spans) {
    if (!out.empty() && std::get<0>(out.back()) == doc && std::get<1>(out.back()) + std::get<2>(out.back()) == start)
      std::get<2>(out.back()) += len;
    else
      out.emplace_back(doc, start, len);
  }
  return out;
}

TEST(MixturePlanner, SharesFollowTheWeightsForEveryWorldSize) {
  ThreeSources t;
  MixturePlanner one(t.lengths, t.sources, t.opts), three(t.lengths, t.sources, t.opts);
  std::vector<SourceWrap> wraps;
  const EpochPlan a = one.build(0, 1, &wraps);
  const EpochPlan b = three.build(0, 3);
  ASSERT_EQ(a.steps.size(), one.steps_per_epoch());
  ASSERT_EQ(a.steps.size(), b.steps.size());
  std::vector<uint64_t> tokens(3, 0);
  for (uint64_t s = 0; s < a.steps.size(); ++s) {
    EXPECT_EQ(pieces_of(a.steps[s]), pieces_of(b.steps[s])) << "step " << s;
    const auto by_source = tokens_by_source(a.steps[s], t.doc_begin());
    for (size_t k = 0; k < 3; ++k) tokens[k] += by_source[k];
  }
  const double total = double(std::accumulate(tokens.begin(), tokens.end(), uint64_t(0)));
  for (size_t k = 0; k < 3; ++k) EXPECT_NEAR(double(tokens[k]) / total, t.sources[k].weight, 0.01) << k;
  // The smallest source (10 documents for 20% of the tokens) runs out and wraps within the epoch.
  ASSERT_FALSE(wraps.empty());
  EXPECT_TRUE(std::any_of(wraps.begin(), wraps.end(), [](const SourceWrap& w) { return w.source == 2 && w.source_epoch == 1; }));
  EXPECT_FALSE(std::any_of(wraps.begin(), wraps.end(), [](const SourceWrap& w) { return w.source == 0; }));
}

TEST(MixturePlanner, AnEpochIsTheSameBuiltFirstOrAfterOthers) {
  ThreeSources t;
  MixturePlanner direct(t.lengths, t.sources, t.opts), in_order(t.lengths, t.sources, t.opts);
  in_order.build(0, 2);
  in_order.build(1, 2);
  const EpochPlan a = direct.build(2, 2), b = in_order.build(2, 2);
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (uint64_t s = 0; s < a.steps.size(); ++s) EXPECT_EQ(pieces_of(a.steps[s]), pieces_of(b.steps[s])) << s;
  // Another seed draws other steps.
  t.opts.seed += 1;
  MixturePlanner other(t.lengths, t.sources, t.opts);
  EXPECT_NE(pieces_of(other.build(2, 2).steps[0]), pieces_of(a.steps[0]));
}

}  // namespace
}  // namespace kilter::balance
