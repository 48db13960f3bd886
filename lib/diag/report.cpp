// Loading a run directory and the text report of `kilter report` (see report.h); the HTML
// rendering lives in report_html.cpp.
#include "lib/diag/report.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "io/base/error.h"
#include "io/text_format.h"
#include "lib/diag/metrics_csv.h"
#include "lib/diag/run_statistics.h"

namespace kilter::diag {

namespace fs = std::filesystem;

namespace {

std::string read_text_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The resolved config.ini as "section.key" -> value.
std::map<std::string, std::string> parse_ini(const std::string& text) {
  std::map<std::string, std::string> out;
  for (auto& [key, value] : io::ini_entries(text)) out[key] = value;
  return out;
}

std::string json_number(const nlohmann::json& j, const char* key, const char* format = "{:.4g}") {
  if (!j.is_object() || !j.contains(key) || j[key].is_null()) return "n/a";
  if (j[key].is_number()) return fmt::format(fmt::runtime(format), j[key].get<double>());
  if (j[key].is_string()) return j[key].get<std::string>();
  return j[key].dump();
}

// A run with sharded parameters (train.shard = parameters in its config.ini, or unit waits in
// its statistics): the report shows gather_wait and scatter_wait.
bool sharded_parameters(const RunData& run, const nlohmann::json& st) {
  const auto shard = run.config.find("train.shard");
  if (shard != run.config.end() && shard->second == "parameters") return true;
  return st.value("gather_wait_fraction", 0.0) > 0 || st.value("scatter_wait_fraction", 0.0) > 0;
}

}  // namespace

RunData load_run(const std::string& run_dir) {
  RunData run;
  run.run_dir = run_dir;
  KILTER_USER_CHECK(fs::is_directory(run_dir), run_dir << " is not a directory: name the output.dir of a kilter train run");
  const std::string summary_path = run_dir + "/summary.json";
  if (fs::exists(summary_path)) {
    std::ifstream in(summary_path);
    run.summary = nlohmann::json::parse(in, nullptr, false);
    KILTER_USER_CHECK(!run.summary.is_discarded(), "" << summary_path << " is not valid JSON");
  }
  const std::string config_path = run_dir + "/config.ini";
  if (fs::exists(config_path)) {
    run.config_text = read_text_file(config_path);
    run.config = parse_ini(run.config_text);
    auto it = run.config.find("output.stall_factor");
    if (it != run.config.end()) run.stall_factor = std::atof(it->second.c_str());
    if (!(run.stall_factor > 1)) run.stall_factor = 2.0;
    auto integer = [&](const char* key) -> int64_t {
      auto found = run.config.find(key);
      return found == run.config.end() ? 0 : std::atoll(found->second.c_str());
    };
    run.eval_every = integer("train.eval_every");
    run.checkpoint_every = integer("output.checkpoint_every");
    run.sample_every = integer("output.sample_every");
  }

  // The ranks: from summary.json, else the CSV files present.
  const std::string metrics_dir = run_dir + "/metrics";
  KILTER_USER_CHECK(fs::is_directory(metrics_dir), "no metrics directory " << metrics_dir);
  int files = 0;
  const std::regex name_re("rank-([0-9]{5})\\.csv");
  for (const auto& entry : fs::directory_iterator(metrics_dir)) {
    std::smatch m;
    std::string name = entry.path().filename().string();
    if (std::regex_match(name, m, name_re)) files = std::max(files, std::stoi(m[1]) + 1);
  }
  run.world_size = run.summary.is_object() && run.summary.contains("world_size")
                       ? run.summary["world_size"].get<int>()
                       : files;
  KILTER_USER_CHECK(run.world_size > 0, "no metrics/rank-NNNNN.csv in " << metrics_dir);
  run.rows.resize(run.world_size);
  std::set<int64_t> common;
  for (int r = 0; r < run.world_size; ++r) {
    run.rows[r] = read_metrics_csv(metrics_path(run_dir, r), r);
    std::set<int64_t> mine;
    for (const auto& rec : run.rows[r]) mine.insert(rec.step);
    if (r == 0) {
      common = mine;
    } else {
      std::set<int64_t> both;
      std::set_intersection(common.begin(), common.end(), mine.begin(), mine.end(),
                            std::inserter(both, both.begin()));
      common.swap(both);
    }
  }
  run.steps.assign(common.begin(), common.end());
  run.train = read_train_csv(train_csv_path(run_dir));
  return run;
}

std::string stall_cause(const RunData& run, int64_t step, const std::string& phase) {
  if (phase != "outside" || step <= 0) return "";
  std::string cause;
  auto add = [&](int64_t every, const char* what, const char* key) {
    if (every > 0 && step % every == 0)
      cause += (cause.empty() ? "" : " + ") + fmt::format("{} ({} = {})", what, key, every);
  };
  add(run.eval_every, "evaluation", "train.eval_every");
  add(run.checkpoint_every, "checkpoint", "output.checkpoint_every");
  add(run.sample_every, "sample", "output.sample_every");
  return cause;
}

nlohmann::json recompute_statistics(const RunData& run) {
  RunStatistics stats(run.world_size, run.stall_factor);
  std::vector<size_t> cursor(run.world_size, 0);
  std::vector<StepRecord> step_records(run.world_size);
  for (int64_t step : run.steps) {
    for (int r = 0; r < run.world_size; ++r) {
      const auto& rows = run.rows[r];
      while (rows[cursor[r]].step < step) ++cursor[r];  // the step is present: rows are sorted
      step_records[r] = rows[cursor[r]];
    }
    stats.add_step(step_records.data());
  }
  nlohmann::json j = stats.to_json();
  j["steps_recorded"] = run.steps.size();
  return j;
}

// The engines: each probe's verdict and what the run chose (cuda backend), and the attention
// graphs rank 0 built in its first steps (cuDNN SDPA per shape bucket), where there were any.
std::string engine_text(const nlohmann::json& sum) {
  std::ostringstream os;
  for (const nlohmann::json& probe : sum.value("engine_probes", nlohmann::json::array()))
    if (probe.is_object())
      os << "  engine probe " << probe.value("engine", "?") << " [" << probe.value("family", "?") << "]: "
         << (probe.value("passed_everywhere", false) ? "passed" : "FAILED (" + probe.value("error", std::string()) + ")")
         << "; " << probe.value("choice", "") << "\n";
  const nlohmann::json builds = sum.value("graph_builds_early", nlohmann::json::object());
  if (builds.is_object() && builds.value("graphs", 0) > 0)
    os << fmt::format("  attention graphs built in the first {} steps (rank 0): {} in {:.2f} s\n",
                      builds.value("steps", 0), builds.value("graphs", 0), builds.value("seconds", 0.0));
  return os.str();
}

std::string report_text(const RunData& run, const nlohmann::json& st) {
  std::ostringstream os;
  const nlohmann::json& sum = run.summary;
  os << "kilter report: " << run.run_dir << "\n";
  os << fmt::format("  world size {}, steps recorded by every rank {}", run.world_size, run.steps.size());
  if (!run.steps.empty()) os << fmt::format(" ({}..{})", run.steps.front(), run.steps.back());
  os << "\n";
  if (sum.is_object()) {
    os << "  final loss " << json_number(sum, "final_loss") << ", tokens/s "
       << json_number(sum, "tokens_per_second", "{:.0f}") << ", backend " << json_number(sum, "backend")
       << ", sampler " << json_number(sum, "sampler") << "\n";
    if (sum.contains("mfu"))
      os << "  model FLOPs: " << json_number(sum, "model_flops_per_token", "{:.4g}") << " per token, "
         << json_number(sum, "model_tflops_per_rank", "{:.3g}") << " TFLOP/s per rank, MFU "
         << fmt::format("{:.1f}%", 100 * sum.value("mfu", 0.0)) << " of " << json_number(sum, "mfu_peak_tflops", "{:.3g}")
         << " TFLOP/s (comm.device_tflops)\n";
    os << engine_text(sum);
    os << "  plan: padding_efficiency " << json_number(sum, "padding_efficiency") << ", cost_imbalance p50 "
       << json_number(sum, "cost_imbalance_p50") << " p95 " << json_number(sum, "cost_imbalance_p95")
       << " max " << json_number(sum, "cost_imbalance_max") << ", steps_per_epoch "
       << json_number(sum, "steps_per_epoch") << ", micro_batches_per_step "
       << json_number(sum, "micro_batches_per_step") << "\n";
    if (sum.value("cuts_per_step_max", 0.0) > 0)
      os << "  plan cuts: per step p50 " << json_number(sum, "cuts_per_step_p50") << " max "
         << json_number(sum, "cuts_per_step_max") << ", K/V bytes per step p50 "
         << json_number(sum, sum.contains("kv_bytes_per_step_p50") ? "kv_bytes_per_step_p50" : "plan_kv_bytes_per_step_p50",
                        "{:.3g}")
         << "; cost_imbalance p95 without cuts "
         << json_number(sum, "cost_imbalance_uncut_p95") << ", whole-piece bound "
         << json_number(sum, "cost_imbalance_bound_p95") << "\n";
    if (sum.contains("cut_cost_check") && sum["cut_cost_check"].is_object()) {
      const nlohmann::json& cc = sum["cut_cost_check"];
      const nlohmann::json& window = cc.value("window", nlohmann::json::array());
      os << "  cut-cost check";
      if (window.is_array() && window.size() == 2)
        os << fmt::format(" (steps {}-{})", window[0].dump(), window[1].dump());
      if (!cc.value("measured", false)) {
        os << ": no rank received K/V of a cut piece\n";
      } else {
        os << ": kv_wait measured t = " << json_number(cc, "measured_t", "{:.3g}") << " per earlier token, the plan "
           << "charged " << json_number(cc, "planned_t", "{:.3g}");
        if (cc.contains("replanned_from_step") && !cc["replanned_from_step"].is_null())
          os << "; steps from " << cc["replanned_from_step"].dump() << " on were planned with the measured charge\n";
        else if (cc.value("charge_held", true))
          os << ": the charge held\n";
        else
          os << ": the charge did not hold, and the run kept its plan (data.cut_cost_replan = false)\n";
      }
    }
    os << calibration_text(run);
  } else {
    os << "  (no summary.json: the run did not finish; figures below come from the metrics CSVs)\n";
  }
  os << "  step time: median " << json_number(st, "median_step_seconds") << " s, imbalance p50 "
     << json_number(st, "step_time_imbalance_p50") << " p95 " << json_number(st, "step_time_imbalance_p95")
     << " (max/mean of per-rank compute time), sync_wait_fraction " << json_number(st, "sync_wait_fraction")
     << "\n";
  if (st.value("kv_tokens_per_step", 0.0) > 0)
    os << "  cut pieces: " << json_number(st, "kv_tokens_per_step") << " earlier tokens' K/V received per step, "
       << "kv_wait_fraction " << json_number(st, "kv_wait_fraction") << " (share of rank-time waiting for them)\n";
  if (sharded_parameters(run, st))
    os << "  sharded parameters: gather_wait_fraction " << json_number(st, "gather_wait_fraction")
       << ", scatter_wait_fraction " << json_number(st, "scatter_wait_fraction")
       << " (share of rank-time blocked on the units' all-gathers and reduce-scatters)\n";

  const nlohmann::json& sg = st["straggler"];
  if (st["straggler_rank"].get<int>() >= 0) {
    os << fmt::format("  straggler: rank {}, last to arrive in {:.0f}% of steps (named at >= {:.0f}%), "
                      "mean lag {:.4f} s, slowest phase {} (+{:.4f} s per step over the other ranks' median)\n",
                      sg["candidate"].get<int>(), 100 * sg["share"].get<double>(),
                      100 * sg["threshold"].get<double>(), sg["mean_lag_seconds"].get<double>(),
                      sg["phase"].get<std::string>(), sg["phase_excess_seconds"].get<double>());
    if (sg.value("kv_wait_for_rank", -1) >= 0)
      os << fmt::format("  (its kv_wait is time spent waiting for the K/V of cut pieces held by rank {})\n",
                        sg["kv_wait_for_rank"].get<int>());
    // A rank slower at computing the same work, in a run that divided by the configured model:
    // the in-run calibration is what fits such a rank's speed (docs/plan.md, "In-run calibration").
    const std::string phase = sg["phase"].get<std::string>();
    if ((phase == "forward" || phase == "backward") && !run.summary.contains("cost_calibration"))
      os << fmt::format("  (if rank {} is slower on all work, data.cost_calibration = auto measures its speed and "
                        "gives it less)\n",
                        sg["candidate"].get<int>());
  } else if (sg["candidate"].get<int>() >= 0) {
    os << fmt::format("  straggler: none beyond noise (rank {} was last in {:.0f}% of steps; naming needs "
                      ">= {:.0f}%)\n",
                      sg["candidate"].get<int>(), 100 * sg["share"].get<double>(),
                      100 * sg["threshold"].get<double>());
  } else {
    os << "  straggler: none beyond noise\n";
  }
  os << rank_speed_text(run);

  const nlohmann::json& stalls = st["stalls"];
  os << fmt::format("  stalls: {} step(s) slower than {:.1f}x the median", stalls["count"].get<int>(),
                    stalls["factor"].get<double>());
  if (stalls["period"].get<int64_t>() > 0) os << fmt::format(", recurring every {} steps", stalls["period"].get<int64_t>());
  os << "\n";
  int shown = 0;
  for (const auto& s : stalls["steps"]) {
    if (++shown > 10) {
      os << "    ...\n";
      break;
    }
    const std::string cause = stall_cause(run, s["step"].get<int64_t>(), s["phase"].get<std::string>());
    os << fmt::format("    step {}: {:.4f} s, {} +{:.4f} s{}\n", s["step"].get<int64_t>(), s["seconds"].get<double>(),
                      s["phase"].get<std::string>(), s["excess_seconds"].get<double>(),
                      cause.empty() ? "" : ": " + cause);
  }

  const nlohmann::json& mem = st["memory"];
  std::vector<double> rss;
  for (const auto& v : mem["peak_rss_bytes"]) rss.push_back(v.get<double>());
  if (!rss.empty())
    os << fmt::format("  memory: peak RSS per rank {} .. {} (max/min {:.3f})", io::human_bytes(*std::min_element(rss.begin(), rss.end())),
                      io::human_bytes(*std::max_element(rss.begin(), rss.end())), mem["rss_max_min_ratio"].get<double>());
  if (mem.contains("device_max_min_ratio"))
    os << fmt::format(", device max/min {:.3f}", mem["device_max_min_ratio"].get<double>());
  os << "\n\n";

  // The per-rank phase table; with many ranks, the slowest ones by compute time.
  const nlohmann::json& means = st["phase_means_seconds"];
  std::vector<int> ranks(run.world_size);
  for (int r = 0; r < run.world_size; ++r) ranks[r] = r;
  const int kMaxRows = 32;
  if (run.world_size > kMaxRows) {
    std::sort(ranks.begin(), ranks.end(), [&](int a, int b) {
      return means["compute"][a].get<double>() > means["compute"][b].get<double>();
    });
    ranks.resize(kMaxRows);
    os << fmt::format("mean seconds per step, the {} ranks with the longest compute time:\n", kMaxRows);
  } else {
    os << "mean seconds per step per rank:\n";
  }
  std::vector<std::string> cols = {"data_wait", "h2d", "forward", "backward", "kv_wait"};
  if (sharded_parameters(run, st)) cols.insert(cols.end(), {"gather_wait", "scatter_wait"});
  cols.insert(cols.end(), {"comm_exposed", "optimizer", "other", "outside", "compute", "step_total"});
  os << fmt::format("{:>6}", "rank");
  for (const auto& c : cols) os << fmt::format(" {:>12}", c);
  os << fmt::format(" {:>7}\n", "last%");
  for (int r : ranks) {
    os << fmt::format("{:>6}", r);
    // A summary written before a phase existed has no column for it.
    for (const auto& c : cols) os << fmt::format(" {:>12.6f}", means.contains(c) ? means[c][r].get<double>() : 0.0);
    os << fmt::format(" {:>7.1f}\n", 100 * st["last_arrival_share"][r].get<double>());
  }
  return os.str();
}

}  // namespace kilter::diag
