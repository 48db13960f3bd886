// Unit tests of the cost-model calibration (lib/balance/calibration_fit.h) and of the synthetic
// length generator used by `kilter plan --lengths`.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "io/base/error.h"
#include "lib/balance/calibration_fit.h"
#include "lib/balance/rng.h"
#include "lib/balance/synthetic_lengths.h"

namespace kilter::balance {
namespace {

// Rank-steps of packed micro-batches: k micro-batches of pieces of varied lengths.
std::vector<CostSample> synthetic_samples(double a, double b, double c, double noise, int n, bool vary_mb = true) {
  Xoshiro256 rng(3);
  std::vector<CostSample> out;
  for (int i = 0; i < n; ++i) {
    CostSample s;
    s.micro_batches = vary_mb ? double(1 + rng.below(4)) : 2.0;
    const double pieces = 1 + double(rng.below(32));
    for (int p = 0; p < int(pieces); ++p) {
      const double len = 1 + double(rng.below(1024));
      s.tokens_computed += len;
      s.attn_work += len * len;
    }
    const double jitter = noise * (2 * rng.uniform_open0() - 1);
    s.seconds = (a * s.tokens_computed + b * s.attn_work + c * s.micro_batches) * (1 + jitter);
    out.push_back(s);
  }
  return out;
}

TEST(BalanceCalibrate, RecoversKnownCoefficients) {
  const double a = 2e-6, b = 3e-9, c = 1e-3;
  const CostFit exact = fit_cost_model(synthetic_samples(a, b, c, 0.0, 200));
  EXPECT_FALSE(exact.c_from_intercept);
  EXPECT_NEAR(exact.a / a, 1.0, 1e-6);
  EXPECT_NEAR(exact.b / b, 1.0, 1e-6);
  EXPECT_NEAR(exact.c / c, 1.0, 1e-6);
  EXPECT_NEAR(exact.intercept, 0.0, 1e-9);
  EXPECT_NEAR(exact.r2, 1.0, 1e-9);
  const CostFit noisy = fit_cost_model(synthetic_samples(a, b, c, 0.02, 4000));
  EXPECT_NEAR(noisy.a / a, 1.0, 0.05);
  EXPECT_NEAR(noisy.b / b, 1.0, 0.05);
  EXPECT_NEAR(noisy.c / c, 1.0, 0.1);
  EXPECT_NEAR(noisy.b_over_a(), b / a, 0.05 * b / a);
  EXPECT_NEAR(noisy.c_over_a(), c / a, 0.1 * c / a);
  EXPECT_GT(noisy.r2, 0.99);
  EXPECT_LT(noisy.r2, 1.0);
  // Noise as large as the signal's spread: R^2 drops well below the 0.9 bar.
  const CostFit bad = fit_cost_model(synthetic_samples(a, b, c, 0.9, 400));
  EXPECT_LT(bad.r2, 0.9);
}

TEST(BalanceCalibrate, ConstantMicroBatchesFoldTheFixedTimeIntoC) {
  const double a = 2e-6, b = 3e-9, c = 1e-3;
  const CostFit fit = fit_cost_model(synthetic_samples(a, b, c, 0.0, 200, false));
  EXPECT_TRUE(fit.c_from_intercept);
  EXPECT_NEAR(fit.a / a, 1.0, 1e-6);
  EXPECT_NEAR(fit.b / b, 1.0, 1e-6);
  EXPECT_NEAR(fit.c / c, 1.0, 1e-4) << "2 micro-batches per sample: intercept 2c, so c = intercept / 2";
  EXPECT_EQ(fit.intercept, 0.0);
}

TEST(BalanceCalibrate, RefusesCollinearOrTooFewSamples) {
  std::vector<CostSample> same_length;
  for (int pieces = 1; pieces <= 10; ++pieces)
    same_length.push_back({pieces * 100.0, pieces * 100.0 * 100.0, pieces * 1e-3, double(1 + pieces % 3)});
  EXPECT_THROW(fit_cost_model(same_length), Error);
  EXPECT_THROW(fit_cost_model(synthetic_samples(1, 1, 0, 0, 3)), Error);
}

TEST(BalanceCalibrate, ReadsRunMetricsAndSkipsWarmupAndIdleRows) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("kilter-calibrate-" + std::to_string(::getpid()));
  fs::create_directories(dir / "metrics");
  const double a = 1e-6, b = 2e-9, c = 4e-4;
  for (int rank = 0; rank < 2; ++rank) {
    std::ofstream f(dir / "metrics" / ("rank-0000" + std::to_string(rank) + ".csv"));
    f << "step,tokens,loss,data_wait,forward,backward,tokens_computed,attn_work,micro_batches\n";
    for (int step = 0; step < 20; ++step) {
      const double len = 32.0 * (1 + (step * 7 + rank * 3) % 17), rows = 1 + (step + rank) % 5;
      const double mbs = 1 + (step * 3 + rank) % 4;
      const double tokens = rows * len + 7 * mbs, work = rows * len * len + 49 * mbs;
      const double total = step == 0 ? 5.0 : a * tokens + b * work + c * mbs;  // step 0: slow warm-up
      f << step << "," << tokens << ",3.2,0.001," << total / 3 << "," << 2 * total / 3 << "," << tokens << ","
        << work << "," << mbs << "\n";
    }
    f << 20 << ",0,3.1,0.0,0.0,0.0,0,0,0\n";  // an idle rank-step
  }
  const auto samples = read_cost_samples(dir.string(), 1);
  EXPECT_EQ(samples.size(), 2u * 19u);
  const CostFit fit = fit_cost_model(samples);
  EXPECT_FALSE(fit.c_from_intercept);
  EXPECT_NEAR(fit.a / a, 1.0, 1e-3);
  EXPECT_NEAR(fit.b / b, 1.0, 1e-3);
  EXPECT_NEAR(fit.c / c, 1.0, 1e-3);
  EXPECT_GT(fit.r2, 0.999);

