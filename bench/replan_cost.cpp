// What an in-run re-plan costs (issue 39; run by bench/replan_cost.sh): for one shape (synthetic
// lengths, world size P, context, micro-batch budget, step size and the resolved cost model that
// `kilter plan --json` printed), the parts of data.cost_calibration = auto, timed apart in CPU
// seconds of this thread:
// - on the training thread of rank 0, per step: taking every rank's step record into the window
//   (CostCalibration::add_step) and handing the window over (start_window); of every rank, the
//   model's unpacking after the broadcast (no more);
// - on the background thread: the window's fit (20 steps x P ranks, synthetic times of a 1.2x
//   slower rank), the epoch's plan with the fitted model (= a re-plan), and the comparison with
//   the plan in force on 32 steps.
// And the largest window (kMaxCalibrationWindow steps, the window's work repeated): its hand-over
// on the training thread (the rows are shared, not copied) and its fit on the background thread.
// It checks what it timed: the fit finds the slow rank, the re-plan holds the same steps and
// tokens, and the comparison pays.
// Usage: kilter_bench_replan --lengths SPEC --docs N --world-size P --context C --max-tokens M
//          --tokens-per-step T --cost-b B --cost-c C --cost-t T [--seed S]
#include <time.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "io/base/error.h"
#include "lib/balance/plan.h"
#include "lib/balance/synthetic_lengths.h"
#include "lib/balance/calibration_window_fit.h"
#include "lib/train/calibration_in_run.h"

using namespace kilter;

