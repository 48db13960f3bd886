// Error type shared by io/ and lib/ (see error.h).
#include "io/base/error.h"

#include <atomic>

namespace kilter {

static std::atomic<int> g_error_rank{-1};

void set_error_rank(int rank) { g_error_rank.store(rank); }
int error_rank() { return g_error_rank.load(); }

// "rank R: message" for a user error, "rank R: message [file:line]" for an internal one.
static std::string format_error(const std::string& message, const char* file, int line, ErrorKind kind) {
  std::ostringstream os;
  int rank = error_rank();
  if (rank >= 0) os << "rank " << rank << ": ";
  os << message;
  if (kind == ErrorKind::internal) os << " [" << file << ":" << line << "]";
  return os.str();
}

Error::Error(const std::string& message, const char* file, int line, ErrorKind kind)
    : std::runtime_error(format_error(message, file, line, kind)),
      message_(message),
      file_(file),
      line_(line),
      kind_(kind) {}

namespace detail {
void throw_error(const std::string& message, const char* file, int line, ErrorKind kind) {
  throw Error(message, file, line, kind);
}
}  // namespace detail

}  // namespace kilter
