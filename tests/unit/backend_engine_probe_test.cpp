// Engine probes in a child process (lib/backend/engine_probe.h, probed_engines.h) with fake probe
// bodies: this test binary is its own child (main() answers the hidden subcommand). A probe that
// passes is cached for the node and served to its other ranks; a probe for another device, driver
// or cuDNN runs again; a child that aborts (the injected crash), throws, refuses or hangs is a
// failed verdict; and a failed verdict makes the run fall back (bf16 storage off, SDPA not used)
// with a log line that says what happened and where the verdict lies.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "io/error.h"
#include "lib/backend/engine_probe.h"
#include "lib/backend/probed_engines.h"

namespace fs = std::filesystem;
namespace kb = kilter::backend;

namespace {

// The fake body: args "behaviour=pass|refuse|throw|hang" and "count=FILE" (one line per run).
std::string fake_probe(const kb::ProbeRequest& request) {
  std::string behaviour = "pass";
  for (const std::string& arg : request.args) {
    if (arg.rfind("behaviour=", 0) == 0) behaviour = arg.substr(10);
    if (arg.rfind("count=", 0) == 0) std::ofstream(arg.substr(6), std::ios::app) << "ran\n";
  }
  if (behaviour == "refuse") return "out differs by 0.3 (limit 5e-02)";
  if (behaviour == "throw") KILTER_FAIL("cudnnCreate: CUDNN_STATUS_INTERNAL_ERROR");
  if (behaviour == "hang") std::this_thread::sleep_for(std::chrono::seconds(30));
  return "";
}

const kb::ProbeIdentity kIdentity{"NVIDIA H100 80GB HBM3 sm_90", "580.65.06 (CUDA 13.0)", "9.19.0"};

class EngineProbe : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kilter-probe-test." + std::to_string(getpid()) + "." +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    unsetenv(kb::kProbeCrashVariable);
  }
  void TearDown() override {
    unsetenv(kb::kProbeCrashVariable);
    fs::remove_all(dir_);
  }
  kb::ProbeRequest request(const std::string& engine, const std::string& behaviour) const {
    return {engine, "gpt2 heads 12/12 dim 64", {"behaviour=" + behaviour, "count=" + count_file()}, ""};
  }
  std::string count_file() const { return (dir_ / "count").string(); }
  int runs() const {
    std::ifstream in(count_file());
    int n = 0;
    for (std::string line; std::getline(in, line);) ++n;
    return n;
  }
  kb::ProbeVerdict probe(const kb::ProbeRequest& r, const kb::ProbeIdentity& id = kIdentity, double timeout = 60.0) {
    kb::ProbeLauncher launcher;
    launcher.timeout_s = timeout;
    return kb::node_verdict(launcher, r, id, (dir_ / "node").string(), /*prober=*/true, 1.0);
  }
  fs::path dir_;
};

TEST_F(EngineProbe, PassingProbeIsWrittenAndCachedForLaterRuns) {
  const kb::ProbeVerdict first = probe(request("sdpa", "pass"));
  EXPECT_TRUE(first.passed) << first.error;
  EXPECT_EQ(first.origin, "probed in a child process");
  const std::optional<kb::ProbeVerdict> file = kb::read_verdict(first.file);
  ASSERT_TRUE(file.has_value()) << first.file;
  EXPECT_EQ(file->engine, "sdpa");
  EXPECT_EQ(file->family, "gpt2 heads 12/12 dim 64");
  EXPECT_TRUE(file->identity == kIdentity);
  EXPECT_TRUE(file->passed);
  const kb::ProbeVerdict again = probe(request("sdpa", "pass"));
  EXPECT_TRUE(again.passed);
  EXPECT_EQ(again.origin, "cached from an earlier run");
  EXPECT_EQ(runs(), 1);
  // Another driver: the verdict does not hold, the probe runs again.
  kb::ProbeIdentity other = kIdentity;
  other.driver = "590.10.01 (CUDA 13.1)";
  EXPECT_EQ(probe(request("sdpa", "pass"), other).origin, "probed in a child process");
  EXPECT_EQ(runs(), 2);
}

