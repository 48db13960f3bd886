// kilter's one error type and the KILTER_CHECK macros. Every error carries the file and line where
// it was raised, the MPI rank that raised it (when known) and the failing call's message, and a
// kind: a user error (a key, a file, a dataset of the user's: KILTER_USER_CHECK) prints without
// the source place, since the reader did nothing wrong in our code; an internal error (a bug, or
// a CUDA/NCCL/MPI/HDF5 call that failed: KILTER_CHECK) keeps it, since that is where a developer
// looks. what() is the printed form, so every handler prints the right one.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace kilter {

// The world rank of this process, set once MPI is up (-1 before, or in tools without MPI).
void set_error_rank(int rank);
int error_rank();

enum class ErrorKind { internal, user };

class Error : public std::runtime_error {
 public:
  Error(const std::string& message, const char* file, int line, ErrorKind kind = ErrorKind::internal);
  const std::string& message() const { return message_; }  // without the place
  ErrorKind kind() const { return kind_; }
  bool is_user_error() const { return kind_ == ErrorKind::user; }
  const std::string& file() const { return file_; }
  int line() const { return line_; }

 private:
  std::string message_;
  std::string file_;
  int line_ = 0;
  ErrorKind kind_;
};

namespace detail {
[[noreturn]] void throw_error(const std::string& message, const char* file, int line,
                              ErrorKind kind = ErrorKind::internal);
}  // namespace detail

}  // namespace kilter

// KILTER_FAIL(stream-expression): raise an internal Error with the message built by <<.
#define KILTER_FAIL(msg_expr) KILTER_FAIL_KIND(::kilter::ErrorKind::internal, msg_expr)

// KILTER_CHECK(cond, stream-expression): raise an internal Error unless cond holds.
#define KILTER_CHECK(cond, msg_expr)                                      \
  do {                                                                    \
    if (!(cond)) KILTER_FAIL(msg_expr);                                   \
  } while (0)

// KILTER_USER_FAIL / KILTER_USER_CHECK: the same for a mistake of the user's (a config key, an
// option, a file or dataset the user named); printed without the source place.
#define KILTER_USER_FAIL(msg_expr) KILTER_FAIL_KIND(::kilter::ErrorKind::user, msg_expr)
#define KILTER_USER_CHECK(cond, msg_expr)                                 \
  do {                                                                    \
    if (!(cond)) KILTER_USER_FAIL(msg_expr);                              \
  } while (0)

#define KILTER_FAIL_KIND(kind, msg_expr)                                  \
  do {                                                                    \
    std::ostringstream kilter_fail_os_;                                   \
    kilter_fail_os_ << msg_expr;                                          \
    ::kilter::detail::throw_error(kilter_fail_os_.str(), __FILE__, __LINE__, kind); \
  } while (0)
