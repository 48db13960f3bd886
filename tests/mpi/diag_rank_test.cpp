// MPI test of RankDiagnostics on 4 ranks without a trainer: a fake step loop (sleeps stand in
// for the phases, a real MPI_Allreduce for the gradient collective) where rank 2 sleeps longer
// in backward must name rank 2 and backward; the inject_delay drill on rank 1 must name rank 1
// and forward; a balanced loop must name nobody; rank 1 blocked in the K/V exchange of a cut
// piece (kv_wait, inside forward) must be named with kv_wait and the rank it waited for, with
// kv_wait taken out of forward so the phases still add up; the sharded units' waits (gather_wait
// in forward, scatter_wait in backward) are phases of their own, taken out of the passes, in the
// CSV, the trace and the summary, and never a straggler's phase. Also checks the files every rank
// writes.
// With an argument DIR the run directories are written under DIR and kept (for report tests).
// GoogleTest: every rank runs the same tests (their collectives in the same order); rank 0 prints
// the results, each failed check prints its rank, and the job fails when any rank failed.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/base/error.h"
#include "lib/diag/clock_sync.h"
#include "lib/diag/diagnostics.h"
#include "lib/diag/metrics_csv.h"

using kilter::diag::DiagOptions;
using kilter::diag::RankDiagnostics;

