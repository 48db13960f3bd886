// Error type shared by io/ and lib/ (see error.h).
#include "io/error.h"

#include <atomic>

namespace kilter {

static std::atomic<int> g_error_rank{-1};

void set_error_rank(int rank) { g_error_rank.store(rank); }
int error_rank() { return g_error_rank.load(); }

static std::string format_error(const std::string& message, const char* file, int line) {
  std::ostringstream os;
  int rank = error_rank();
  if (rank >= 0) os << "rank " << rank << ": ";
  os << message << " [" << file << ":" << line << "]";
  return os.str();
}

Error::Error(const std::string& message, const char* file, int line)
    : std::runtime_error(format_error(message, file, line)), message_(message) {}

namespace detail {
void throw_error(const std::string& message, const char* file, int line) {
  throw Error(message, file, line);
}
}  // namespace detail

}  // namespace kilter
