// Progress reporting for long dataset jobs (prep, synth, validate, staging) on stderr: a
// redrawn bar with documents/s and MB/s on a terminal, plain periodic lines otherwise (logs).
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace kilter::io {

// Seconds from `start` until now: a job's wall time, for its report.
inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

class Progress {
 public:
  // `total_bytes` (0: unknown) scales the bar; `enabled` false makes every call a no-op.
  Progress(std::string label, uint64_t total_bytes, bool enabled = true);
  ~Progress();
  // Cumulative figures; cheap to call often (redraws at most 10 times a second).
  void update(uint64_t documents, uint64_t bytes);
  // Final line with the totals and average rates.
  void finish();

 private:
  void draw(bool final_line);

  std::string label_;
  uint64_t total_bytes_;
  bool enabled_;
  bool tty_;
  bool finished_ = false;
  uint64_t documents_ = 0;
  uint64_t bytes_ = 0;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
};

}  // namespace kilter::io
