// The body of the corpus reader harnesses (fuzz_text, fuzz_jsonl, fuzz_fortune): the fuzz input
// is one input file of `format`; io/corpus.cpp must stream it or refuse it with kilter::Error,
// and what it passes on must add up: documents non-empty and counted, their bytes summed.
#pragma once
#include <vector>

#include "fuzz_common.h"
#include "io/corpus.h"

namespace kilter::fuzz {

class CheckingSink : public io::DocumentSink {
 public:
  void bytes(const unsigned char* data, size_t size) override {
    KILTER_FUZZ_EXPECT(size > 0 && data != nullptr, "DocumentSink::bytes called with no bytes");
    volatile unsigned char touch = data[0] ^ data[size - 1];  // ASan checks the range ends
    (void)touch;
    current += size;
    total += size;
  }
  void end_document() override {
    KILTER_FUZZ_EXPECT(current > 0, "an empty document was passed on");
    current = 0;
    ++documents;
  }
  uint64_t current = 0, total = 0, documents = 0;
};

inline int run_corpus_harness(io::InputFormat format, const char* name, const uint8_t* data,
                              size_t size) {
  const std::string path = scratch_dir() + "/" + name;
  write_file(path, data, size);
  CheckingSink sink;
  // gzip or zstd magic: the file is decompressed as it streams (io/compressed_input.h), so its
  // documents hold the decompressed bytes, and a damaged stream is a refusal in every format.
  const bool compressed = (size >= 2 && data[0] == 0x1f && data[1] == 0x8b) ||
                          (size >= 4 && data[0] == 0x28 && data[1] == 0xb5 && data[2] == 0x2f && data[3] == 0xfd);
  try {
    io::CorpusCounts counts = io::read_corpus({{path, size}}, format, sink);
    KILTER_FUZZ_EXPECT(counts.documents == sink.documents, "document count differs from the sink's");
    KILTER_FUZZ_EXPECT(counts.document_bytes == sink.total, "document bytes differ from the sink's");
    KILTER_FUZZ_EXPECT(sink.current == 0, "the last document was not ended");
    KILTER_FUZZ_EXPECT(counts.input_bytes == size || format == io::InputFormat::jsonl,
                       "input_bytes is not the file size");
    if (format == io::InputFormat::text) {
      KILTER_FUZZ_EXPECT(counts.document_bytes == size || compressed, "a text file is not one whole document");
      KILTER_FUZZ_EXPECT(counts.documents + counts.empty_documents == 1, "a text file is not one document");
    }
    if (format == io::InputFormat::fortune)
      KILTER_FUZZ_EXPECT(counts.document_bytes <= size || compressed, "fortunes hold more bytes than the file");
  } catch (const Error&) {
    KILTER_FUZZ_EXPECT(format == io::InputFormat::jsonl || compressed, "only jsonl refuses content (and damaged streams)");
  }
  return 0;
}

}  // namespace kilter::fuzz
