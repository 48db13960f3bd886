// kilter's one error type and the KILTER_CHECK macros: every error carries the file and line
// where it was raised, the MPI rank that raised it (when known) and the failing call's message.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace kilter {

// The world rank of this process, set once MPI is up (-1 before, or in tools without MPI).
void set_error_rank(int rank);
int error_rank();

class Error : public std::runtime_error {
 public:
  Error(const std::string& message, const char* file, int line);
  const std::string& message() const { return message_; }  // without the place
 private:
  std::string message_;
};

namespace detail {
[[noreturn]] void throw_error(const std::string& message, const char* file, int line);
}  // namespace detail

}  // namespace kilter

// KILTER_FAIL(stream-expression): raise an Error with the message built by <<.
#define KILTER_FAIL(msg_expr)                                             \
  do {                                                                    \
    std::ostringstream kilter_fail_os_;                                   \
    kilter_fail_os_ << msg_expr;                                          \
    ::kilter::detail::throw_error(kilter_fail_os_.str(), __FILE__, __LINE__); \
  } while (0)

// KILTER_CHECK(cond, stream-expression): raise unless cond holds.
#define KILTER_CHECK(cond, msg_expr)                                      \
  do {                                                                    \
    if (!(cond)) KILTER_FAIL(msg_expr);                                   \
  } while (0)
