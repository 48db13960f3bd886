// The in-run calibration of the plan's cost model (data.cost_calibration = auto; docs/plan.md,
// "In-run calibration"): what rank 0 gathers and decides, and what every rank records. Rank 0
// receives every rank's step records already (the straggler watch); over a window of steps it
// fits the cost model and the ranks' speeds to the measured compute times (balance::fit_window),
// and where the division made with the fit beats the one in force on the next steps by more than
// the fit's noise (balance::compare_divisions), the run re-plans its remaining steps with it. A
// window holds every step since warm-up, at most the latest kMaxCalibrationWindow (the model
// prices each row's own work, so rows of earlier plans fit it as well as the plan in force's and
// make its noise smaller): it is fitted first kFirstCalibrationWindow steps after warm-up and
// after a switch (a switch is confirmed, or corrected, soon), and where the verdict keeps the
// plan, again after twice as many steps as the last gap (20, 40, 80, ... up to
// kMaxCalibrationWindow): the need decays, and a run whose speed changes is followed. The
// models put in force, each with the step it took effect, go into checkpoints (a resume plans as
// the run did) and, with every window's verdict, into summary.json. No MPI here:
// calibration_driver.h drives it from the step loop.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/balance/calibration_window_fit.h"
#include "lib/diag/step_record.h"
#include "lib/train/plan_cursor.h"

namespace kilter::train {

constexpr int64_t kCalibrationWarmup = 2;            // steps of this process left out (start-up)
constexpr int64_t kFirstCalibrationWindow = 20;
constexpr int64_t kMaxCalibrationWindow = 320;      // steps a window holds at most, and the longest gap
constexpr uint64_t kCalibrationCompareSteps = 32;    // the next steps a candidate is compared on

struct CalibrationSettings {
  bool active = false;  // auto, more than one rank, the balanced sampler, something to fit
  bool fit_b = true, fit_c = true, fit_t = false;  // false: pinned in the config (t: or nothing cut)
  balance::CostModel derived;  // the start plan's resolved model: the centre of the fit's bounds
  int world_size = 1;
  // Test hook (env KILTER_TEST_CALIBRATION_SECONDS = "ALPHA,B,C[,RANK:SPEED...]"): rank 0 takes each
  // rank-step's compute seconds as ALPHA (tokens + B attention + C micro-batches) x SPEED instead of
  // its measured forward + backward, so a test's fit and verdicts do not depend on the machine.
  std::string test_seconds;
};

// The settings a run's config gives: `start_cost` is the resolved cost model of its start plan,
// `plan_cuts` whether it cuts pieces (t can be measured only then).
CalibrationSettings calibration_settings(const std::string& mode, double cost_b, double cost_c, double cost_t,
                                         const std::string& sampler, int world_size,
                                         const balance::CostModel& start_cost, bool plan_cuts);

// A model the calibration put in force from a step on. Every rank keeps the same list (the switch
// is collective).
struct CalibratedModel {
  int64_t from_step = 0;
  PlanModel model;
  int world_size = 1;  // the speeds are per rank of this world size
};

// One step's rows, every rank's, as gathered: immutable once stored, so a window's job shares
// them with the store instead of copying them on the training thread.
using StepRows = std::shared_ptr<const std::vector<balance::CostSample>>;

// One window's evaluation, made on a thread of its own (calibration_driver.cpp): its rows, the fit
// and the candidate model (evaluate()), then the candidate's comparison with the plan in force on
// the next steps (written by the build's thread). Everything it reads is its own or immutable.
struct WindowJob {
  int64_t begin = 0, end = 0;
  std::vector<StepRows> steps;  // the window's rows, step by step (shared with the store)
  size_t rows() const;
  balance::WindowFitOptions options;  // the plan in force (current, planned_speed), the pins, the world size
  // Results.
  balance::WindowFit fit;
  bool candidate = false;  // the fit is usable and differs from the plan in force
  std::string kept;        // where not: why
  PlanModel model;
  bool compared = false;
  balance::PlanComparison comparison;
  void evaluate();
};

// What one window found (rank 0).
struct WindowVerdict {
  int64_t begin = 0, end = 0;  // its steps
  balance::WindowFit fit;
  balance::CostModel planned;  // the model its steps were divided with
  bool compared = false;
  balance::PlanComparison comparison;
  int64_t decided_at = -1;     // the step whose reduction carried the verdict to every rank
  std::string decision;        // "replanned", or "kept: <why>"
  int64_t replanned_from = -1; // the step the new plan took effect (-1: none)
};

class CostCalibration {
 public:
  // idle: gathering a window; evaluating (rank 0): its candidate being built and compared;
  // announced (rank 0): the verdict rides in the next reduction; building (every rank): the
  // candidate being built, until every rank has it and they agree on the switch.
  enum class Stage { idle, evaluating, announced, building };

