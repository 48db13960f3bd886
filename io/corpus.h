// Input corpora for `kilter prep`: expands the user's paths into input files and streams their
// documents (text: one file = one document; jsonl: the text field of each line, "text" unless
// --text-key names another, dotted paths included; fortune: the texts between lines holding only
// `%`; parquet and arrow: the cells of one column, --text-key, of `.parquet` files or Arrow IPC
// `.arrow` files, io/parquet_input.h).
// Files may be gzip or zstd compressed (io/compressed_input.h). Documents are passed on as raw bytes in pieces, so a
// document is never held whole; empty documents are counted and dropped here.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kilter::io {

enum class InputFormat { text, jsonl, fortune, parquet, arrow };
// "text" | "jsonl" | "fortune" | "parquet" | "arrow"; throws naming the bad value otherwise.
InputFormat parse_input_format(const std::string& name);

struct InputFile {
  std::string path;
  uint64_t size = 0;
};

// Files as given; a directory contributes its regular files (not symlinks, not subdirectories)
// in sorted order, and for the fortune format skips the `*.dat` index files (parquet: only its
// `*.parquet` files, arrow its `*.arrow` files). A path that does not exist but holds * ? or [ is a glob (a quoted
// "data/*.parquet"), its matches sorted. Throws naming a path that does not exist or a directory
// without usable files.
std::vector<InputFile> expand_inputs(const std::vector<std::string>& paths, InputFormat format);

class DocumentSink {
 public:
  virtual ~DocumentSink() = default;
  // More bytes of the current document (never called with size 0).
  virtual void bytes(const unsigned char* data, size_t size) = 0;
  // The current (non-empty) document is complete.
  virtual void end_document() = 0;
  // Input bytes consumed so far over all files, called every few hundred KiB and per file.
  virtual void input_progress(uint64_t /*bytes_consumed*/) {}
};

struct CorpusCounts {
  uint64_t documents = 0;        // non-empty documents passed to the sink
  uint64_t empty_documents = 0;  // dropped
  uint64_t document_bytes = 0;   // bytes in the documents passed on
  uint64_t input_bytes = 0;      // bytes read from the input files (compressed bytes for .gz/.zst)
  uint64_t bad_lines = 0;        // jsonl lines skipped under max_bad_lines
  std::vector<std::string> bad_line_examples;  // "FILE:LINE: what" of the first few
  uint64_t null_cells = 0;        // parquet: null cells skipped (empty strings count as empty documents)
  uint64_t non_string_cells = 0;  // parquet: cells of a column that holds no strings, skipped
};

struct CorpusOptions {
  // jsonl and parquet: the field (column) holding a document's text; "a.b" is field b of object a (a key that itself
  // holds the dot is found first).
  std::string text_key = "text";
  // jsonl lines that are not JSON or lack a string text_key: skipped and counted up to this many;
  // one more is an error naming FILE:LINE. 0: the first is an error.
  uint64_t max_bad_lines = 0;
  // parquet: row groups decoded at once (0: every core); the documents come in file order whatever it is.
  unsigned threads = 0;
};

// Streams every document of `inputs` in order into `sink`. Throws naming the file (and line, for
// jsonl) on unreadable files and malformed lines.
CorpusCounts read_corpus(const std::vector<InputFile>& inputs, InputFormat format,
                         DocumentSink& sink, const CorpusOptions& options = {});

}  // namespace kilter::io
