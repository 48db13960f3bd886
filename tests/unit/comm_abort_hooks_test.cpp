// The abort-hook registry (lib/comm/abort_hooks.h): what the watchdog runs before MPI_Abort.
#include <gtest/gtest.h>

#include <vector>

#include "lib/comm/abort_hooks.h"

namespace kilter::comm {
namespace {

TEST(AbortHooks, RunOnceInOrderAndNotAfterUnregistering) {
  std::vector<int> ran;
  const uint64_t a = register_abort_hook([&] { ran.push_back(1); });
  const uint64_t b = register_abort_hook([&] { ran.push_back(2); });
  const uint64_t c = register_abort_hook([&] { ran.push_back(3); });
  unregister_abort_hook(b);
  EXPECT_EQ(run_abort_hooks(), 2);
  EXPECT_EQ(ran, (std::vector<int>{1, 3}));
  EXPECT_EQ(run_abort_hooks(), 0);  // each runs once
  unregister_abort_hook(a);         // a token already run: nothing happens
  unregister_abort_hook(c);
  EXPECT_EQ(ran.size(), 2u);
}

}  // namespace
}  // namespace kilter::comm