TEST_F(EngineProbe, InjectedAbortInTheChildFallsBackWithAClearLine) {
  setenv(kb::kProbeCrashVariable, "sdpa", 1);
  const kb::ProbeVerdict v = probe(request("sdpa", "pass"));
  EXPECT_FALSE(v.passed);
  EXPECT_NE(v.error.find("the probe child died of signal 6"), std::string::npos) << v.error;
  EXPECT_EQ(runs(), 0);  // it died before probing
  const std::string line = kb::describe_verdict(v);
  std::printf("%s\n", line.c_str());
  EXPECT_NE(line.find("engine probe: sdpa [gpt2 heads 12/12 dim 64]"), std::string::npos) << line;
  EXPECT_NE(line.find("FAILED (the probe child died of signal 6"), std::string::npos) << line;
  EXPECT_NE(line.find("delete it to probe again"), std::string::npos) << line;
  // The run falls back: SDPA is not used under auto, and the choice says why.
  kilter::model::BackendOptions options;
  options.precision = "bf16";
  options.bf16_storage = "on";
  const std::string choice = kb::apply_engine_verdict(options, v, false);
  std::printf("%s\n", choice.c_str());
  EXPECT_NE(options.sdpa_refused.find("signal 6"), std::string::npos);
  EXPECT_NE(choice.find("cuDNN SDPA attention not used"), std::string::npos) << choice;
  // Asked for by name, it is an error naming the key.
  kilter::model::BackendOptions demanded = options;
  demanded.attention = "sdpa";
  demanded.sdpa_refused.clear();
  try {
    kb::apply_engine_verdict(demanded, v, false);
    ADD_FAILURE() << "train.attention=sdpa accepted a crashed probe";
  } catch (const kilter::Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.attention=sdpa"), std::string::npos) << e.what();
  }
  // Later parts of cut pieces crashing: only they leave SDPA.
  kilter::model::BackendOptions cut = kilter::model::BackendOptions();
  cut.precision = "bf16";
  kb::ProbeVerdict cut_verdict = v;
  cut_verdict.engine = "sdpa_cut";
  const std::string cut_choice = kb::apply_engine_verdict(cut, cut_verdict, false);
  EXPECT_TRUE(cut.sdpa_refused.empty());
  EXPECT_NE(cut.sdpa_cut_refused.find("signal 6"), std::string::npos);
  EXPECT_NE(cut_choice.find("later parts of cut pieces"), std::string::npos) << cut_choice;
  // The bf16 datapath crashing: fp32 activations.
  setenv(kb::kProbeCrashVariable, "all", 1);
  const kb::ProbeVerdict datapath = probe(request("bf16_datapath", "pass"));
  EXPECT_FALSE(datapath.passed);
  kilter::model::BackendOptions storage;
  storage.precision = "bf16";
  const std::string fallback = kb::apply_engine_verdict(storage, datapath, false);
  EXPECT_EQ(storage.bf16_storage, "off");
  EXPECT_TRUE(storage.bf16_storage_checked);
  EXPECT_NE(fallback.find("signal 6"), std::string::npos) << fallback;
}

TEST_F(EngineProbe, RefusalThrowAndHangAreFailedVerdicts) {
  const kb::ProbeVerdict refused = probe(request("sdpa", "refuse"));
  EXPECT_FALSE(refused.passed);
  EXPECT_EQ(refused.error, "out differs by 0.3 (limit 5e-02)");
  fs::remove_all(dir_ / "node");
  const kb::ProbeVerdict thrown = probe(request("sdpa", "throw"));
  EXPECT_FALSE(thrown.passed);
  EXPECT_NE(thrown.error.find("it failed to run: cudnnCreate: CUDNN_STATUS_INTERNAL_ERROR"), std::string::npos)
      << thrown.error;
  fs::remove_all(dir_ / "node");
  const kb::ProbeVerdict hung = probe(request("sdpa", "hang"), kIdentity, 0.5);
  EXPECT_FALSE(hung.passed);
  EXPECT_NE(hung.error.find("still running after 0.5 s and was killed"), std::string::npos) << hung.error;
}

TEST_F(EngineProbe, OtherRanksOfTheNodeWaitForTheFirst) {
  kb::ProbeVerdict waited;
  const kb::ProbeRequest r = request("sdpa", "pass");
  std::thread other([&] {
    kb::ProbeLauncher unused;
    waited = kb::node_verdict(unused, r, kIdentity, (dir_ / "node").string(), /*prober=*/false, 60.0);
  });
  const kb::ProbeVerdict first = probe(r);
  other.join();
  EXPECT_TRUE(first.passed);
  EXPECT_TRUE(waited.passed);
  EXPECT_EQ(waited.origin, "probed by the node's first rank");
  EXPECT_EQ(runs(), 1);
  // No first rank: a bounded wait, then a failed verdict naming the file.
  kb::ProbeLauncher unused;
  const kb::ProbeVerdict alone =
      kb::node_verdict(unused, request("bf16_datapath", "pass"), kIdentity, (dir_ / "empty").string(), false, 0.3);
  EXPECT_FALSE(alone.passed);
  EXPECT_NE(alone.error.find("no verdict from the node's first rank"), std::string::npos) << alone.error;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == kb::kProbeSubcommand) return kb::probe_child_main(argc - 2, argv + 2, fake_probe);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