  std::ofstream(dir / "metrics" / "rank-00002.csv") << "step,forward,backward\n1,0.1,0.2\n";
  try {
    read_cost_samples(dir.string(), 1);
    ADD_FAILURE() << "a file without tokens_computed must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokens_computed"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank-00002.csv"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
  EXPECT_THROW(read_cost_samples(dir.string(), 0), Error);
}

TEST(BalanceSynthetic, LengthSpecsParseAndGenerateDeterministically) {
  const LengthSpec u = parse_length_spec("uniform:5,9");
  const auto lengths = synthetic_lengths(u, 1000, 1);
  for (uint32_t l : lengths) {
    EXPECT_GE(l, 5u);
    EXPECT_LE(l, 9u);
  }
  EXPECT_EQ(lengths, synthetic_lengths(u, 1000, 1));
  EXPECT_NE(lengths, synthetic_lengths(u, 1000, 2));
  const auto logn = synthetic_lengths(parse_length_spec("lognormal:5,1,300"), 20000, 1);
  int capped = 0;
  for (uint32_t l : logn) {
    EXPECT_LE(l, 300u);
    capped += l == 300;
  }
  EXPECT_GT(capped, 0);
  std::vector<uint32_t> sorted = logn;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_NEAR(double(sorted[sorted.size() / 2]), std::exp(5.0), 10.0) << "median of lognormal(5, 1)";
  EXPECT_THROW(parse_length_spec("gamma:1,2"), Error);
  EXPECT_THROW(parse_length_spec("uniform:9,5"), Error);
  EXPECT_THROW(parse_length_spec("lognormal:5"), Error);
  EXPECT_THROW(parse_length_spec("lognormal:5,x"), Error);
}

TEST(BalanceCalibrate, TransferCostFromKvWaitOrKeptDerived) {
  std::vector<CostSample> samples(6);
  for (size_t i = 0; i < samples.size(); ++i) {
    samples[i].tokens_computed = 1000;
    samples[i].kv_tokens = i % 2 ? double(100 * i) : 0;  // ranks without cut pieces: no wait
    samples[i].kv_wait = 3e-7 * samples[i].kv_tokens;
  }
  const TransferFit fit = fit_transfer_cost(samples);
  ASSERT_TRUE(fit.measured);
  EXPECT_EQ(fit.samples, 3u);
  EXPECT_NEAR(fit.seconds_per_token, 3e-7, 1e-15);
  EXPECT_NEAR(fit.cost_t(1e-6), 0.3, 1e-9) << "in dense tokens: 3e-7 s over 1e-6 s per token";
  // An earlier part's rank waiting for dK/dV (it received no K/V) is part of what the cuts cost:
  // 0.09 s more over the 900 earlier tokens received.
  samples[0].kv_wait = 0.09;
  EXPECT_NEAR(fit_transfer_cost(samples).seconds_per_token, 3e-7 + 1e-4, 1e-12);
  EXPECT_EQ(fit_transfer_cost(samples).samples, 3u) << "rows that received K/V";
  for (CostSample& s : samples) s.kv_tokens = s.kv_wait = 0;
  EXPECT_FALSE(fit_transfer_cost(samples).measured) << "no cut piece in the run: keep the derived t";
}

// kilter report's advice on cut pieces: only where the measured charge exceeds 1.5x the planned
// one and the miss costs a receiving rank at least 2% of its step (the check's rule, in the plan's
// units), naming the figures and the settings.
TEST(BalanceCalibrate, CutCostAdviceOnlyWhereTheChargeDidNotHold) {
  CostModel cost;  // a = 1, b = c = 0: a unit is a token, 1e-6 s here
  cost.c = 0;
  cost.t = 0.583;
  // Ranks that received 200 earlier tokens' K/V while computing 1000 tokens, and one that received none.
  std::vector<CostSample> samples(3);
  for (CostSample& s : samples) {
    s.tokens_computed = 1000;
    s.seconds = 1e-3;
  }
  samples[0].kv_tokens = samples[1].kv_tokens = 200;
  samples[0].kv_wait = samples[1].kv_wait = 200 * 3e-6;
  // 3e-6 s over 1e-6 s per dense token: t = 3 against a planned 0.583: (3 - 0.583) x 400 / 2000 = 48%.
  const std::string advice = cut_cost_advice(check_cut_cost(samples, cost));
  EXPECT_NE(advice.find("t = 3 dense tokens"), std::string::npos) << advice;
  EXPECT_NE(advice.find("(2 (rank, step) rows)"), std::string::npos) << advice;
  EXPECT_NE(advice.find("the plan cut with t = 0.583"), std::string::npos) << advice;
  EXPECT_NE(advice.find("about 48% of the step"), std::string::npos) << advice;
  EXPECT_NE(advice.find("data.cost_t = 3"), std::string::npos) << advice;
  EXPECT_NE(advice.find("data.cut_pieces = false"), std::string::npos) << advice;
  // The unit is the plan's: with attention counted (b), a unit takes less time and t grows.
  cost.b = 1e-4;  // 1e5 attention work: 10 more units per row
  for (CostSample& s : samples) s.attn_work = 1e5;
  EXPECT_NE(cut_cost_advice(check_cut_cost(samples, cost)).find("t = 3.03 dense"), std::string::npos);
  cost.b = 0;
  for (CostSample& s : samples) s.attn_work = 0;
  cost.t = 2.5;
  EXPECT_EQ(cut_cost_advice(check_cut_cost(samples, cost)), "") << "3 is within 1.5x of 2.5: the charge held";
  // Far above the plan's charge but small in the step (a fast link: 0.03 vs 0.0008, here 0.6% of
  // the step): no advice, the cuts' gain outweighs it.
  cost.t = 0.0008;
  samples[0].kv_wait = samples[1].kv_wait = 200 * 3e-8;
  EXPECT_EQ(cut_cost_advice(check_cut_cost(samples, cost)), "") << "a miss below 2% of the step";
  cost.t = 0.583;
  for (CostSample& s : samples) s.kv_tokens = s.kv_wait = 0;
  EXPECT_EQ(cut_cost_advice(check_cut_cost(samples, cost)), "") << "no transfer measured";
}

// The trainer's cut-cost check (data.cut_cost_check): seconds per unit of the plan's own cost
// from the window's rows, the transfer from their kv_wait, and a re-plan only where the measured
// charge is above 1.5x the planned one and the miss costs a receiving rank >= 2% of its step.
TEST(BalanceCalibrate, CutCostCheckMeasuresInThePlansUnit) {
  CostModel cost;
  cost.a = 1;
  cost.b = 0.001;
  cost.c = 100;
  cost.t = 0.5;
  // Four rows: 1000 tokens, attention 1e5 (100 units), 1 micro-batch (100 units): 1200 units in
  // 1.2 ms, i.e. 1e-6 s per unit. Two rows received 200 earlier tokens' K/V.
  std::vector<CostSample> samples(4);
  for (CostSample& s : samples) {
    s.tokens_computed = 1000;
    s.attn_work = 1e5;
    s.micro_batches = 1;
    s.seconds = 1.2e-3;
  }
  samples[0].kv_tokens = samples[1].kv_tokens = 200;
  samples[0].kv_wait = samples[1].kv_wait = 200 * 3e-6;  // 3e-6 s per earlier token: t = 3
  CutCostCheck check = check_cut_cost(samples, cost);
  ASSERT_TRUE(check.measured);
  EXPECT_EQ(check.rows, 2u);
  EXPECT_NEAR(check.measured_t, 3.0, 1e-9);
  EXPECT_DOUBLE_EQ(check.planned_t, 0.5);
  EXPECT_NEAR(check.excess_share, (3.0 - 0.5) * 400 / 2000, 1e-9);
  EXPECT_TRUE(check.replan);
  // Within 1.5x of the charge: it holds.
  cost.t = 2.5;
  EXPECT_FALSE(check_cut_cost(samples, cost).replan);
  // Far above the charge but a small share of the step: no re-plan.
  cost.t = 0.001;
  samples[0].kv_wait = samples[1].kv_wait = 200 * 3e-8;  // t = 0.03: 0.6% of the step
  check = check_cut_cost(samples, cost);
  EXPECT_TRUE(check.measured);
  EXPECT_FALSE(check.replan) << check.excess_share;
  // No rank received K/V: nothing measured, nothing changes.
  for (CostSample& s : samples) s.kv_tokens = s.kv_wait = 0;
  check = check_cut_cost(samples, cost);
  EXPECT_FALSE(check.measured);
  EXPECT_FALSE(check.replan);
  EXPECT_FALSE(check_cut_cost({}, cost).measured);
}

// Rows of a run with cuts whose K/V cost t = 3 in the plan's unit (1e-6 s a token, as above):
// kv_rows rows that received 200 earlier tokens' K/V, spread over `steps` steps from step 2, and
// beside each a rank of the same step that received none.
std::vector<CostSample> dear_cut_rows(int kv_rows, int steps) {
  std::vector<CostSample> samples;
  for (int i = 0; i < kv_rows; ++i) {
    CostSample receiving;
    receiving.step = 2 + i % steps;
    receiving.tokens_computed = 1000;
    receiving.seconds = 1e-3;
    receiving.kv_tokens = 200;
    receiving.kv_wait = 200 * 3e-6;
    CostSample other = receiving;
    other.kv_tokens = other.kv_wait = 0;
    samples.push_back(receiving);
    samples.push_back(other);
  }
  return samples;
}

CutCostCheck whole_run_check(int kv_rows, int steps, double planned_t = 0.583) {
  CostModel cost;
  cost.c = 0;
  cost.t = planned_t;
  return check_cut_cost(dear_cut_rows(kv_rows, steps), cost);
}

RunCutCostCheck run_check_of(bool measured, bool charge_held, uint64_t rows) {
  RunCutCostCheck check;
  check.ran = true;
  check.measured = measured;
  check.charge_held = charge_held;
  check.rows = rows;
  check.window_begin = 2;
  check.window_end = 11;
  return check;
}

// kilter report's advice needs a sample (issue 36): the demo's run advised t = 95.2 from one
// (rank, step) row. Below kCutCostAdviceMinRows rows or kCutCostAdviceMinSteps steps nothing is
// advised; at the minimum the advice names its sample.
TEST(BalanceCalibrate, ReportAdviceNeedsItsMinimumSample) {
  const RunCutCostCheck no_check;
  const CutCostCheck one_row = whole_run_check(1, 1);
  ASSERT_TRUE(one_row.replan) << "the charge did not hold on that row: only the sample withholds the advice";
  EXPECT_EQ(one_row.rows, 1u);
  EXPECT_EQ(one_row.steps, 1u);
  EXPECT_EQ(report_cut_cost_advice(one_row, no_check), "");
  // The demo's run: its check saw no rank receive K/V in its window, the whole run one row.
  EXPECT_EQ(report_cut_cost_advice(one_row, run_check_of(false, true, 0)), "");
  const int rows = int(kCutCostAdviceMinRows), steps = int(kCutCostAdviceMinSteps);
  EXPECT_EQ(report_cut_cost_advice(whole_run_check(rows - 1, steps), no_check), "") << "too few rows";
  EXPECT_EQ(report_cut_cost_advice(whole_run_check(rows, steps - 1), no_check), "") << "too few steps";
  const std::string advice = report_cut_cost_advice(whole_run_check(rows, steps), no_check);
  EXPECT_EQ(advice.rfind("cut pieces cost more than the plan charged", 0), 0u) << advice;
  EXPECT_NE(advice.find("(16 (rank, step) rows over 5 steps)"), std::string::npos) << advice;
  EXPECT_NE(advice.find("set data.cost_t = 3 "), std::string::npos) << advice;
  EXPECT_EQ(advice.find("differs"), std::string::npos) << advice;
}

// The advice never contradicts the run's own check silently: it follows the check's verdict where
// the check judged as many rows, and says where and why the whole run's larger sample differs.
TEST(BalanceCalibrate, ReportAdviceAgreesWithTheRunsCheckOrSaysWhyNot) {
  const CutCostCheck whole = whole_run_check(20, 8);
  // The check warned (the charge did not hold) on the first 5 rows: the report agrees, no remark.
  std::string advice = report_cut_cost_advice(whole, run_check_of(true, false, 5));
  EXPECT_EQ(advice.rfind("cut pieces cost more", 0), 0u) << advice;
  EXPECT_EQ(advice.find("differs"), std::string::npos) << advice;
  // The check held on 5 rows, the whole run's 20 do not: advice, and the difference named.
  advice = report_cut_cost_advice(whole, run_check_of(true, true, 5));
  EXPECT_EQ(advice.rfind("cut pieces cost more", 0), 0u) << advice;
  EXPECT_NE(advice.find("(20 (rank, step) rows over 8 steps)"), std::string::npos) << advice;
  EXPECT_NE(advice.find("This differs from the run's cut-cost check (steps 2-11, 5 rows), which found the charge "
                        "held: the report read more rows"),
            std::string::npos)
      << advice;
  // The check measured nothing in its window; the cuts came later.
  advice = report_cut_cost_advice(whole, run_check_of(false, true, 0));
  EXPECT_NE(advice.find("which saw no rank receive K/V"), std::string::npos) << advice;
  // The check held on as many rows as the report has: the same data, the report follows it.
  EXPECT_EQ(report_cut_cost_advice(whole, run_check_of(true, true, 20)), "");
  // A run that re-planned already followed the advice.
  RunCutCostCheck replanned = run_check_of(true, false, 5);
  replanned.replanned = true;
  EXPECT_EQ(report_cut_cost_advice(whole, replanned), "");
  // The check warned, but the whole run has too small a sample to repeat it: the report says so.
  advice = report_cut_cost_advice(whole_run_check(5, 4), run_check_of(true, false, 5));
  EXPECT_EQ(advice.rfind("none: the run's cut-cost check (steps 2-11, 5 rows) found that cut pieces cost more", 0),
            0u)
      << advice;
  EXPECT_NE(advice.find("5 (rank, step) rows that received K/V over 4 steps are fewer than the 16 over 5 steps"),
            std::string::npos)
      << advice;
  EXPECT_EQ(advice.find("data.cost_t ="), std::string::npos) << advice;
  // The check warned on its window, and the whole run, on more rows, finds the charge held (t = 3
  // within 1.5x of 2.5): the report says it differs, and advises no setting.
  const CutCostCheck held = whole_run_check(20, 8, 2.5);
  ASSERT_TRUE(held.measured && !held.replan);
  advice = report_cut_cost_advice(held, run_check_of(true, false, 5));
  EXPECT_EQ(advice.rfind("none: unlike the run's cut-cost check (steps 2-11, 5 rows), the whole run's 20 (rank, step) "
                         "rows that received K/V over 8 steps measured t = 3 against the planned 2.5",
                         0),
            0u)
      << advice;
  EXPECT_NE(advice.find("the charge held over the run"), std::string::npos) << advice;
  EXPECT_EQ(report_cut_cost_advice(held, run_check_of(true, true, 5)), "") << "both held";
  EXPECT_EQ(report_cut_cost_advice(held, RunCutCostCheck()), "") << "no check, and the charge held";
}

// read_cost_samples keeps each row's step, which the report's sample counts.
TEST(BalanceCalibrate, CostSamplesKeepTheirStep) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("kilter-calibrate-steps-" + std::to_string(::getpid()));
  fs::create_directories(dir / "metrics");
  {
    std::ofstream csv(dir / "metrics" / "rank-00000.csv");
    csv << "step,tokens_computed,attn_work,forward,backward,kv_wait,kv_tokens\n"
           "1,100,1000,0.1,0.2,0,0\n"
           "2,100,1000,0.1,0.2,0.01,50\n"
           "3,100,1000,0.1,0.2,0,0\n"
           "7,100,1000,0.1,0.2,0.02,50\n";
  }
  const std::vector<CostSample> samples = read_cost_samples(dir.string(), 2);
  ASSERT_EQ(samples.size(), 3u);
  EXPECT_EQ(samples[0].step, 2);
  EXPECT_EQ(samples[2].step, 7);
  CostModel cost;
  const CutCostCheck check = check_cut_cost(samples, cost);
  EXPECT_EQ(check.rows, 2u);
  EXPECT_EQ(check.steps, 2u);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kilter::balance
