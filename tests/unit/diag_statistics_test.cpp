// Unit tests of the diagnostics statistics on synthetic step records: the straggler rule (found
// when one rank is slow, none when ranks are balanced or only noisy), stalls and their period,
// imbalance and sync-wait figures, the live watch, the inject_delay parser, and the CSV / trace
// files round trip.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/base/error.h"
#include "lib/diag/metrics_csv.h"
#include "lib/diag/run_statistics.h"
#include "lib/diag/straggler_watch.h"
#include "lib/diag/trace_writer.h"

namespace kilter::diag {
namespace {

// A step in which every rank spends `forward` + `backward` + 0.01 s optimizer, plus `extra`
// seconds of `extra_phase` on `slow_rank`; every rank waits in the collective for the last one.
std::vector<StepRecord> make_step(int world, int64_t step, double t0, int slow_rank, int extra_phase,
                                  double extra, std::mt19937* rng = nullptr, double jitter = 0) {
  std::vector<StepRecord> recs(world);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  double last_arrival = 0;
  for (int r = 0; r < world; ++r) {
    StepRecord& rec = recs[r];
    rec.rank = r;
    rec.step = step;
    rec.tokens = 1000;
    rec.loss = 5.0 - 0.01 * double(step);
    rec.start = t0;
    rec.phase[kDataWait] = 0.001;
    rec.phase[kForward] = 0.05 + (rng ? jitter * u(*rng) : 0);
    rec.phase[kBackward] = 0.1 + (rng ? jitter * u(*rng) : 0);
    if (r == slow_rank) rec.phase[extra_phase] += extra;
    double before = rec.phase[kDataWait] + rec.phase[kForward] + rec.phase[kBackward] + rec.phase[kKvWait];
    rec.arrival = t0 + before;
    last_arrival = std::max(last_arrival, rec.arrival);
    rec.peak_rss_bytes = 1000000 + 1000 * uint64_t(r);
  }
  for (auto& rec : recs) {
    rec.phase[kCommExposed] = last_arrival - rec.arrival + 0.002;
    rec.phase[kOptimizer] = 0.01;
    double sum = 0;
    for (int p = 0; p < kStepTotal; ++p) sum += rec.phase[p];
    rec.phase[kStepTotal] = sum;
  }
  return recs;
}

TEST(DiagStatistics, PercentileInterpolatesLikeNumpy) {
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4}, 50), 2.5);
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4, 5}, 95), 4.8);
  EXPECT_DOUBLE_EQ(percentile({7}, 95), 7);
  EXPECT_DOUBLE_EQ(median({3, 1, 2}), 2);
}

TEST(DiagStatistics, FindsStragglerAndItsPhase) {
  const int world = 4;
  RunStatistics stats(world);
  for (int s = 0; s < 30; ++s) {
    auto recs = make_step(world, s, s * 0.3, /*slow_rank=*/2, kForward, 0.05);
    stats.add_step(recs.data());
  }
  StragglerVerdict v = stats.straggler();
  EXPECT_EQ(v.rank, 2);
  EXPECT_EQ(v.phase, "forward");
  EXPECT_NEAR(v.phase_excess_seconds, 0.05, 1e-9);
  EXPECT_NEAR(v.mean_lag_seconds, 0.05, 1e-9);
  EXPECT_DOUBLE_EQ(v.share, 1.0);
  nlohmann::json j = stats.to_json();
  EXPECT_EQ(j["straggler_rank"], 2);
  EXPECT_EQ(j["straggler"]["phase"], "forward");
  // Three ranks wait 0.05 s for rank 2 every step.
  double step_total = 0.001 + 0.05 + 0.1 + 0.002 + 0.01;
  double expected_wait = 3 * 0.05 / (3 * (step_total + 0.05) + (step_total + 0.05));
  EXPECT_NEAR(stats.sync_wait_fraction(), expected_wait, 1e-9);
  // Compute time: rank 2 spends 0.05 s more than the others.
  double c = 0.001 + 0.05 + 0.1 + 0.002 + 0.01 - 0.002;  // step_total - comm_exposed (0.002 for rank 2)
  double mean = (3 * c + (c + 0.05)) / 4;
  EXPECT_NEAR(stats.step_time_imbalance_percentile(95), (c + 0.05) / mean, 1e-9);
}

TEST(DiagStatistics, FindsBackwardStragglerAmongEight) {
  const int world = 8;
  RunStatistics stats(world);
  std::mt19937 rng(7);
  for (int s = 0; s < 40; ++s) {
    auto recs = make_step(world, s, s * 0.3, 5, kBackward, 0.04, &rng, 0.002);
    stats.add_step(recs.data());
  }
  EXPECT_EQ(stats.straggler().rank, 5);
  EXPECT_EQ(stats.straggler().phase, "backward");
}

