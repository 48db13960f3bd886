// Test helper (issue 17): a storage fault on demand, without root or a small file system. While a
// FileSizeLimit lives, this process may not write a file past `bytes` (RLIMIT_FSIZE, what
// `ulimit -f` sets), and SIGXFSZ is ignored so such a write fails with EFBIG, as a write to a full
// disk fails with ENOSPC, instead of killing the test.
#pragma once
#include <sys/resource.h>

#include <csignal>

namespace kilter::testing {

class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &saved_);
    old_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    rlimit limit = saved_;
    limit.rlim_cur = bytes;
    ::setrlimit(RLIMIT_FSIZE, &limit);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &saved_);
    std::signal(SIGXFSZ, old_handler_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

 private:
  rlimit saved_{};
  void (*old_handler_)(int) = SIG_DFL;
};

}  // namespace kilter::testing
