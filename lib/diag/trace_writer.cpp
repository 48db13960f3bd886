// Chrome trace writer (see trace_writer.h).
#include "lib/diag/trace_writer.h"

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "io/base/error.h"

namespace kilter::diag {

namespace {
constexpr const char* kClosing = "\n]\n";
}

TraceWriter::TraceWriter(const std::string& path, int rank) : path_(path), rank_(rank) {
  file_ = std::fopen(path.c_str(), "w");
  KILTER_CHECK(file_, "cannot create trace file " << path << ": " << std::strerror(errno));
  std::string head = fmt::format(
      "[\n{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{0},\"tid\":0,\"args\":{{\"name\":\"rank {0}\"}}}},\n"
      "{{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":{0},\"tid\":0,\"args\":{{\"sort_index\":{0}}}}},\n"
      "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{0},\"tid\":0,\"args\":{{\"name\":\"host\"}}}}",
      rank);
  std::fputs(head.c_str(), file_);
  body_end_ = std::ftell(file_);
  std::fputs(kClosing, file_);
  std::fflush(file_);
}

TraceWriter::~TraceWriter() {
  if (!file_) return;
  try {
    flush();
  } catch (...) {
    // A destructor must not throw; the file keeps what the last flush wrote.
  }
  std::fclose(file_);
}

void TraceWriter::append_event(const std::string& json) {
  pending_ += ",\n";
  pending_ += json;
}

void TraceWriter::add_complete(const std::string& name, double ts_us, double dur_us, int64_t step,
                               const std::string& args) {
  // args is an object "{...}": its members follow the step's.
  const std::string more = args.size() > 2 ? "," + args.substr(1, args.size() - 2) : std::string();
  append_event(fmt::format(
      "{{\"name\":\"{}\",\"cat\":\"phase\",\"ph\":\"X\",\"pid\":{},\"tid\":0,\"ts\":{:.3f},"
      "\"dur\":{:.3f},\"args\":{{\"step\":{}{}}}}}",
      name, rank_, ts_us, dur_us < 0 ? 0.0 : dur_us, step, more));
}

void TraceWriter::add_instant(const std::string& name, double ts_us, int64_t step) {
  append_event(fmt::format(
      "{{\"name\":\"{}\",\"cat\":\"step\",\"ph\":\"i\",\"s\":\"p\",\"pid\":{},\"tid\":0,"
      "\"ts\":{:.3f},\"args\":{{\"step\":{}}}}}",
      name, rank_, ts_us, step));
}

void TraceWriter::flush() {
  if (pending_.empty()) return;
  bool ok = std::fseek(file_, body_end_, SEEK_SET) == 0 &&
            std::fwrite(pending_.data(), 1, pending_.size(), file_) == pending_.size();
  body_end_ = std::ftell(file_);
  ok = ok && std::fputs(kClosing, file_) >= 0 && std::fflush(file_) == 0;
  pending_.clear();
  KILTER_CHECK(ok, "cannot write trace file " << path_ << ": " << std::strerror(errno));
}

}  // namespace kilter::diag
