// Shared by the fuzz harnesses (tests/fuzz/fuzz_*.cpp): a scratch directory in memory
// (/dev/shm) for the parsers that take a path, a reader that turns the fuzz input into typed
// choices (running out of input yields zeros, so short inputs pick the first, "valid" choice),
// and the rule every harness follows: kilter::Error is the expected, clean refusal; anything else
// (another exception, a crash, a sanitizer report, a broken invariant) is a finding and aborts.
#pragma once
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "io/base/error.h"

namespace kilter::fuzz {

// A broken invariant: print it and abort (libFuzzer saves the input as a crash).
[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "FUZZ FINDING: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

#define KILTER_FUZZ_EXPECT(cond, what) \
  do {                                 \
    if (!(cond)) ::kilter::fuzz::finding(std::string(what) + " [" #cond "]"); \
  } while (0)

// This process's scratch directory, created on first use and removed at exit.
inline const std::string& scratch_dir() {
  // Never destroyed: the exit handler that removes the directory runs after static destructors.
  static const std::string& dir = *[] {
    const char* base = std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : "/tmp";
    auto* d = new std::string(std::string(base) + "/kilter-fuzz-" + std::to_string(::getpid()));
    std::filesystem::remove_all(*d);
    std::filesystem::create_directories(*d);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch_dir(), ec);
    });
    return d;
  }();
  return dir;
}

// Writes `size` bytes to `path` (truncating); a failure of the harness itself aborts.
inline void write_file(const std::string& path, const void* data, size_t size) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) finding("harness: cannot create " + path + ": " + std::strerror(errno));
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n <= 0) finding("harness: cannot write " + path + ": " + std::strerror(errno));
    p += n;
    size -= size_t(n);
  }
  ::close(fd);
}

// Typed choices drawn from the fuzz input, front to back.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  size_t left() const { return size_ - pos_; }
  uint8_t u8() { return pos_ < size_ ? data_[pos_++] : 0; }
  uint16_t u16() { return uint16_t(u8() | (u8() << 8)); }
  uint32_t u32() { return uint32_t(u16()) | (uint32_t(u16()) << 16); }
  uint64_t u64() { return uint64_t(u32()) | (uint64_t(u32()) << 32); }
  // A value in [0, n) (n > 0) from one byte (n <= 256) or two.
  uint32_t below(uint32_t n) { return n <= 256 ? u8() % n : u16() % n; }
  bool flag() { return u8() & 1; }
  // Up to `max` bytes.
  std::string bytes(size_t max) {
    size_t n = std::min<size_t>(below(uint32_t(std::min<size_t>(max, 65535)) + 1), left());
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }
  // An integer that is usually `good` and otherwise an edge: 0, good±1, 2^k±1, huge, negative.
  int64_t around(int64_t good) {
    switch (u8() % 16) {
      case 1: return int64_t(uint64_t(good) + 1);  // wraps at the edges, as intended
      case 2: return int64_t(uint64_t(good) - 1);
      case 3: return 0;
      case 4: return -1;
      case 5: return int64_t(u8());
      case 6: return int64_t(u16());
      case 7: return int64_t(u32());
      case 8: return int64_t(u64());
      case 9: return INT64_MAX;
      case 10: return INT64_MIN;
      case 11: return int64_t(1) << (u8() % 63);
      case 12: return int64_t(uint64_t(good) * 2);
      case 13: return int64_t(uint64_t(1) << 32);
      case 14: return -int64_t(u8()) - 1;
      default: return good;
    }
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace kilter::fuzz
