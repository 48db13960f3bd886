// The body of the importer harnesses (fuzz_import_*): fuzz bytes become the input file(s) of one
// import format; io/import_formats.cpp must refuse them with kilter::Error or hand out segments
// that lie inside the mapped file, and every element of every segment is then read (what the
// importer's splitter does), so a segment that reaches past the mapping crashes here.
#pragma once
#include <vector>

#include "fuzz_common.h"
#include "io/import/import_source.h"

namespace kilter::fuzz {

inline void drain_token_source(const io::import_detail::TokenSource& source) {
  using namespace io::import_detail;
  uint64_t checksum = 0;
  source.for_each_segment([&](const Segment& segment) {
    KILTER_FUZZ_EXPECT(segment.file != nullptr, "a segment without a file");
    const uint64_t item = dtype_bytes(segment.dtype);
    const uint64_t size = segment.file->size();
    KILTER_FUZZ_EXPECT(segment.offset <= size && segment.count <= (size - segment.offset) / item,
                       "a segment reaches past the end of " + segment.file->path());
    const unsigned char* p = segment.file->data() + segment.offset;
    for (uint64_t i = 0; i < segment.count * item; ++i) checksum += p[i];
  });
  volatile uint64_t sink = checksum + source.input_bytes() + source.conventional_eot();
  (void)sink;
}

inline int run_import_harness(io::ImportFormat format, const std::string& path) {
  try {
    auto source = io::import_detail::open_token_source(format, path);
    drain_token_source(*source);
  } catch (const Error&) {
  }
  return 0;
}

}  // namespace kilter::fuzz
