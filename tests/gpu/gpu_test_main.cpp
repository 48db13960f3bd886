// The main of the device test binaries (GoogleTest): runs the tests, and where no CUDA device is
// usable (every device test then skipped itself) prints "SKIPPED: no CUDA device (<reason>)" and
// exits 77, the code ctest's SKIP_RETURN_CODE and tests/gpu/device-check.sh take as skipped; a
// failure still exits 1. Arguments GoogleTest does not take are the tests' own (test_option).
#include <gtest/gtest.h>

#include <cstdio>

#include "tests/gpu/gpu_test_util.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) kilter::gputest::test_arguments().push_back(argv[i]);
  const int rc = RUN_ALL_TESTS();
  const std::string& reason = kilter::gputest::device_absent_reason();
  if (rc == 0 && !reason.empty() && !::testing::GTEST_FLAG(list_tests)) {
    std::printf("SKIPPED: no CUDA device (%s)\n", reason.c_str());
    return kilter::gputest::kSkipCode;
  }
  return rc;
}