TEST(DiagStatistics, NoStragglerWhenBalanced) {
  const int world = 4;
  RunStatistics stats(world);
  for (int s = 0; s < 30; ++s) {
    auto recs = make_step(world, s, s * 0.3, -1, kForward, 0);
    stats.add_step(recs.data());
  }
  EXPECT_EQ(stats.straggler().rank, -1);
  EXPECT_NEAR(stats.sync_wait_fraction(), 0.0, 1e-12);
  EXPECT_NEAR(stats.step_time_imbalance_percentile(95), 1.0, 1e-12);
  EXPECT_TRUE(stats.stalls().empty());
}

TEST(DiagStatistics, NoStragglerWhenLastRankIsRandom) {
  // Noise well beyond the 5% threshold, but no rank is systematically last.
  const int world = 4;
  RunStatistics stats(world);
  std::mt19937 rng(1234);
  for (int s = 0; s < 200; ++s) {
    auto recs = make_step(world, s, s * 0.3, -1, kForward, 0, &rng, 0.05);
    stats.add_step(recs.data());
  }
  StragglerVerdict v = stats.straggler();
  EXPECT_EQ(v.rank, -1);
  EXPECT_GE(v.candidate, 0);      // someone is last most often, but not significantly
  EXPECT_LT(v.share, v.threshold);
}

TEST(DiagStatistics, TooFewStepsNameNobody) {
  RunStatistics stats(4);
  for (int s = 0; s < 3; ++s) {
    auto recs = make_step(4, s, s * 0.3, 1, kForward, 0.05);
    stats.add_step(recs.data());
  }
  EXPECT_EQ(stats.straggler().rank, -1);
  EXPECT_EQ(stats.straggler().candidate, 1);
}

TEST(DiagStatistics, SingleRankHasNoStraggler) {
  RunStatistics stats(1);
  for (int s = 0; s < 10; ++s) {
    auto recs = make_step(1, s, s * 0.3, 0, kForward, 0.05);
    stats.add_step(recs.data());
  }
  EXPECT_EQ(stats.straggler().rank, -1);
  EXPECT_DOUBLE_EQ(stats.sync_wait_fraction(), 0.0);
}

TEST(DiagStatistics, PeriodicStallsWithPhaseAndPeriod) {
  const int world = 2;
  RunStatistics stats(world, 2.0);
  for (int s = 0; s < 60; ++s) {
    auto recs = make_step(world, s, s * 0.3, -1, kForward, 0);
    if (s == 0)
      for (auto& r : recs) r.phase[kForward] += 0.5, r.phase[kStepTotal] += 0.5;  // warm-up step
    if (s % 10 == 9)
      for (auto& r : recs) r.outside = 0.8;  // a checkpoint between steps
    stats.add_step(recs.data());
  }
  std::vector<Stall> stalls = stats.stalls();
  ASSERT_EQ(stalls.size(), 7u);  // step 0 and steps 9, 19, ..., 59
  EXPECT_EQ(stalls[0].step, 0);
  EXPECT_EQ(stalls[0].phase, "forward");
  EXPECT_EQ(stalls[1].step, 9);
  EXPECT_EQ(stalls[1].phase, "outside");
  EXPECT_NEAR(stalls[1].excess_seconds, 0.8, 1e-9);
  EXPECT_EQ(stats.stall_period(), 10);
  nlohmann::json j = stats.to_json();
  EXPECT_EQ(j["stalls"]["count"], 7);
  EXPECT_EQ(j["stalls"]["period"], 10);
}

TEST(DiagStatistics, IrregularStallsHaveNoPeriod) {
  RunStatistics stats(2, 2.0);
  const std::vector<int> slow = {4, 11, 13, 30, 47};
  for (int s = 0; s < 50; ++s) {
    auto recs = make_step(2, s, s * 0.3, -1, kForward, 0);
    if (std::find(slow.begin(), slow.end(), s) != slow.end())
      for (auto& r : recs) r.phase[kBackward] += 0.6, r.phase[kStepTotal] += 0.6;
    stats.add_step(recs.data());
  }
  ASSERT_EQ(stats.stalls().size(), slow.size());
  EXPECT_EQ(stats.stalls()[2].phase, "backward");
  EXPECT_EQ(stats.stall_period(), 0);
}

TEST(DiagStatistics, MemoryAsymmetry) {
  RunStatistics stats(4);
  auto recs = make_step(4, 0, 0, -1, kForward, 0);
  recs[3].peak_rss_bytes = 2000000;
  recs[0].peak_rss_bytes = 1000000;
  stats.add_step(recs.data());
  nlohmann::json j = stats.to_json();
  EXPECT_DOUBLE_EQ(j["memory"]["rss_max_min_ratio"].get<double>(), 2.0);
  EXPECT_EQ(j["memory"]["peak_rss_bytes"][3], 2000000);
}

