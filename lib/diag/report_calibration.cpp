// The in-run calibration in `kilter report` (docs/plan.md, "In-run calibration"): per
// window, what it fitted and decided; for each re-plan, the imbalance the fit predicted before and
// after beside the one measured on the steps before and after the switch, and the sync_wait it
// saved; and every rank the plan runs slower, with the share of tokens it gets.
#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include <fmt/format.h>

#include "lib/diag/report.h"
#include "lib/diag/run_statistics.h"

namespace kilter::diag {

namespace {

// Measured figures over the steps [first, end) every rank recorded.
struct RangeFigures {
  size_t steps = 0;
  double sync_wait = 0;         // sync_wait_fraction over the range
  double imbalance_p50 = 1;     // step-time imbalance (max / mean compute), median step
  double wait_per_step = 0;     // seconds a rank waited at the gradient collective, per step (mean rank)
  std::vector<double> tokens;   // per rank: mean tokens computed per step
};

RangeFigures measure(const RunData& run, int64_t first, int64_t end) {
  RangeFigures out;
  RunStatistics stats(run.world_size, run.stall_factor);
  std::vector<size_t> cursor(size_t(run.world_size), 0);
  std::vector<StepRecord> records(size_t(run.world_size));
  out.tokens.assign(size_t(run.world_size), 0.0);
  double wait = 0;
  for (int64_t step : run.steps) {
    if (step < first || step >= end) continue;
    double last = 0;
    for (int r = 0; r < run.world_size; ++r) {
      const auto& rows = run.rows[size_t(r)];
      size_t& c = cursor[size_t(r)];
      while (rows[c].step < step) ++c;  // present: every rank recorded it
      records[size_t(r)] = rows[c];
      last = r == 0 ? rows[c].arrival : std::max(last, rows[c].arrival);
      out.tokens[size_t(r)] += double(rows[c].tokens_computed);
    }
    for (const StepRecord& rec : records) wait += last - rec.arrival;
    stats.add_step(records.data());
    ++out.steps;
  }
  if (out.steps == 0) return out;
  out.sync_wait = stats.sync_wait_fraction();
  out.imbalance_p50 = stats.step_time_imbalance_percentile(50);
  out.wait_per_step = wait / double(out.steps) / double(run.world_size);
  for (double& t : out.tokens) t /= double(out.steps);
  return out;
}

std::string number(const nlohmann::json& j, const char* key, const char* format = "{:.3g}") {
  return j.contains(key) && j[key].is_number() ? fmt::format(fmt::runtime(format), j[key].get<double>()) : "n/a";
}

// "cost_b 1.03e-3 (plan 6.25e-4), cost_c 190 (plan 256), rank 1 x1.17, R^2 0.93"
std::string fitted(const nlohmann::json& w) {
  if (!w.value("usable", false)) return "no usable fit";
  std::string text;
  const auto add = [&text](const std::string& s) { text += (text.empty() ? "" : ", ") + s; };
  for (const char* coefficient : {"b", "c", "t"}) {
    const std::string key = std::string("cost_") + coefficient;
    if (w.value(std::string(coefficient) + "_fitted", false))
      add(fmt::format("{} {} (plan {})", key, number(w, key.c_str()), number(w, ("planned_" + key).c_str())));
  }
  if (w.contains("rank_speed"))
    for (const auto& [rank, speed] : w["rank_speed"].items()) add(fmt::format("rank {} x{:.3f}", rank, speed.get<double>()));
  if (text.empty()) add("the plan's coefficients, every rank at speed 1");
  if (w.value("b_fitted", false) || w.value("c_fitted", false)) add("R^2 " + number(w, "r2", "{:.2f}"));
  return text;
}

// The rank speeds in force at the end, with the tokens the plan gave each slower rank against the
// others' mean over the steps since the last switch.
std::string speed_lines(const RunData& run, const nlohmann::json& speeds, int64_t since) {
  if (!speeds.is_object() || speeds.empty()) return "";
  const RangeFigures after = measure(run, since, INT64_MAX);
  std::string out;
  for (const auto& [key, value] : speeds.items()) {
    const int rank = std::stoi(key);
    const double speed = value.get<double>();
    if (rank < 0 || rank >= run.world_size || after.steps == 0) continue;
    double others = 0;
    for (int r = 0; r < run.world_size; ++r)
      if (r != rank) others += after.tokens[size_t(r)] / double(run.world_size - 1);
    const double share = others > 0 ? after.tokens[size_t(rank)] / others : 1.0;
    out += fmt::format("  rank speed: rank {} runs {:.0f}% {} on equal work; the plan gives it {:.0f}% {} tokens than "
                       "the other ranks' mean (steps {}-{}, data.cost_calibration = auto)\n",
                       rank, 100 * std::fabs(speed - 1), speed > 1 ? "slower" : "faster", 100 * std::fabs(1 - share),
                       share < 1 ? "fewer" : "more", since, run.steps.back());
  }
  return out;
}

}  // namespace

std::string calibration_text(const RunData& run) {
  const nlohmann::json& sum = run.summary;
  if (!sum.is_object() || !sum.contains("cost_calibration") || !sum["cost_calibration"].is_object()) return "";
  const nlohmann::json& cc = sum["cost_calibration"];
  const nlohmann::json windows = cc.value("windows", nlohmann::json::array());
  std::vector<int64_t> switches;
  for (const nlohmann::json& w : windows)
    if (w.contains("replanned_from_step") && w["replanned_from_step"].is_number())
      switches.push_back(w["replanned_from_step"].get<int64_t>());
  std::string fits;
  const nlohmann::json fitted_keys = cc.value("fits", nlohmann::json::object());
  for (const auto& [key, on] : fitted_keys.items())
    if (on.is_boolean() && on.get<bool>()) fits += (fits.empty() ? "" : ", ") + key;
  std::string out = fmt::format("  cost calibration (data.cost_calibration = auto; fits {} and rank speeds): {} "
                                "window(s), {} re-plan(s)\n",
                                fits.empty() ? "nothing" : fits, windows.size(), switches.size());
  const int64_t first = run.steps.empty() ? 0 : run.steps.front();
  for (const nlohmann::json& w : windows) {
    const nlohmann::json steps = w.value("steps", nlohmann::json::array());
    out += fmt::format("    steps {}-{}: {}", steps.size() == 2 ? steps[0].dump() : "?",
                       steps.size() == 2 ? steps[1].dump() : "?", fitted(w));
    if (!w.contains("replanned_from_step") || !w["replanned_from_step"].is_number()) {
      out += "; " + w.value("decision", std::string("undecided")) + "\n";
      continue;
    }
    const int64_t from = w["replanned_from_step"].get<int64_t>();
    const auto at = std::find(switches.begin(), switches.end(), from);
    const int64_t before_first = at == switches.begin() ? first : *(at - 1);
    const int64_t after_end = at + 1 == switches.end() ? INT64_MAX : *(at + 1);
    const RangeFigures before = measure(run, before_first, from), after = measure(run, from, after_end);
    out += fmt::format("; re-planned from step {}: predicted imbalance {} -> {}", from,
                       number(w, "predicted_imbalance_before", "{:.3f}"), number(w, "predicted_imbalance_after", "{:.3f}"));
    if (before.steps > 0 && after.steps > 0)
      out += fmt::format("; measured over {} steps before and {} after: step-time imbalance p50 {:.3f} -> {:.3f}, "
                         "sync_wait {:.4f} -> {:.4f}, {:.1f} -> {:.1f} ms per rank and step (saved {:.2f} s per rank "
                         "over the {} steps after)",
                         before.steps, after.steps, before.imbalance_p50, after.imbalance_p50, before.sync_wait,
                         after.sync_wait, 1e3 * before.wait_per_step, 1e3 * after.wait_per_step,
                         (before.wait_per_step - after.wait_per_step) * double(after.steps), after.steps);
    out += "\n";
  }
  return out;
}

std::string rank_speed_text(const RunData& run) {
  const nlohmann::json& sum = run.summary;
  if (!sum.is_object() || !sum.contains("cost_calibration") || !sum["cost_calibration"].is_object() ||
      run.steps.empty())
    return "";
  const nlohmann::json in_force = sum["cost_calibration"].value("in_force", nlohmann::json::array());
  if (in_force.empty()) return "";
  return speed_lines(run, in_force.back().value("rank_speed", nlohmann::json::object()),
                     std::max(in_force.back().value("from_step", run.steps.front()), run.steps.front()));
}

}  // namespace kilter::diag
