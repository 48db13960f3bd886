// trace/rank-NNNNN.json: Chrome trace events (the JSON array form Perfetto and chrome://tracing
// open). The file is valid JSON after every flush: events are written before a closing "]" that
// the next flush overwrites, so a run that dies mid-way still leaves a loadable trace.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>

namespace kilter::diag {

class TraceWriter {
 public:
  // Creates `path` holding the process and thread names of `rank` (pid = rank, tid = 0).
  TraceWriter(const std::string& path, int rank);
  ~TraceWriter();
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  // Buffers a complete ("X") event; ts and dur in microseconds on the aligned clock. `args`: a
  // JSON object whose members join the event's args after the step ("" for none).
  void add_complete(const std::string& name, double ts_us, double dur_us, int64_t step,
                    const std::string& args = "");
  // Buffers an instant ("i") event.
  void add_instant(const std::string& name, double ts_us, int64_t step);
  // Writes the buffered events and the closing bracket.
  void flush();

 private:
  void append_event(const std::string& json);
  std::string path_;
  int rank_;
  std::FILE* file_ = nullptr;
  long body_end_ = 0;        // file offset where the closing bracket starts
  std::string pending_;      // events not yet written, each preceded by ",\n"
};

}  // namespace kilter::diag