namespace {

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Every rank's record of step s of `plan`, timed as a machine where rank 1 is 1.2x slower.
std::vector<diag::StepRecord> records_of(const balance::StepView& step, int64_t s, const balance::CostModel& truth) {
  const std::vector<balance::RankWork> work = balance::step_rank_work(step);
  std::vector<diag::StepRecord> out(work.size());
  for (size_t r = 0; r < work.size(); ++r) {
    diag::StepRecord& rec = out[r];
    rec.step = s;
    rec.rank = int32_t(r);
    rec.tokens_computed = int64_t(work[r].tokens);
    rec.attn_work = work[r].attn;
    rec.micro_batches = int32_t(work[r].micro_batches);
    const double seconds =
        1e-6 * (work[r].tokens + truth.b * work[r].attn + truth.c * work[r].micro_batches) * (r == 1 ? 1.2 : 1.0);
    rec.phase[diag::kForward] = seconds / 3;
    rec.phase[diag::kBackward] = 2 * seconds / 3;
  }
  return out;
}

struct FullWindow {
  double handover_seconds = 0, fit_seconds = 0;
  uint64_t rows = 0;
};

// The hand-over and the fit of a window of kMaxCalibrationWindow steps, its steps' records the
// first window's repeated (what is timed does not depend on the work, only on the rows).
FullWindow full_window(const std::vector<std::vector<diag::StepRecord>>& records, const train::CalibrationSettings& settings,
                       const balance::CostModel& planned) {
  train::CostCalibration calibration(settings, 0);
  const int world = settings.world_size;
  std::vector<diag::StepRecord> step_records;
  for (int64_t s = 0; s < train::kMaxCalibrationWindow + train::kCalibrationWarmup; ++s) {
    step_records = records[size_t(s) % records.size()];
    for (diag::StepRecord& r : step_records) r.step = s;
    calibration.add_step(step_records.data(), world);
  }
  FullWindow out;
  double t0 = cpu_seconds();
  std::shared_ptr<train::WindowJob> job = calibration.start_window(planned, {});
  out.handover_seconds = cpu_seconds() - t0;
  KILTER_CHECK(job->end - job->begin + 1 == train::kMaxCalibrationWindow, "the window holds steps " << job->begin << "-" << job->end);
  t0 = cpu_seconds();
  job->evaluate();
  out.fit_seconds = cpu_seconds() - t0;
  KILTER_CHECK(job->candidate && job->fit.rank_speed.at(1) > 1.1, "the full window's fit did not find the slow rank: " << job->kept);
  out.rows = job->fit.rows;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string lengths = "lognormal:5.5,1.3";
  uint64_t docs = 1000000, seed = 5;
  balance::PlanOptions opts;
  int world = 1024;
  opts.cost.b = 1e-4, opts.cost.c = 256, opts.cost.t = 0.05;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--lengths") lengths = value;
    else if (key == "--docs") docs = std::stoull(value);
    else if (key == "--seed") seed = std::stoull(value);
    else if (key == "--world-size") world = std::stoi(value);
    else if (key == "--context") opts.context = uint32_t(std::stoul(value));
    else if (key == "--max-tokens") opts.max_tokens = std::stoull(value);
    else if (key == "--tokens-per-step") opts.tokens_per_step = std::stoull(value);
    else if (key == "--cost-b") opts.cost.b = std::stod(value);
    else if (key == "--cost-c") opts.cost.c = std::stod(value);
    else if (key == "--cost-t") opts.cost.t = std::stod(value);
    else {
      std::fprintf(stderr, "kilter_bench_replan: unknown option %s\n", key.c_str());
      return 2;
    }
  }
  try {
    const std::vector<uint32_t> doc_lengths =
        balance::synthetic_lengths(balance::parse_length_spec(lengths), docs, seed);
    const std::vector<uint64_t> all = balance::all_documents(doc_lengths.size());
    const balance::EpochPlan plan = balance::build_epoch_plan(doc_lengths, all, opts, world, 0);
    const uint64_t window = std::min<uint64_t>(train::kFirstCalibrationWindow + train::kCalibrationWarmup, plan.steps.size());
    KILTER_CHECK(plan.steps.size() >= window + 1, "the epoch holds " << plan.steps.size() << " steps: too few");
    // The training thread: the window's records, one step at a time, then the hand-over.
    balance::CostModel truth = plan.cost;
    truth.b = 1.5 * plan.cost.b;
    train::CalibrationSettings settings =
        train::calibration_settings("auto", -1, -1, opts.cost.t, "balanced", world, plan.cost, false);
    train::CostCalibration calibration(settings, 0);
    std::vector<std::vector<diag::StepRecord>> records;
    for (uint64_t s = 0; s < window; ++s) records.push_back(records_of(plan.steps[s], int64_t(s), truth));
    double t0 = cpu_seconds();
    for (uint64_t s = 0; s < window; ++s) calibration.add_step(records[s].data(), world);
    const double add_seconds = (cpu_seconds() - t0) / double(window);
    KILTER_CHECK(calibration.window_complete(), "the window did not complete");
    t0 = cpu_seconds();
    std::shared_ptr<train::WindowJob> job = calibration.start_window(plan.cost, {});
    const double handover_seconds = cpu_seconds() - t0;
    // The background thread: fit, re-plan, comparison.
    t0 = cpu_seconds();
    job->evaluate();
    const double fit_seconds = cpu_seconds() - t0;
    KILTER_CHECK(job->candidate && job->fit.rank_speed.at(1) > 1.1, "the fit did not find the slow rank: " << job->kept);
    balance::PlanOptions next = opts;
    next.cost = job->model.cost;
    next.rank_speed = job->model.rank_speed;
    t0 = cpu_seconds();
    const balance::EpochPlan replanned = balance::build_epoch_plan(doc_lengths, all, next, world, 0);
    const double plan_seconds = cpu_seconds() - t0;
    KILTER_CHECK(replanned.steps.size() == plan.steps.size() && replanned.stats.target_tokens == plan.stats.target_tokens,
                 "the re-plan holds other steps");
    std::vector<balance::StepView> current, candidate;
    for (uint64_t s = window; s < plan.steps.size() && current.size() < train::kCalibrationCompareSteps; ++s)
      current.push_back(plan.steps[s]), candidate.push_back(replanned.steps[s]);
    t0 = cpu_seconds();
    const balance::PlanComparison comparison = balance::compare_divisions(current, candidate, job->fit);
    const double compare_seconds = cpu_seconds() - t0;
    KILTER_CHECK(comparison.pays(), "the re-plan of a 1.2x slower rank does not pay");
    const FullWindow full = full_window(records, settings, plan.cost);
    std::printf("{\"world_size\": %d, \"steps\": %llu, \"records_per_step_seconds\": %.3g, \"handover_seconds\": %.3g, "
                "\"fit_seconds\": %.3g, \"fit_rows\": %llu, \"replan_seconds\": %.3g, \"replan_seconds_per_step\": %.3g, "
                "\"compare_seconds\": %.3g, \"compared_steps\": %llu, \"predicted_gain\": %.4f, \"slow_rank_speed\": %.4f, "
                "\"full_window_steps\": %lld, \"full_handover_seconds\": %.3g, \"full_fit_seconds\": %.3g, \"full_fit_rows\": %llu}\n",
                world, (unsigned long long)plan.steps.size(), add_seconds, handover_seconds, fit_seconds,
                (unsigned long long)job->fit.rows, plan_seconds, plan_seconds / double(plan.steps.size()),
                compare_seconds, (unsigned long long)comparison.steps, comparison.relative_gain(),
                job->fit.rank_speed[1], (long long)train::kMaxCalibrationWindow, full.handover_seconds, full.fit_seconds,
                (unsigned long long)full.rows);
  } catch (const Error& e) {
    std::fprintf(stderr, "kilter_bench_replan: %s\n", e.what());
    return 1;
  }
  return 0;
}