namespace {

int g_rank = 0;
int g_world = 1;
std::vector<std::string> g_temp_dirs;  // rank 0: removed at the end

// A check on this rank: a failure is printed with the rank (other ranks print no GoogleTest
// results) and fails the rank's test.
#define EXPECT(cond, what)                                                                      \
  do {                                                                                          \
    if (!(cond)) {                                                                              \
      std::fprintf(stderr, "rank %d: FAILED %s (%s:%d)\n", g_rank, what, __FILE__, __LINE__); \
      ADD_FAILURE() << "rank " << g_rank << ": " << what;                                       \
    }                                                                                           \
  } while (0)

void sleep_seconds(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }

constexpr int kKvPeer = 3;   // the rank kv_rank waits for
constexpr int kKvTokens = 96;

constexpr double kScatterWaitSeconds = 0.004;  // every rank's scatter_wait per backward (gather_rank >= 0)

// One run of `steps` fake steps; `slow_rank` sleeps `extra` more seconds in backward; `kv_rank`
// waits `extra` seconds for rank kKvPeer's K/V inside its second forward; `gather_rank` waits
// `extra` seconds on unit 3's gather inside its second forward (and every rank kScatterWaitSeconds
// on unit 2's reduce-scatter inside each backward).
nlohmann::json fake_run(const std::string& dir, int steps, int slow_rank, double extra,
                        const std::string& inject_delay, int kv_rank = -1, int gather_rank = -1) {
  DiagOptions opts;
  opts.run_dir = dir;
  opts.trace_steps = 5;
  opts.warn_window = 8;
  opts.inject_delay = inject_delay;
  RankDiagnostics diag(MPI_COMM_WORLD, opts);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::vector<float> grads(4096, 1.0f);
  // Between steps (an evaluation's gathers): not counted.
  if (gather_rank >= 0) diag.unit_wait(kilter::diag::kGatherWait, 0, 1'000'000'000, 1);
  for (int step = 0; step < steps; ++step) {
    diag.begin_step(step);
    diag.phase_begin(kilter::diag::kDataWait);
    diag.phase_end(kilter::diag::kDataWait);
    for (int micro = 0; micro < 2; ++micro) {  // gradient accumulation: phases entered twice
      diag.phase_begin(kilter::diag::kForward);
      sleep_seconds(0.010);
      if (rank == kv_rank && micro == 1) {
        RankDiagnostics::KvWait wait;
        wait.begin_ns = kilter::diag::steady_now_ns();
        sleep_seconds(extra);
        wait.end_ns = kilter::diag::steady_now_ns();
        wait.layer = 2;
        wait.peer = kKvPeer;
        wait.piece = "document 5, tokens 512-1023";
        diag.kv_wait(wait);
      }
      if (rank == gather_rank && micro == 1) {
        const int64_t begin = kilter::diag::steady_now_ns();
        sleep_seconds(extra);
        diag.unit_wait(kilter::diag::kGatherWait, begin, kilter::diag::steady_now_ns(), 3);
      }
      diag.phase_end(kilter::diag::kForward);
      diag.phase_begin(kilter::diag::kBackward);
      sleep_seconds(0.015 + (rank == slow_rank && micro == 1 ? extra : 0));
      if (gather_rank >= 0) {
        const int64_t begin = kilter::diag::steady_now_ns();
        sleep_seconds(kScatterWaitSeconds);
        diag.unit_wait(kilter::diag::kScatterWait, begin, kilter::diag::steady_now_ns(), 2);
      }
      diag.phase_end(kilter::diag::kBackward);
    }
    diag.set_step_work(1024 * (rank + 1), 1e5, 1, rank == kv_rank ? kKvTokens : 0);
    diag.mark_arrival();
    auto t0 = std::chrono::steady_clock::now();
    MPI_Allreduce(MPI_IN_PLACE, grads.data(), int(grads.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    diag.add_phase_seconds(kilter::diag::kCommExposed,
                           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    diag.phase_begin(kilter::diag::kOptimizer);
    sleep_seconds(0.005);
    diag.phase_end(kilter::diag::kOptimizer);
    diag.end_step(step, 4096, 5.0 - 0.01 * step);
  }
  nlohmann::json plan_stats = {{"padding_efficiency", 0.9}, {"cost_imbalance_p95", 1.01}};
  return diag.finish(plan_stats);
}

std::string g_keep_dir;  // argv[1]: write the runs there and keep them (tests/e2e/report.sh)

std::string make_run_dir(const char* name) {
  char buf[4096] = {};
  if (g_rank == 0 && !g_keep_dir.empty()) {
    std::snprintf(buf, sizeof buf, "%s/%s", g_keep_dir.c_str(), name);
  } else if (g_rank == 0) {
    std::string base = (std::filesystem::temp_directory_path() / "kilter-diag-mpi-XXXXXX").string();
    std::snprintf(buf, sizeof buf, "%s", base.c_str());
    if (!mkdtemp(buf)) std::abort();
    g_temp_dirs.push_back(buf);
    std::snprintf(buf + std::strlen(buf), sizeof buf - std::strlen(buf), "/%s", name);
  }
  MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, MPI_COMM_WORLD);
  return buf;
}

void check_files(const std::string& dir, int world, int steps) {
  // Every rank checks its own CSV and trace.
  auto rows = kilter::diag::read_metrics_csv(kilter::diag::metrics_path(dir, g_rank), g_rank);
  EXPECT(int(rows.size()) == steps, "one CSV row per step");
  if (!rows.empty()) {
    EXPECT(rows[0].tokens_computed == 1024 * (g_rank + 1), "tokens_computed recorded");
    EXPECT(rows[0].phase[kilter::diag::kForward] >= 0.02, "forward accumulates both micro-batches");
    EXPECT(rows.back().peak_rss_bytes > 0, "peak RSS recorded");
    EXPECT(rows.back().arrival > rows.front().arrival, "arrival grows with the steps");
  }
  std::ifstream trace(kilter::diag::trace_path(dir, g_rank));
  nlohmann::json events = nlohmann::json::parse(trace, nullptr, false);
  EXPECT(events.is_array(), "trace is a JSON array");
  int phases = 0;
  for (const auto& e : events)
    if (e.value("ph", "") == "X" && e.value("name", "") == "forward") {
      ++phases;
      EXPECT(e["pid"] == g_rank && e["tid"] == 0, "pid = rank, tid = 0");
    }
  EXPECT(phases == 2 * 5, "forward events of the first trace_steps steps only");
  (void)world;
}

constexpr int kSteps = 24;

}  // namespace

// Rank 2 sleeps 40 ms more in backward (steps are ~60 ms otherwise).
TEST(RankDiagnostics, SlowBackwardNamesRank2AndBackward) {
  const std::string dir = make_run_dir("slow-backward");
  nlohmann::json s = fake_run(dir, kSteps, 2, 0.04, "");
  check_files(dir, g_world, kSteps);
  if (g_rank == 0) {
    std::printf("slow backward: straggler %s sync_wait_fraction %.3f\n", s["straggler"].dump().c_str(),
                s["sync_wait_fraction"].get<double>());
    EXPECT(s["straggler_rank"] == 2, "rank 2 named straggler");
    EXPECT(s["straggler"]["phase"] == "backward", "its phase is backward");
    EXPECT(s["world_size"] == g_world, "world_size");
    EXPECT(s["steps"] == kSteps, "steps");
    EXPECT(s["padding_efficiency"] == 0.9, "extra fields kept");
    EXPECT(s["sync_wait_fraction"].get<double>() > 0.2, "others wait for rank 2");
    EXPECT(s["step_time_imbalance_p95"].get<double>() > 1.2, "compute-time imbalance seen");
    EXPECT(std::filesystem::exists(dir + "/summary.json"), "summary.json written");
  } else {
    EXPECT(s.is_null(), "finish returns {} on ranks other than 0");
  }
}

// The drill: rank 1 sleeps 40 ms inside forward once per step.
TEST(RankDiagnostics, InjectedDelayNamesRank1AndForward) {
  nlohmann::json s = fake_run(make_run_dir("inject"), kSteps, -1, 0, "1:0.04:forward");
  if (g_rank == 0) {
    std::printf("inject 1:0.04:forward: straggler %s\n", s["straggler"].dump().c_str());
    EXPECT(s["straggler_rank"] == 1, "rank 1 named straggler");
    EXPECT(s["straggler"]["phase"] == "forward", "its phase is forward");
  }
}

// Balanced: nobody beyond noise.
TEST(RankDiagnostics, BalancedNamesNobody) {
  nlohmann::json s = fake_run(make_run_dir("balanced"), kSteps, -1, 0, "");
  if (g_rank == 0) {
    std::printf("balanced: straggler %s sync_wait_fraction %.3f\n", s["straggler"].dump().c_str(),
                s["sync_wait_fraction"].get<double>());
    EXPECT(s["straggler_rank"] == -1, "no straggler when balanced");
  }
}

// Rank 1 waits 40 ms per step for the K/V of rank 3 (a cut piece): kv_wait, not forward, and
// rank 3 is named as the one it waited for.
TEST(RankDiagnostics, KvWaitNamesTheRankWaitedFor) {
  const std::string dir = make_run_dir("kv-wait");
  nlohmann::json s = fake_run(dir, kSteps, -1, 0.04, "", /*kv_rank=*/1);
  const auto rows = kilter::diag::read_metrics_csv(kilter::diag::metrics_path(dir, g_rank), g_rank);
  EXPECT(int(rows.size()) == kSteps, "one CSV row per step (kv_wait run)");
  for (const auto& r : rows) {
    using namespace kilter::diag;
    double named = 0;
    for (int p = 0; p < kStepTotal; ++p) named += r.phase[p];
    // kv_wait lies inside forward: counted once, so the phases never exceed the step.
    EXPECT(named <= r.phase[kStepTotal] + 1e-6, "phases add up to at most step_total");
    EXPECT(g_rank == 1 ? r.phase[kKvWait] >= 0.04 : r.phase[kKvWait] == 0, "kv_wait recorded on rank 1 only");
    EXPECT(r.kv_tokens == (g_rank == 1 ? kKvTokens : 0), "kv_tokens recorded");
    EXPECT(r.kv_wait_peer == (g_rank == 1 ? kKvPeer : -1), "kv_wait_peer recorded");
  }
  std::ifstream trace(kilter::diag::trace_path(dir, g_rank));
  nlohmann::json events = nlohmann::json::parse(trace, nullptr, false);
  int spans = 0;
  for (const auto& e : events)
    if (e.value("ph", "") == "X" && e.value("name", "") == "kv_wait") {
      ++spans;
      EXPECT(e["args"]["layer"] == 2 && e["args"]["waited_for_rank"] == kKvPeer &&
                 e["args"]["direction"] == "forward" && e["args"]["piece"] == "document 5, tokens 512-1023",
             "kv_wait span names the layer, direction, rank and piece");
    }
  EXPECT(spans == (g_rank == 1 ? 5 : 0), "one kv_wait span per wait of the traced steps");
  if (g_rank == 0) {
    std::printf("kv_wait on rank 1: straggler %s kv_wait_fraction %.3f\n", s["straggler"].dump().c_str(),
                s["kv_wait_fraction"].get<double>());
    EXPECT(s["straggler_rank"] == 1, "rank 1 named straggler (kv_wait)");
    EXPECT(s["straggler"]["phase"] == "kv_wait", "its phase is kv_wait");
    EXPECT(s["straggler"]["kv_wait_for_rank"] == kKvPeer, "the rank it waited for is named");
    EXPECT(s["kv_tokens_per_step"] == double(kKvTokens), "kv_tokens_per_step in the summary");
    EXPECT(s["kv_wait_fraction"].get<double>() > 0, "kv_wait_fraction in the summary");
  }
}

// Sharded parameters: rank 2 waits 40 ms per step on a unit's gather inside its forward, every
// rank on a reduce-scatter inside each backward. The waits are phases of their own (CSV, trace,
// summary), taken out of the passes so the phases still add up, and never the slowest phase.
TEST(RankDiagnostics, UnitWaitsArePhasesOfTheirOwn) {
  using namespace kilter::diag;
  const std::string dir = make_run_dir("unit-wait");
  nlohmann::json s = fake_run(dir, kSteps, -1, 0.04, "", -1, /*gather_rank=*/2);
  const auto rows = read_metrics_csv(metrics_path(dir, g_rank), g_rank);
  EXPECT(int(rows.size()) == kSteps, "one CSV row per step (unit wait run)");
  for (const auto& r : rows) {
    double named = 0;
    for (int p = 0; p < kStepTotal; ++p) named += r.phase[p];
    EXPECT(named <= r.phase[kStepTotal] + 1e-6, "phases add up to at most step_total (unit waits)");
    EXPECT(g_rank == 2 ? r.phase[kGatherWait] >= 0.04 : r.phase[kGatherWait] == 0, "gather_wait on rank 2 only");
    EXPECT(r.phase[kGatherWait] < 1.0, "a wait between steps is not counted");
    EXPECT(r.phase[kScatterWait] >= 2 * kScatterWaitSeconds, "scatter_wait of both backwards recorded");
    EXPECT(compute_seconds(r) <= r.phase[kStepTotal] - r.phase[kGatherWait] - r.phase[kScatterWait] + 1e-9,
           "the waits are not compute");
  }
  std::ifstream trace(trace_path(dir, g_rank));
  nlohmann::json events = nlohmann::json::parse(trace, nullptr, false);
  int gathers = 0, scatters = 0;
  for (const auto& e : events) {
    if (e.value("ph", "") != "X") continue;
    if (e.value("name", "") == "gather_wait") gathers += e["args"]["unit"] == 3;
    if (e.value("name", "") == "scatter_wait") scatters += e["args"]["unit"] == 2;
  }
  EXPECT(gathers == (g_rank == 2 ? 5 : 0), "one gather_wait span naming its unit per wait of the traced steps");
  EXPECT(scatters == 10, "one scatter_wait span naming its unit per backward of the traced steps");
  if (g_rank == 0) {
    std::printf("unit waits: straggler %s gather_wait_fraction %.3f scatter_wait_fraction %.3f\n",
                s["straggler"].dump().c_str(), s["gather_wait_fraction"].get<double>(),
                s["scatter_wait_fraction"].get<double>());
    EXPECT(s["gather_wait_fraction"].get<double>() > 0 && s["scatter_wait_fraction"].get<double>() > 0,
           "the unit waits' fractions in the summary");
    EXPECT(s["straggler"]["phase"] != "gather_wait" && s["straggler"]["phase"] != "scatter_wait",
           "a wait on the others is never the slowest phase");
    EXPECT(s["phase_means_seconds"].contains("gather_wait") && s["phase_means_seconds"].contains("scatter_wait"),
           "the unit waits in the phase means");
  }
}

// A drill naming a rank that does not exist is refused, naming the key.
TEST(RankDiagnostics, DrillOnAMissingRankIsRefused) {
  bool refused = false;
  try {
    DiagOptions opts;
    opts.run_dir = make_run_dir("bad");
    opts.inject_delay = std::to_string(g_world) + ":0.1";
    RankDiagnostics bad(MPI_COMM_WORLD, opts);
  } catch (const kilter::Error& e) {
    refused = std::string(e.what()).find("train.inject_delay") != std::string::npos;
  }
  EXPECT(refused, "inject_delay with rank >= world size refused");
}

int main(int argc, char** argv) {
  // Ranks waiting in a collective yield the core: with more ranks than cores (CI machines), a
  // spinning rank would otherwise delay the sleeping ones' wake-up and fake a straggler.
  setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  // An exception leaves RUN_ALL_TESTS and aborts the job: the other ranks would wait forever in
  // the next collective of a test that went on.
  ::testing::GTEST_FLAG(catch_exceptions) = false;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);
  kilter::set_error_rank(g_rank);
  if (argc > 1) g_keep_dir = argv[1];
  if (g_rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int local = 0;
  try {
    local = RUN_ALL_TESTS();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", g_rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int any = 0;
  MPI_Allreduce(&local, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (g_rank == 0) {
    std::printf("diag_rank_test: %s\n", any ? "FAILED on at least one rank" : "passed on every rank");
    for (const auto& d : g_temp_dirs) std::filesystem::remove_all(d);
  }
  MPI_Finalize();
  return any;
}