  CostCalibration() = default;
  CostCalibration(CalibrationSettings settings, int64_t first_step);
  bool active() const { return settings_.active; }
  const CalibrationSettings& settings() const { return settings_; }
  Stage stage() const { return stage_; }
  void set_stage(Stage stage) { stage_ = stage; }

  // Rank 0: every rank's records of one step (diag::RankDiagnostics::on_step_records).
  void add_step(const diag::StepRecord* records, int ranks);
  // Rank 0, stage idle: the step that completes the window has been gathered.
  bool window_complete() const;
  // Rank 0: the window's rows (shared, not copied) handed to a job against `planned` and `planned_speed`, what its steps
  // were divided with (stage evaluating).
  std::shared_ptr<WindowJob> start_window(const balance::CostModel& planned, const std::vector<double>& planned_speed);
  const std::shared_ptr<WindowJob>& job() const { return job_; }
  // Rank 0, the job done: its verdict recorded. true: the candidate pays (stage announced; `step`
  // is the step whose reduction carries it); false: kept, and the window grows.
  bool finish_window(int64_t step);
  // Any rank: the candidate was given up (the cut-cost check re-planned, the run ends first); the
  // window grows (its rows price their own work, so a plan changed by the cut-cost check keeps them).
  void abandon(const std::string& why);
  // Every rank: `model` in force from `from_step`; the window keeps its rows and is fitted again
  // kFirstCalibrationWindow steps after it.
  void switched(int64_t from_step, const PlanModel& model, int world_size);

  const std::vector<CalibratedModel>& models() const { return models_; }
  void restore(std::vector<CalibratedModel> models) { models_ = std::move(models); }
  // The checkpoint's text (attribute cost_calibration): the models with their steps; "" where none.
  std::string checkpoint_text() const;
  // Reads it back; throws kilter::Error on a malformed text.
  static std::vector<CalibratedModel> parse_checkpoint_text(const std::string& text);
  // Rank 0: summary.json's cost_calibration (null where inactive).
  nlohmann::json summary() const;
  // Rank 0: the log line of a switch (the last verdict).
  std::string switch_line() const;

 private:
  void restart_window(int64_t begin);      // a fresh window from `begin` (the first one)
  void grow_window();                      // the plan stays: the same rows and more, fitted later
  void confirm_window(int64_t from_step);  // a switch at `from_step`: the same rows and 20 steps more
  void trim_window();                      // the rows of the latest kMaxCalibrationWindow steps
  double test_seconds(const balance::CostSample& sample) const;

  CalibrationSettings settings_;
  Stage stage_ = Stage::idle;
  int64_t window_begin_ = 0;  // the first step the window may hold
  int64_t window_due_ = 0;    // the step whose gathering completes it
  int64_t window_gap_ = kFirstCalibrationWindow;
  int64_t last_gathered_ = -1;
  std::vector<int64_t> segment_starts_;  // the steps after each fitted window's: where new speeds begin
  std::deque<StepRows> steps_;  // the window's rows, oldest step first
  std::vector<WindowVerdict> verdicts_;
  std::vector<CalibratedModel> models_;
  // The test hook, parsed: alpha, b, c and per-rank speeds (empty: no hook).
  std::vector<double> test_model_;
  std::vector<double> test_speed_;
  std::shared_ptr<WindowJob> job_;
};

}  // namespace kilter::train
