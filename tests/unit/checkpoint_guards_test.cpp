// Guards and signals without MPI: which config keys explain a hash mismatch, rank lists, and the
// async-signal-safe stop flag set by SIGUSR1 / SIGTERM.
#include <gtest/gtest.h>

#include <csignal>
#include <string>
#include <vector>

#include "io/error.h"
#include "lib/core/config.h"
#include "lib/train/guards.h"
#include "lib/train/signals.h"

namespace {

using kilter::Config;

bool contains_line_starting(const std::vector<std::string>& lines, const std::string& prefix) {
  for (const auto& l : lines)
    if (l.rfind(prefix, 0) == 0) return true;
  return false;
}

TEST(ConfigDifferences, NamesTheKeysThatChangeTheHash) {
  Config a, b;
  b.train.lr = 1e-3;
  b.model.n_embd = 128;
  b.train.steps = a.train.steps + 50;  // allowed to differ on resume: not in the hash
  b.output.dir = "elsewhere";
  ASSERT_NE(a.hash(), b.hash());
  auto hashed = kilter::train::config_differences(a.to_ini(), b.to_ini(), true);
  EXPECT_EQ(hashed.size(), 2u);
  EXPECT_TRUE(contains_line_starting(hashed, "train.lr = ")) << hashed.front();
  EXPECT_TRUE(contains_line_starting(hashed, "model.n_embd = 256 vs 128"));
  for (const auto& l : hashed)
    if (l.rfind("train.lr", 0) == 0) EXPECT_NE(l.find(" vs 0.001"), std::string::npos) << l;
  EXPECT_FALSE(contains_line_starting(hashed, "train.steps"));

  auto all = kilter::train::config_differences(a.to_ini(), b.to_ini(), false);
  EXPECT_EQ(all.size(), 4u);
  EXPECT_TRUE(contains_line_starting(all, "train.steps"));
  EXPECT_TRUE(contains_line_starting(all, "output.dir"));

  EXPECT_TRUE(kilter::train::config_differences(a.to_ini(), a.to_ini(), false).empty());
}

TEST(ConfigDifferences, OnlyAllowedKeysDifferMeansSameHash) {
  Config a, b;
  b.train.steps = 1000;
  b.output.keep_checkpoints = 9;
  b.comm.timeout_s = 5;
  b.train.attention = "cublaslt";
  b.train.cuda_graphs = true;
  EXPECT_EQ(a.hash(), b.hash());
  EXPECT_TRUE(kilter::train::config_differences(a.to_ini(), b.to_ini(), true).empty());
}

TEST(ConfigValidate, CudaEngineKeysAreChecked) {
  Config c;
  c.train.attention = "flash";
  try {
    c.validate();
    ADD_FAILURE() << "train.attention=flash accepted";
  } catch (const kilter::Error& e) {
    EXPECT_NE(e.message().find("train.attention"), std::string::npos) << e.message();
  }
  for (const char* engine : {"auto", "cudnn", "cublaslt"}) {
    c.train.attention = engine;
    EXPECT_NO_THROW(c.validate()) << engine;
  }
  const std::string ini = c.to_ini();
  EXPECT_NE(ini.find("attention = cublaslt"), std::string::npos) << ini;
  EXPECT_NE(ini.find("cuda_graphs = 0"), std::string::npos) << ini;
}

TEST(RankList, CompressesRuns) {
  EXPECT_EQ(kilter::train::format_rank_list({0, 1, 2, 3, 5, 7, 8}), "0-3,5,7-8");
  EXPECT_EQ(kilter::train::format_rank_list({4}), "4");
  EXPECT_EQ(kilter::train::format_rank_list({}), "");
}

TEST(StopSignals, Sigusr1AndSigtermSetTheFlagAndDoNotKill) {
  kilter::train::install_stop_signal_handlers();
  kilter::train::reset_stop_signal_for_test();
  EXPECT_EQ(kilter::train::stop_signal_received(), 0);
  std::raise(SIGUSR1);
  EXPECT_EQ(kilter::train::stop_signal_received(), SIGUSR1);
  std::raise(SIGTERM);  // a second signal keeps the first
  EXPECT_EQ(kilter::train::stop_signal_received(), SIGUSR1);
  kilter::train::reset_stop_signal_for_test();
  std::raise(SIGTERM);
  EXPECT_EQ(kilter::train::stop_signal_received(), SIGTERM);
  kilter::train::reset_stop_signal_for_test();
  EXPECT_EQ(kilter::train::kExitPreempted, 85);
}

TEST(FailHook, DoesNothingWithoutTheEnvironment) {
  // The ctest environment does not set KILTER_TEST_FAIL_RANK; the hook must be inert.
  for (int64_t step = 0; step < 5; ++step) EXPECT_NO_THROW(kilter::train::maybe_fail_for_test(0, step));
}

}  // namespace