TEST(DiagStragglerWatch, WarnsOnceNamingRankAndPhase) {
  const int world = 4, window = 10;
  StragglerWatch watch(world, window);
  std::vector<std::string> warnings;
  std::vector<int> warned_at;
  for (int s = 0; s < 100; ++s) {
    auto recs = make_step(world, s, s * 0.3, s >= 5 ? 1 : -1, kDataWait, 0.05);
    std::string w = watch.add_step(recs.data());
    if (!w.empty()) warnings.push_back(w), warned_at.push_back(s);
  }
  // Rank 1 is last from step 5 on. With 4 ranks and a 10-step window the share must clear
  // max(0.6, 1/4 + 3 sigma) = 0.66: 7 of 10 at step 11, warned then, and repeated after 1, 2, 4
  // windows (steps 21, 41, 81).
  ASSERT_EQ(warned_at, (std::vector<int>{11, 21, 41, 81}));
  EXPECT_NE(warnings[0].find("rank 1 "), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("data_wait"), std::string::npos) << warnings[0];
  EXPECT_EQ(warnings[0].find('\n'), std::string::npos);
}

// A rank last because it waited for a cut piece's K/V: the warning names kv_wait and the rank
// it waited for; the run statistics say the same.
TEST(DiagStragglerWatch, KvWaitNamesTheRankWaitedFor) {
  const int world = 4, window = 10;
  StragglerWatch watch(world, window);
  RunStatistics stats(world);
  std::string warning;
  for (int s = 0; s < 12; ++s) {
    auto recs = make_step(world, s, s * 0.3, 2, kKvWait, 0.05);
    recs[2].kv_wait_peer = s % 4 == 0 ? 1 : 0;  // mostly rank 0
    recs[2].kv_tokens = 64;
    recs[2].kv_bytes = 4096;
    stats.add_step(recs.data());
    std::string w = watch.add_step(recs.data());
    if (!w.empty() && warning.empty()) warning = w;
  }
  EXPECT_NE(warning.find("rank 2 "), std::string::npos) << warning;
  EXPECT_NE(warning.find("slowest phase: kv_wait"), std::string::npos) << warning;
  EXPECT_NE(warning.find("held by rank 0"), std::string::npos) << warning;
  const StragglerVerdict v = stats.straggler();
  EXPECT_EQ(v.rank, 2);
  EXPECT_EQ(v.phase, "kv_wait");
  EXPECT_EQ(v.kv_wait_for_rank, 0);
  const nlohmann::json j = stats.to_json();
  EXPECT_EQ(j["kv_tokens_per_step"], 64.0);
  EXPECT_EQ(j["kv_bytes_per_step"], 2048.0);
  EXPECT_GT(j["kv_wait_fraction"].get<double>(), 0.0);
  // kv_wait is waiting, not the rank's own compute.
  EXPECT_NEAR(stats.compute_mean(2), stats.compute_mean(1), 1e-9);
}

TEST(DiagStragglerWatch, NewRankIsReportedAtOnce) {
  StragglerWatch watch(4, 10);
  std::vector<int> warned_at;
  for (int s = 0; s < 40; ++s) {
    auto recs = make_step(4, s, s * 0.3, s < 20 ? 1 : 3, kForward, 0.05);
    if (!watch.add_step(recs.data()).empty()) warned_at.push_back(s);
  }
  // Rank 1 at step 9 (window full), again at 19; rank 3 once it is last in 7 of 10 (step 26),
  // repeated a window later.
  EXPECT_EQ(warned_at, (std::vector<int>{9, 19, 26, 36}));
}

TEST(DiagStragglerWatch, SilentWhenBalanced) {
  StragglerWatch watch(4, 10);
  std::mt19937 rng(99);
  for (int s = 0; s < 100; ++s) {
    auto recs = make_step(4, s, s * 0.3, -1, kForward, 0, &rng, 0.001);
    EXPECT_EQ(watch.add_step(recs.data()), "");
  }
}

