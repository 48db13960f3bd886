// `kilter report RUN_DIR`: the text summary of a run on stdout and RUN_DIR/report.html (or
// --html PATH). Thin: lib/diag/report does the work. Needs no MPI and runs on a login node.
#include <boost/program_options.hpp>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "app/commands.h"
#include "io/error.h"
#include "lib/core/config.h"
#include "lib/balance/calibrate.h"
#include "lib/diag/report.h"

namespace po = boost::program_options;

namespace kilter::app {

namespace {
void write_html(const std::string& path, const std::string& html) {
  std::ofstream out(path);
  KILTER_USER_CHECK(out, "cannot create " << path << ": check that its folder exists and is writable");
  out << html;
  out.close();
  KILTER_USER_CHECK(out, "cannot write " << path << " (disk full?)");
}
}  // namespace

// What the run's own cut-cost check recorded in summary.json (cut_cost_check); ran = false where
// it has none.
static balance::RunCutCostCheck run_cut_cost_check(const nlohmann::json& summary) {
  balance::RunCutCostCheck check;
  if (!summary.contains("cut_cost_check") || !summary["cut_cost_check"].is_object()) return check;
  const nlohmann::json& cc = summary["cut_cost_check"];
  check.ran = true;
  check.measured = cc.value("measured", false);
  check.charge_held = cc.value("charge_held", true);
  check.replanned = !cc.value("replanned_from_step", nlohmann::json()).is_null();
  check.rows = cc.value("rows", uint64_t(0));
  const nlohmann::json& window = cc.value("window", nlohmann::json::array());
  if (window.is_array() && window.size() == 2) {
    check.window_begin = window[0].get<int64_t>();
    check.window_end = window[1].get<int64_t>();
  }
  return check;
}

// A run with cut pieces: whether their K/V waits cost more than the plan charged,
// measured over the whole run as the run's cut-cost check measures its window, in the units of
// the plan's own cost model (summary.json plan_cost_a/b/c; a run written before they were
// recorded: the ratios of a regression over its rows), and set beside that check's verdict
// (balance::report_cut_cost_advice has the rule); "" where there is nothing to say, or where the
// run's rows cannot be read or fitted.
static std::string cut_cost_advice(const diag::RunData& run) {
  if (!run.summary.is_object() || !run.summary.contains("plan_cost_t") ||
      run.summary.value("cuts_per_step_max", 0.0) <= 0)
    return "";
  try {
    const balance::RunCutCostCheck run_check = run_cut_cost_check(run.summary);
    if (run_check.replanned) return "";
    const std::vector<balance::CostSample> samples = balance::read_cost_samples(run.run_dir, 2);
    balance::CostModel plan_cost;
    if (run.summary.contains("plan_cost_a") && run.summary.contains("plan_cost_b") &&
        run.summary.contains("plan_cost_c")) {
      plan_cost.a = run.summary["plan_cost_a"].get<double>();
      plan_cost.b = run.summary["plan_cost_b"].get<double>();
      plan_cost.c = run.summary["plan_cost_c"].get<double>();
    } else {
      const balance::CostFit fit = balance::fit_cost_model(samples);
      if (!(fit.a > 0)) return "";
      plan_cost.a = 1;
      plan_cost.b = fit.b_over_a();
      plan_cost.c = fit.c_over_a();
    }
    plan_cost.t = run.summary["plan_cost_t"].get<double>();
    return balance::report_cut_cost_advice(balance::check_cut_cost(samples, plan_cost), run_check);
  } catch (const Error&) {
    return "";
  } catch (const nlohmann::json::exception&) {
    return "";
  }
}

int cmd_report(int argc, char** argv) {
  const char* usage =
      "usage: kilter report RUN_DIR [--html PATH] [--json]\n"
      "       kilter report --compare RUN_A RUN_B ... [--html PATH]\n\n"
      "Reads RUN_DIR/metrics/rank-*.csv, summary.json and config.ini of a kilter train run (finished or\n"
      "not), prints per-rank phase times, the straggler verdict, stalls and the plan statistics, and\n"
      "writes a self-contained report.html (charts: rank x step heatmap, phases per rank, loss,\n"
      "tokens/s, train and eval loss against tokens from metrics/train.csv). Stalls caused by evaluation,\n"
      "checkpoints or samples are named. --compare puts runs side by side on one page (default\n"
      "compare.html): loss curves, tokens/s, and throughput, balance and phase figures. See docs/diagnostics.md.";
  std::string run_dir, html_path;
  bool json = false;
  std::vector<std::string> compare;
  po::options_description desc("options");
  desc.add_options()
      ("help,h", "show this help")
      ("run-dir", po::value(&run_dir), "run directory (the positional argument)")
      ("html", po::value(&html_path), "where to write the HTML report (default RUN_DIR/report.html)")
      ("json", po::bool_switch(&json), "print the recomputed statistics as JSON instead of text")
      ("compare", po::value(&compare)->multitoken(), "RUN_A RUN_B ...: the runs side by side on one page");
  po::positional_options_description positional;
  positional.add("run-dir", 1);
  try {
    po::variables_map vm;
    po::store(parse_exact(argc, argv, desc, "kilter report", &positional), vm);
    if (vm.count("help")) {
      std::cout << usage << "\n\n" << desc << "\n";
      return 0;
    }
    po::notify(vm);
    if (!compare.empty()) {
      if (!run_dir.empty()) compare.insert(compare.begin(), run_dir);
      if (compare.size() < 2) {
        std::cerr << "kilter report: --compare needs at least two run directories\n" << usage << "\n";
        return 2;
      }
      std::vector<diag::RunData> runs;
      std::vector<nlohmann::json> stats;
      for (const std::string& dir : compare) {
        runs.push_back(diag::load_run(dir));
        stats.push_back(diag::recompute_statistics(runs.back()));
      }
      if (html_path.empty()) html_path = "compare.html";
      write_html(html_path, diag::compare_html(runs, stats));
      std::cout << diag::compare_text(runs, stats) << "\nreport: " << html_path << "\n";
      return 0;
    }
    if (run_dir.empty()) {
      std::cerr << "kilter report: RUN_DIR is required\n" << usage << "\n";
      return 2;
    }
    diag::RunData run = diag::load_run(run_dir);
    nlohmann::json stats = diag::recompute_statistics(run);
    if (html_path.empty()) html_path = run_dir + "/report.html";
    write_html(html_path, diag::report_html(run, stats));
    const std::string advice = cut_cost_advice(run);
    if (json) {
      if (!advice.empty()) stats["cut_cost_advice"] = advice;
      std::cout << stats.dump(2) << "\n";
    } else {
      std::cout << diag::report_text(run, stats);
      if (!advice.empty()) std::cout << "  advice: " << advice << "\n";
      std::cout << "\nreport: " << html_path << "\n";
    }
    return 0;
  } catch (po::error& e) {
    std::cerr << "kilter report: " << program_options_message(e) << "\n";
    return 2;
  } catch (const Error& e) {
    std::cerr << "kilter report: " << e.what() << "\n";
    return e.is_user_error() ? 2 : 1;
  } catch (const std::exception& e) {
    std::cerr << "kilter report: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace kilter::app
