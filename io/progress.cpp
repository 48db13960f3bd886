// Progress reporting on stderr (see progress.h).
#include "io/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace kilter::io {

using Clock = std::chrono::steady_clock;

Progress::Progress(std::string label, uint64_t total_bytes, bool enabled)
    : label_(std::move(label)),
      total_bytes_(total_bytes),
      enabled_(enabled),
      tty_(::isatty(STDERR_FILENO) == 1),
      start_(Clock::now()),
      last_draw_(start_) {}

Progress::~Progress() {
  if (tty_ && enabled_ && !finished_) std::fputc('\n', stderr);  // leave the bar's line intact
}

void Progress::update(uint64_t documents, uint64_t bytes) {
  documents_ = documents;
  bytes_ = bytes;
  if (!enabled_) return;
  Clock::time_point now = Clock::now();
  // A terminal is redrawn in place 10 times a second; a log gets one line every 5 seconds.
  auto interval = tty_ ? std::chrono::milliseconds(100) : std::chrono::milliseconds(5000);
  if (now - last_draw_ < interval) return;
  last_draw_ = now;
  draw(false);
}

void Progress::finish() {
  if (!enabled_ || finished_) return;
  draw(true);
  finished_ = true;
}

void Progress::draw(bool final_line) {
  double seconds = std::chrono::duration<double>(Clock::now() - start_).count();
  double docs_per_s = seconds > 0 ? documents_ / seconds : 0;
  double mb_per_s = seconds > 0 ? bytes_ / seconds / 1e6 : 0;
  double fraction = total_bytes_ > 0 ? std::min(1.0, double(bytes_) / double(total_bytes_)) : 0;
  char rates[160];
  std::snprintf(rates, sizeof rates, "%llu docs, %.1f MB, %.0f docs/s, %.1f MB/s, %.1f s",
                (unsigned long long)documents_, bytes_ / 1e6, docs_per_s, mb_per_s, seconds);
  if (tty_) {
    constexpr int kWidth = 30;
    std::string bar;
    if (total_bytes_ > 0) {
      int filled = int(fraction * kWidth + 0.5);
      bar = "[" + std::string(filled, '#') + std::string(kWidth - filled, '.') + "] ";
      char percent[16];
      std::snprintf(percent, sizeof percent, "%3.0f%% ", 100 * fraction);
      bar += percent;
    }
    std::fprintf(stderr, "\r\033[K%s %s%s%s", label_.c_str(), bar.c_str(), rates,
                 final_line ? "\n" : "");
  } else {
    if (total_bytes_ > 0)
      std::fprintf(stderr, "%s: %.1f%% %s%s\n", label_.c_str(), 100 * fraction, rates,
                   final_line ? " (done)" : "");
    else
      std::fprintf(stderr, "%s: %s%s\n", label_.c_str(), rates, final_line ? " (done)" : "");
  }
  std::fflush(stderr);
}

}  // namespace kilter::io
