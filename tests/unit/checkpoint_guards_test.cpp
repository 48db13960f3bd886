// Guards and signals without MPI: which config keys explain a hash mismatch, rank lists, and the
// stop flag set by SIGUSR1 / SIGTERM (taken by a watcher thread, never by a thread running GEMMs).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "io/base/error.h"
#include "lib/core/config.h"
#include "lib/model/gemm.h"
#include "io/text_format.h"
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
  for (const char* engine : {"auto", "sdpa", "cudnn", "cublaslt"}) {
    c.train.attention = engine;
    EXPECT_NO_THROW(c.validate()) << engine;
  }
  const std::string ini = c.to_ini();
  EXPECT_NE(ini.find("attention = cublaslt"), std::string::npos) << ini;
  EXPECT_NE(ini.find("cuda_graphs = 0"), std::string::npos) << ini;
}

TEST(RankList, CompressesRuns) {
  EXPECT_EQ(kilter::io::rank_list_text({0, 1, 2, 3, 5, 7, 8}), "0-3,5,7-8");
  EXPECT_EQ(kilter::io::rank_list_text({4}), "4");
  EXPECT_EQ(kilter::io::rank_list_text({}), "");
  EXPECT_EQ(kilter::io::rank_list_text({6, 0, 2, 5}), "0,2,5-6");  // any order
}

TEST(StopSignals, Sigusr1AndSigtermSetTheFlagAndDoNotKill) {
  using kilter::train::raise_stop_signal_for_test;
  kilter::train::install_stop_signal_handlers();
  kilter::train::reset_stop_signal_for_test();
  EXPECT_EQ(kilter::train::stop_signal_received(), 0);
  raise_stop_signal_for_test(SIGUSR1);
  EXPECT_EQ(kilter::train::stop_signal_received(), SIGUSR1);
  raise_stop_signal_for_test(SIGTERM);  // a second signal keeps the first
  EXPECT_EQ(kilter::train::stop_signal_received(), SIGUSR1);
  kilter::train::reset_stop_signal_for_test();
  raise_stop_signal_for_test(SIGTERM);
  EXPECT_EQ(kilter::train::stop_signal_received(), SIGTERM);
  kilter::train::reset_stop_signal_for_test();
  EXPECT_EQ(kilter::train::kExitPreempted, 85);
}

TEST(StopSignals, AreBlockedInTheInstallingThreadAndTheThreadsItStarts) {
  kilter::train::install_stop_signal_handlers();
  auto blocked = [] {
    sigset_t mask;
    pthread_sigmask(SIG_BLOCK, nullptr, &mask);
    return sigismember(&mask, SIGUSR1) == 1 && sigismember(&mask, SIGTERM) == 1;
  };
  EXPECT_TRUE(blocked());
  bool in_child = false;
  std::thread([&] { in_child = blocked(); }).join();
  EXPECT_TRUE(in_child);
}

// The regression test of e2e_fault_signal's heap corruption: oneDNN's JIT sgemm kernels (Debian's
// 2.6) point the stack pointer into a heap workspace, so a signal handled on the thread running
// them wrote its frame into the heap ("corrupted size vs. prev_size" within a few thousand GEMMs
// when the handler ran on this thread). Stop signals now never land on it: GEMMs of training
// shapes, checked element by element, while another thread preempts the process non-stop.
TEST(StopSignals, AStormOfStopSignalsLeavesGemmsIntact) {
  kilter::train::install_stop_signal_handlers();
  kilter::train::reset_stop_signal_for_test();
  kilter::model::set_gemm_threads(1);
  std::atomic<bool> done{false};
  std::atomic<long> sent{0};
  std::thread sender([&] {
    while (!done.load()) {
      ::kill(::getpid(), sent.load() % 2 ? SIGTERM : SIGUSR1);
      sent.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  });
  std::mt19937 rng(7);
  int wrong = 0;
  for (int it = 0; it < 3000 && wrong == 0; ++it) {
    // dweight (OC,C) += dout^T (OC,N) @ inp (N,C) and dinp (N,C) = dout (N,OC) @ weight (OC,C).
    const int shapes[][2] = {{16, 48}, {16, 16}, {16, 64}, {64, 16}, {16, 97}};
    const auto& shape = shapes[rng() % 5];
    const int N = 1 + int(rng() % 256), C = shape[0], OC = shape[1];
    const bool transposed = rng() % 2;
    const int M = transposed ? OC : N, K = transposed ? N : OC;
    std::vector<float> a(size_t(M) * K), b(size_t(K) * C), out(size_t(M) * C + 16, 7.0f), expected(size_t(M) * C);
    for (float& x : a) x = float(int(rng() % 7) - 3);
    for (float& x : b) x = float(int(rng() % 5) - 2);
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < C; ++j) {
        double sum = 0;
        for (int k = 0; k < K; ++k)
          sum += double(transposed ? a[size_t(k) * M + i] : a[size_t(i) * K + k]) * b[size_t(k) * C + j];
        expected[size_t(i) * C + j] = float(sum);
      }
    kilter::model::sgemm_rowmajor(transposed, false, M, C, K, 1.0f, a.data(), transposed ? M : K, b.data(), C, 0.0f,
                                  out.data(), C);
    for (size_t i = 0; i < out.size() && wrong == 0; ++i)
      if (out[i] != (i < expected.size() ? expected[i] : 7.0f)) {
        ++wrong;
        ADD_FAILURE() << "GEMM " << it << " (" << M << "x" << C << "x" << K << ", transposed " << transposed
                      << "): element " << i << " is " << out[i];
      }
  }
  done = true;
  sender.join();
  EXPECT_GT(sent.load(), 0);
  kilter::train::raise_stop_signal_for_test(SIGUSR1);  // the watcher is still taking them
  EXPECT_NE(kilter::train::stop_signal_received(), 0);
  kilter::train::reset_stop_signal_for_test();
}

TEST(FailHook, DoesNothingWithoutTheEnvironment) {
  // The ctest environment does not set KILTER_TEST_FAIL_RANK; the hook must be inert.
  for (int64_t step = 0; step < 5; ++step) EXPECT_NO_THROW(kilter::train::maybe_fail_for_test(0, step));
}

}  // namespace
