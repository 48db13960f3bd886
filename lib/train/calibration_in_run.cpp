// CostCalibration (calibration_in_run.h): windows, samples, verdicts and the record of models.
#include "lib/train/calibration_in_run.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include <fmt/format.h>

#include "io/base/error.h"

namespace kilter::train {

CalibrationSettings calibration_settings(const std::string& mode, double cost_b, double cost_c, double cost_t,
                                         const std::string& sampler, int world_size,
                                         const balance::CostModel& start_cost, bool plan_cuts) {
  CalibrationSettings s;
  s.fit_b = cost_b < 0;
  s.fit_c = cost_c < 0;
  s.fit_t = cost_t < 0 && plan_cuts;
  s.active = mode == "auto" && world_size > 1 && sampler == "balanced" && (s.fit_b || s.fit_c || s.fit_t);
  s.derived = start_cost;
  s.world_size = world_size;
  if (const char* hook = std::getenv("KILTER_TEST_CALIBRATION_SECONDS")) s.test_seconds = hook;
  return s;
}

CostCalibration::CostCalibration(CalibrationSettings settings, int64_t first_step) : settings_(std::move(settings)) {
  restart_window(first_step + kCalibrationWarmup);
  if (settings_.test_seconds.empty()) return;
  // "ALPHA,B,C[,RANK:SPEED...]"
  std::istringstream in(settings_.test_seconds);
  std::string field;
  test_speed_.assign(size_t(std::max(settings_.world_size, 1)), 1.0);
  while (std::getline(in, field, ',')) {
    const size_t colon = field.find(':');
    if (colon == std::string::npos) {
      test_model_.push_back(std::stod(field));
    } else {
      const int rank = std::stoi(field.substr(0, colon));
      if (rank >= 0 && rank < settings_.world_size) test_speed_[size_t(rank)] = std::stod(field.substr(colon + 1));
    }
  }
  KILTER_CHECK(test_model_.size() == 3, "KILTER_TEST_CALIBRATION_SECONDS = '" << settings_.test_seconds
                                                                              << "': expected ALPHA,B,C[,RANK:SPEED...]");
}

double CostCalibration::test_seconds(const balance::CostSample& s) const {
  return test_model_[0] * (s.tokens_computed + test_model_[1] * s.attn_work + test_model_[2] * s.micro_batches) *
         test_speed_.at(size_t(s.rank));
}

void CostCalibration::add_step(const diag::StepRecord* records, int ranks) {
  if (!active() || ranks <= 0) return;
  const int64_t step = records[0].step;
  last_gathered_ = std::max(last_gathered_, step);
  // Gathered while the plan in force stays: idle, and while a fit of it is evaluated.
  if ((stage_ != Stage::idle && stage_ != Stage::evaluating) || step < window_begin_) return;
  auto rows = std::make_shared<std::vector<balance::CostSample>>();
  rows->reserve(size_t(ranks));
  for (int r = 0; r < ranks; ++r) {
    const diag::StepRecord& rec = records[r];
    if (rec.tokens_computed <= 0) continue;  // an idle rank in this step
    balance::CostSample s;
    s.step = step;
    s.rank = r;
    s.tokens_computed = double(rec.tokens_computed);
    s.attn_work = rec.attn_work;
    s.micro_batches = double(rec.micro_batches);
    // The rank's own work: its waits for other ranks' K/V are taken out of forward and backward.
    s.seconds = rec.phase[diag::kForward] + rec.phase[diag::kBackward];
    s.kv_wait = rec.phase[diag::kKvWait];
    s.kv_tokens = double(rec.kv_tokens);
    if (!test_model_.empty()) s.seconds = test_seconds(s), s.kv_wait = 0, s.kv_tokens = 0;  // t stays the plan's
    rows->push_back(s);
  }
  if (!rows->empty()) steps_.push_back(std::move(rows));
}

bool CostCalibration::window_complete() const {
  return active() && stage_ == Stage::idle && last_gathered_ >= window_due_;
}

void CostCalibration::restart_window(int64_t begin) {
  stage_ = Stage::idle;
  steps_.clear();
  segment_starts_.clear();
  window_begin_ = begin;
  window_gap_ = kFirstCalibrationWindow;
  window_due_ = begin + window_gap_ - 1;
}

void CostCalibration::grow_window() {
  stage_ = Stage::idle;
  window_gap_ = std::min(2 * window_gap_, kMaxCalibrationWindow);
  window_due_ = std::max(window_due_, last_gathered_) + window_gap_;
  trim_window();
}

void CostCalibration::confirm_window(int64_t from_step) {
  stage_ = Stage::idle;
  window_gap_ = kFirstCalibrationWindow;
  window_due_ = from_step + window_gap_ - 1;
  trim_window();
}

void CostCalibration::trim_window() {
  // The latest kMaxCalibrationWindow steps at the next fit.
  const int64_t first = window_due_ - kMaxCalibrationWindow + 1;
  if (first > window_begin_) {
    window_begin_ = first;
    while (!steps_.empty() && steps_.front()->front().step < first) steps_.pop_front();
    segment_starts_.erase(segment_starts_.begin(),
                          std::upper_bound(segment_starts_.begin(), segment_starts_.end(), first));
  }
}

size_t WindowJob::rows() const {
  size_t n = 0;
  for (const StepRows& s : steps) n += s->size();
  return n;
}

void WindowJob::evaluate() {
  std::vector<balance::CostSample> samples;
  samples.reserve(rows());
  for (const StepRows& s : steps) samples.insert(samples.end(), s->begin(), s->end());
  fit = balance::fit_window(samples, options);
  if (!fit.usable) {
    kept = fit.note;
    return;
  }
  model.cost = fit.cost;
  model.rank_speed.clear();
  if (std::any_of(fit.rank_speed.begin(), fit.rank_speed.end(), [](double s) { return s != 1.0; }))
    model.rank_speed = fit.rank_speed;
  const balance::CostModel& planned = options.current;
  if (model.cost.b == planned.b && model.cost.c == planned.c && model.cost.t == planned.t &&
      model.rank_speed == options.planned_speed) {
    kept = "the fit is the plan's own model";
    return;
  }
  candidate = true;
}

std::shared_ptr<WindowJob> CostCalibration::start_window(const balance::CostModel& planned,
                                                         const std::vector<double>& planned_speed) {
  job_ = std::make_shared<WindowJob>();
  WindowJob& job = *job_;
  job.begin = steps_.empty() ? window_begin_ : steps_.front()->front().step;
  job.end = last_gathered_;
  job.steps.assign(steps_.begin(), steps_.end());
  job.options.current = planned;
  job.options.derived = settings_.derived;
  job.options.fit_b = settings_.fit_b;
  job.options.fit_c = settings_.fit_c;
  job.options.fit_t = settings_.fit_t;
  job.options.world_size = settings_.world_size;
  // Each stretch of steps between two fits has speeds of its own (the plan takes the latest).
  for (int64_t start : segment_starts_)
    if (start > job.begin) job.options.speed_segments.push_back(start);
  segment_starts_.push_back(job.end + 1);
  job.options.planned_speed = planned_speed;
  stage_ = Stage::evaluating;
  return job_;
}

namespace {
WindowVerdict verdict_of(const WindowJob& job) {
  WindowVerdict v;
  v.begin = job.begin;
  v.end = job.end;
  v.fit = job.fit;
  v.planned = job.options.current;
  v.compared = job.compared;
  v.comparison = job.comparison;
  return v;
}
}  // namespace

bool CostCalibration::finish_window(int64_t step) {
  const WindowJob& job = *job_;
  WindowVerdict v = verdict_of(job);
  if (!job.candidate) {
    v.decision = "kept: " + job.kept;
  } else if (!job.compared || job.comparison.steps == 0) {
    v.decision = "kept: its epoch ended before the candidate was compared";
  } else if (job.comparison.pays()) {
    v.decided_at = step;
  } else {
    const balance::PlanComparison& c = job.comparison;
    v.decision = fmt::format("kept: the division with the fit would gain {:.2f}% of the busiest rank's time over the "
                             "next {} steps, not above {}x its noise ({:.2f}%) and {:.2f}%",
                             100 * c.relative_gain(), c.steps, balance::kReplanGainNoise,
                             c.current_seconds > 0 ? 100 * c.gain_sd / c.current_seconds : 0.0,
                             100 * balance::kReplanMinGain);
  }
  verdicts_.push_back(std::move(v));
  job_.reset();
  if (verdicts_.back().decided_at >= 0) {
    stage_ = Stage::announced;
    return true;
  }
  grow_window();
  return false;
}

void CostCalibration::abandon(const std::string& why) {
  if (job_) {  // evaluating (its thread has ended): what it found, kept
    verdicts_.push_back(verdict_of(*job_));
    job_.reset();
  }
  if (!verdicts_.empty() && verdicts_.back().decision.empty()) verdicts_.back().decision = "kept: " + why;
  grow_window();
}

void CostCalibration::switched(int64_t from_step, const PlanModel& model, int world_size) {
  models_.push_back(CalibratedModel{from_step, model, world_size});
  if (!verdicts_.empty() && verdicts_.back().decision.empty()) {
    verdicts_.back().decision = "replanned";
    verdicts_.back().replanned_from = from_step;
  }
  confirm_window(from_step);
}

namespace {

// Speeds as {"rank": speed} for the ranks that differ from 1.
nlohmann::json sparse_speeds(const std::vector<double>& speed) {
  nlohmann::json out = nlohmann::json::object();
  for (size_t r = 0; r < speed.size(); ++r)
    if (speed[r] != 1.0) out[std::to_string(r)] = speed[r];
  return out;
}

std::vector<double> dense_speeds(const nlohmann::json& sparse, int world_size) {
  if (sparse.empty()) return {};
  std::vector<double> speed(size_t(world_size), 1.0);
  for (const auto& [rank, value] : sparse.items()) {
    const int r = std::stoi(rank);
    KILTER_CHECK(r >= 0 && r < world_size, "rank " << r << " outside a world of " << world_size);
    speed[size_t(r)] = value.get<double>();
  }
  return speed;
}

nlohmann::json cost_json(const balance::CostModel& c) {
  return {{"a", c.a}, {"b", c.b}, {"c", c.c}, {"t", c.t}, {"t_link", c.t_link}, {"layers", c.layers}};
}

}  // namespace

std::string CostCalibration::checkpoint_text() const {
  if (models_.empty()) return "";
  nlohmann::json models = nlohmann::json::array();
  for (const CalibratedModel& m : models_)
    models.push_back({{"from_step", m.from_step},
                      {"world_size", m.world_size},
                      {"cost", cost_json(m.model.cost)},
                      {"rank_speed", sparse_speeds(m.model.rank_speed)}});
  return nlohmann::json{{"models", models}}.dump();
}

std::vector<CalibratedModel> CostCalibration::parse_checkpoint_text(const std::string& text) {
  std::vector<CalibratedModel> out;
  if (text.empty()) return out;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    for (const nlohmann::json& m : j.at("models")) {
      CalibratedModel model;
      model.from_step = m.at("from_step").get<int64_t>();
      model.world_size = m.at("world_size").get<int>();
      const nlohmann::json& c = m.at("cost");
      model.model.cost.a = c.at("a").get<double>();
      model.model.cost.b = c.at("b").get<double>();
      model.model.cost.c = c.at("c").get<double>();
      model.model.cost.t = c.at("t").get<double>();
      model.model.cost.t_link = c.at("t_link").get<double>();
      model.model.cost.layers = c.at("layers").get<int>();
      model.model.rank_speed = dense_speeds(m.at("rank_speed"), model.world_size);
      out.push_back(model);
    }
  } catch (const nlohmann::json::exception& e) {
    KILTER_FAIL("the checkpoint's cost_calibration attribute is not what this kilter writes: " << e.what());
  }
  return out;
}

