// CostCalibration (lib/train/calibration_in_run.h), the in-run calibration's state on rank 0: its
// windows (20 steps after warm-up, then 100, 200, ...), the fit of a window's records, the
// verdict, and the record of models a checkpoint keeps (read back bit for bit).
#include <gtest/gtest.h>

#include <vector>

#include "io/base/error.h"
#include "lib/train/calibration_in_run.h"

namespace kilter::train {
namespace {

CalibrationSettings settings(int world) {
  CalibrationSettings s = calibration_settings("auto", -1, -1, -1, "balanced", world, balance::CostModel{1, 2e-3, 64}, false);
  s.test_seconds = "1e-6,4e-3,64,1:1.25";  // the fit's inputs, whatever the records' times
  return s;
}

// Every rank's record of `step`: rank r holds a different mix of tokens and attention.
std::vector<diag::StepRecord> records(int64_t step, int world) {
  std::vector<diag::StepRecord> out(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    diag::StepRecord& rec = out[size_t(r)];
    rec.step = step;
    rec.rank = r;
    rec.tokens_computed = 2000 + 37 * ((step * 7 + r * 13) % 11) - 60 * r;
    rec.attn_work = 4e5 + 3e4 * double((step * 5 + r * 3) % 7);
    rec.micro_batches = 2 + int32_t((step + r) % 2);
    rec.phase[diag::kForward] = 0.01;
  }
  return out;
}

TEST(TrainCostCalibration, SettingsSayWhatIsFitted) {
  const balance::CostModel start{1, 2e-3, 64};
  EXPECT_TRUE(calibration_settings("auto", -1, -1, -1, "balanced", 2, start, false).active);
  EXPECT_FALSE(calibration_settings("off", -1, -1, -1, "balanced", 2, start, false).active);
  EXPECT_FALSE(calibration_settings("auto", -1, -1, -1, "balanced", 1, start, false).active) << "one rank";
  EXPECT_FALSE(calibration_settings("auto", -1, -1, -1, "naive", 2, start, false).active);
  EXPECT_FALSE(calibration_settings("auto", 1e-3, 32, -1, "balanced", 2, start, false).active) << "all pinned, no cuts";
  const CalibrationSettings cuts = calibration_settings("auto", 1e-3, 32, -1, "balanced", 2, start, true);
  EXPECT_TRUE(cuts.active && cuts.fit_t && !cuts.fit_b && !cuts.fit_c);
}

TEST(TrainCostCalibration, WindowsFitVerdictAndRecord) {
  const int world = 2;
  CostCalibration cal(settings(world), 0);
  for (int64_t step = 0; step < 21; ++step) cal.add_step(records(step, world).data(), world);
  EXPECT_FALSE(cal.window_complete()) << "steps 2-21 make the first window";
  cal.add_step(records(21, world).data(), world);
  ASSERT_TRUE(cal.window_complete());
  std::shared_ptr<WindowJob> job = cal.start_window(balance::CostModel{1, 2e-3, 64}, {});
  EXPECT_EQ(cal.stage(), CostCalibration::Stage::evaluating);
  job->evaluate();
  ASSERT_TRUE(job->candidate) << job->kept;
  const PlanModel candidate = job->model;
  EXPECT_NEAR(candidate.cost.b, 4e-3, 1e-9);
  ASSERT_EQ(candidate.rank_speed.size(), 2u);
  EXPECT_NEAR(candidate.rank_speed[1], 1.25, 1e-9);
  balance::PlanComparison pays;
  pays.steps = 16, pays.current_seconds = 1, pays.candidate_seconds = 0.9, pays.gain_sd = 0.01;
  balance::PlanComparison hardly = pays;
  hardly.candidate_seconds = 0.999;
  const auto gather = [&cal, world](int64_t from, int64_t end) {
    for (int64_t step = from; step < end; ++step) cal.add_step(records(step, world).data(), world);
  };
  // Steps from `from` on gathered: the window is complete with step `due`, not before; its job.
  const auto job_due_at = [&cal, &gather](int64_t from, int64_t due) {
    gather(from, due);
    EXPECT_FALSE(cal.window_complete()) << "before step " << due;
    gather(due, due + 1);
    EXPECT_TRUE(cal.window_complete()) << "at step " << due;
    return cal.start_window(balance::CostModel{1, 2e-3, 64}, {});
  };
  job->comparison = pays, job->compared = true;
  EXPECT_TRUE(cal.finish_window(23));
  EXPECT_EQ(cal.stage(), CostCalibration::Stage::announced);
  cal.switched(27, candidate, world);
  EXPECT_EQ(cal.stage(), CostCalibration::Stage::idle);
  ASSERT_EQ(cal.models().size(), 1u);
  EXPECT_NE(cal.switch_line().find("the plan changes from step 27 on"), std::string::npos) << cal.switch_line();
  // The next fit 20 steps after the switch, to confirm it (steps 27-46), on the rows before the
  // switch as well (steps 2-21 and, not gathered while the verdict was out, 22-26 in this test).
  // A candidate that does not pay is kept out, and said why.
  job = job_due_at(22, 46);
  EXPECT_EQ(job->begin, 2);
  EXPECT_EQ(job->rows(), 2u * 45);
  // Its speeds apart before and after the first window's end (balance::WindowFitOptions::speed_segments).
  EXPECT_EQ(job->options.speed_segments, std::vector<int64_t>({22}));
  job->evaluate();
  ASSERT_TRUE(job->candidate);
  job->comparison = hardly, job->compared = true;
  // Steps gathered while the job ran stay in the window.
  gather(47, 48);
  EXPECT_FALSE(cal.finish_window(48));
  EXPECT_EQ(cal.stage(), CostCalibration::Stage::idle);
  // Kept: the same window grows, fitted again 40 steps on (steps 2-87), then 80, ..., and holds
  // at most the latest kMaxCalibrationWindow steps.
  job = job_due_at(48, 87);
  EXPECT_EQ(job->begin, 2);
  EXPECT_EQ(job->end, 87);
  EXPECT_EQ(job->rows(), 2u * 86);
  EXPECT_EQ(job->options.speed_segments, std::vector<int64_t>({22, 47}));
  job->evaluate();
  job->comparison = hardly, job->compared = true;
  EXPECT_FALSE(cal.finish_window(88));
  int64_t step = 88;
  for (int fits = 0; fits < 6; ++fits) {
    while (!cal.window_complete()) gather(step, step + 1), ++step;
    job = cal.start_window(balance::CostModel{1, 2e-3, 64}, {});
    EXPECT_LE(job->end - job->begin + 1, kMaxCalibrationWindow);
    job->evaluate();
    job->comparison = hardly, job->compared = true;
    EXPECT_FALSE(cal.finish_window(step));
  }
  EXPECT_EQ(job->end - job->begin + 1, kMaxCalibrationWindow);
  const nlohmann::json summary = cal.summary();
  ASSERT_EQ(summary["windows"].size(), 9u);
  EXPECT_EQ(summary["windows"][0]["decision"], "replanned");
  EXPECT_EQ(summary["windows"][0]["replanned_from_step"], 27);
  EXPECT_NE(summary["windows"][1]["decision"].get<std::string>().find("kept: "), std::string::npos);
  EXPECT_EQ(summary["in_force"][0]["from_step"], 27);
}

TEST(TrainCostCalibration, CheckpointTextReadsBackBitForBit) {
  CostCalibration cal(settings(3), 0);
  EXPECT_EQ(cal.checkpoint_text(), "") << "nothing in force: nothing written";
  PlanModel m;
  m.cost.a = 1, m.cost.b = 1.0 / 3.0 * 1e-3, m.cost.c = 190.123456789, m.cost.t = 0.1 + 0.2, m.cost.t_link = 0.7;
  m.cost.layers = 0;
  m.rank_speed = {1.0, 1.0 + 1e-15, 1.0};
  cal.switched(40, m, 3);
  m.rank_speed.clear();
  m.cost.b = 2.5e-4;
  cal.switched(140, m, 3);
  const std::vector<CalibratedModel> back = CostCalibration::parse_checkpoint_text(cal.checkpoint_text());
  ASSERT_EQ(back.size(), 2u);
  for (size_t i = 0; i < back.size(); ++i) {
    const CalibratedModel& a = cal.models()[i];
    const CalibratedModel& b = back[i];
    EXPECT_EQ(a.from_step, b.from_step);
    EXPECT_EQ(a.world_size, b.world_size);
    EXPECT_EQ(a.model.cost.b, b.model.cost.b);
    EXPECT_EQ(a.model.cost.c, b.model.cost.c);
    EXPECT_EQ(a.model.cost.t, b.model.cost.t);
    EXPECT_EQ(a.model.cost.t_link, b.model.cost.t_link);
    EXPECT_EQ(a.model.rank_speed, b.model.rank_speed);
  }
  EXPECT_THROW(CostCalibration::parse_checkpoint_text("{\"models\": [{\"from_step\": 1}]}"), Error);
}

}  // namespace
}  // namespace kilter::train