TEST(DiagInjectDelay, ParsesAndRefuses) {
  InjectDelay d = parse_inject_delay("2:0.05");
  EXPECT_TRUE(d.active);
  EXPECT_EQ(d.rank, 2);
  EXPECT_DOUBLE_EQ(d.seconds, 0.05);
  EXPECT_EQ(d.phase, kForward);
  d = parse_inject_delay("0:1:optimizer");
  EXPECT_EQ(d.phase, kOptimizer);
  EXPECT_FALSE(parse_inject_delay("").active);
  for (const char* bad : {"2", "x:0.1", "2:abc", "2:-1", "2:0.1:comm_exposed", "2:0.1:warp", "-1:0.1",
                          "2:0.1:forward:extra", "2:nan"}) {
    try {
      parse_inject_delay(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const kilter::Error& e) {
      EXPECT_NE(std::string(e.what()).find("train.inject_delay"), std::string::npos) << e.what();
    }
  }
}

// The proportional form (issue 39): RANK:SHARE%[:PHASE].
TEST(DiagInjectDelay, ParsesTheProportionalForm) {
  InjectDelay d = parse_inject_delay("5:15%");
  EXPECT_TRUE(d.active);
  EXPECT_EQ(d.rank, 5);
  EXPECT_DOUBLE_EQ(d.share, 0.15);
  EXPECT_EQ(d.seconds, 0.0);
  EXPECT_TRUE(d.every_compute) << "no PHASE: forward and backward";
  d = parse_inject_delay("1:20%:backward");
  EXPECT_DOUBLE_EQ(d.share, 0.2);
  EXPECT_FALSE(d.every_compute);
  EXPECT_EQ(d.phase, kBackward);
  EXPECT_EQ(parse_inject_delay("2:0.05").share, 0.0) << "the absolute form stays";
  for (const char* bad : {"1:%", "1:-5%", "1:x%", "1:2000%", "1:15%:comm_exposed"})
    EXPECT_THROW(parse_inject_delay(bad), kilter::Error) << bad;
}

class DiagFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("kilter-diag-unit-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(DiagFiles, MetricsCsvRoundTripAndTruncatedTail) {
  std::string path = (dir_ / "rank-00001.csv").string();
  auto recs = make_step(2, 0, 1.5, 1, kForward, 0.05);
  {
    MetricsCsvWriter w(path);
    for (int s = 0; s < 3; ++s) {
      StepRecord r = recs[1];
      r.step = s;
      r.tokens_computed = 4096 + s;
      r.attn_work = 1e6;
      r.phase[kKvWait] = 0.0125;
      r.kv_tokens = 300 + s;
      r.kv_bytes = 1 << 20;
      r.kv_wait_peer = s == 0 ? -1 : 3;
      w.append(r);
    }
  }
  std::vector<StepRecord> back = read_metrics_csv(path, 1);
  ASSERT_EQ(back.size(), 3u);
  EXPECT_EQ(back[2].step, 2);
  EXPECT_EQ(back[2].tokens_computed, 4098);
  EXPECT_EQ(back[0].rank, 1);
  EXPECT_NEAR(back[0].phase[kForward], recs[1].phase[kForward], 1e-9);
  EXPECT_NEAR(back[0].arrival, recs[1].arrival, 1e-9);
  EXPECT_EQ(back[0].peak_rss_bytes, recs[1].peak_rss_bytes);
  EXPECT_NEAR(back[1].phase[kKvWait], 0.0125, 1e-12);
  EXPECT_EQ(back[2].kv_tokens, 302);
  EXPECT_EQ(back[2].kv_bytes, 1 << 20);
  EXPECT_EQ(back[0].kv_wait_peer, -1);
  EXPECT_EQ(back[1].kv_wait_peer, 3);
  // A crash mid-row: the partial row is dropped, earlier rows stay.
  { std::ofstream(path, std::ios::app) << "3,1000,4.9,0.001"; }
  EXPECT_EQ(read_metrics_csv(path, 1).size(), 3u);
  // A malformed number in a complete row is an error naming the file and column.
  {
    std::string bad_row = "4,1000,oops";
    const std::string header = metrics_csv_header();
    size_t columns = std::count(header.begin(), header.end(), ',') + 1;
    for (size_t c = 3; c < columns; ++c) bad_row += ",0";
    std::ofstream(path, std::ios::app) << "\n" << bad_row << "\n5,1\n";
  }
  try {
    read_metrics_csv(path, 1);
    ADD_FAILURE() << "accepted a malformed row";
  } catch (const kilter::Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

TEST_F(DiagFiles, TraceIsValidJsonAfterEveryFlush) {
  std::string path = (dir_ / "rank-00003.json").string();
  TraceWriter t(path, 3);
  auto parse = [&] {
    std::ifstream in(path);
    return nlohmann::json::parse(in);
  };
  EXPECT_EQ(parse().size(), 3u);  // metadata only
  t.add_complete("forward", 10.0, 5.5, 0);
  t.add_instant("arrival", 16.0, 0);
  t.flush();
  nlohmann::json j = parse();
  ASSERT_EQ(j.size(), 5u);
  EXPECT_EQ(j[3]["ph"], "X");
  EXPECT_EQ(j[3]["pid"], 3);
  EXPECT_DOUBLE_EQ(j[3]["dur"].get<double>(), 5.5);
  t.add_complete("backward", 20.0, 1.0, 1);
  t.flush();
  EXPECT_EQ(parse().size(), 6u);
}

}  // namespace
}  // namespace kilter::diag