nlohmann::json CostCalibration::summary() const {
  if (!active()) return nullptr;
  nlohmann::json windows = nlohmann::json::array();
  for (const WindowVerdict& v : verdicts_) {
    const balance::WindowFit& f = v.fit;
    nlohmann::json w = {{"steps", {v.begin, v.end}},
                        {"rows", f.rows},
                        {"outlier_steps", f.outlier_steps},
                        {"usable", f.usable},
                        {"note", f.note},
                        {"planned_cost_b", v.planned.b},
                        {"planned_cost_c", v.planned.c},
                        {"planned_cost_t", v.planned.t},
                        {"decision", v.decision.empty() ? "undecided: the run ended first" : v.decision},
                        {"replanned_from_step", v.replanned_from >= 0 ? nlohmann::json(v.replanned_from) : nullptr}};
    if (f.usable) {
      w["seconds_per_unit"] = f.seconds_per_unit;
      w["cost_b"] = f.cost.b;
      w["cost_c"] = f.cost.c;
      w["cost_t"] = f.cost.t;
      w["b_fitted"] = f.b_fitted;
      w["c_fitted"] = f.c_fitted;
      w["t_fitted"] = f.t_fitted;
      w["r2"] = f.r2;
      w["rank_speed"] = sparse_speeds(f.rank_speed);
      w["speeds_from_step"] = f.speeds_from_step;
    }
    if (v.compared) {
      const balance::PlanComparison& c = v.comparison;
      w["compared_steps"] = c.steps;
      w["predicted_gain"] = c.relative_gain();
      w["predicted_gain_sd"] = c.current_seconds > 0 ? c.gain_sd / c.current_seconds : 0.0;
      w["predicted_imbalance_before"] = c.current_imbalance;
      w["predicted_imbalance_after"] = c.candidate_imbalance;
    }
    if (v.decided_at >= 0) w["decided_at_step"] = v.decided_at;
    windows.push_back(w);
  }
  nlohmann::json in_force = nlohmann::json::array();
  for (const CalibratedModel& m : models_)
    in_force.push_back({{"from_step", m.from_step},
                        {"cost_a", m.model.cost.a},
                        {"cost_b", m.model.cost.b},
                        {"cost_c", m.model.cost.c},
                        {"cost_t", m.model.cost.t},
                        {"rank_speed", sparse_speeds(m.model.rank_speed)}});
  return {{"mode", "auto"},
          {"fits", {{"cost_b", settings_.fit_b}, {"cost_c", settings_.fit_c}, {"cost_t", settings_.fit_t}}},
          {"windows", windows},
          {"in_force", in_force}};
}

std::string CostCalibration::switch_line() const {
  const WindowVerdict& v = verdicts_.back();
  const balance::WindowFit& f = v.fit;
  std::string changes;
  const auto add = [&changes](const std::string& s) { changes += (changes.empty() ? "" : ", ") + s; };
  if (f.b_fitted) add(fmt::format("cost_b {:.3g} (was {:.3g})", f.cost.b, v.planned.b));
  if (f.c_fitted) add(fmt::format("cost_c {:.3g} (was {:.3g})", f.cost.c, v.planned.c));
  if (f.t_fitted) add(fmt::format("cost_t {:.3g} (was {:.3g})", f.cost.t, v.planned.t));
  for (size_t r = 0; r < f.rank_speed.size(); ++r)
    if (f.rank_speed[r] != 1.0)
      add(fmt::format("rank {} runs {:.0f}% {} on equal work", r, 100 * std::fabs(f.rank_speed[r] - 1),
                      f.rank_speed[r] > 1 ? "slower" : "faster"));
  if (changes.empty()) add("coefficients as planned, every rank at speed 1");
  const balance::PlanComparison& c = v.comparison;
  return fmt::format("step {}: the plan changes from step {} on, divided by the cost model fitted on steps {}-{}: {}; "
                     "predicted busiest-rank time {:.1f}% lower, imbalance {:.3f} -> {:.3f} "
                     "(data.cost_calibration = off keeps the plan)",
                     v.decided_at, v.replanned_from, v.begin, v.end, changes, 100 * c.relative_gain(),
                     c.current_imbalance, c.candidate_imbalance);
}

}  // namespace kilter::train
