// Input corpora for `kilter prep` (see corpus.h).
#include "io/corpus.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>

#include <nlohmann/json.hpp>

#include "io/did_you_mean.h"
#include "io/error.h"

namespace kilter::io {

namespace fs = std::filesystem;

InputFormat parse_input_format(const std::string& name) {
  if (name == "text") return InputFormat::text;
  if (name == "jsonl") return InputFormat::jsonl;
  if (name == "fortune") return InputFormat::fortune;
  const std::vector<std::string> formats = {"text", "jsonl", "fortune", "llmc", "nanogpt", "megatron", "npy"};
  KILTER_USER_FAIL("--format " << name << ": not a format kilter prep reads" << did_you_mean_hint(name, formats)
                   << " (documents: text | jsonl | fortune; already tokenized: llmc | nanogpt | megatron | npy)");
}

std::vector<InputFile> expand_inputs(const std::vector<std::string>& paths, InputFormat format) {
  KILTER_USER_CHECK(!paths.empty(), "--input: no input paths given");
  std::vector<InputFile> files;
  for (const std::string& path : paths) {
    std::error_code ec;
    fs::file_status status = fs::status(path, ec);
    KILTER_USER_CHECK(!ec && fs::exists(status), "input " << path << " does not exist");
    if (fs::is_directory(status)) {
      std::vector<std::string> entries;
      for (const fs::directory_entry& entry : fs::directory_iterator(path)) {
        // symlink_status: links are skipped, so `foo.u8 -> foo` style aliases are read once.
        if (!fs::is_regular_file(entry.symlink_status())) continue;
        if (format == InputFormat::fortune && entry.path().extension() == ".dat") continue;
        entries.push_back(entry.path().string());
      }
      KILTER_USER_CHECK(!entries.empty(), "input directory " << path << " holds no regular files");
      std::sort(entries.begin(), entries.end());
      for (const std::string& entry : entries) files.push_back({entry, fs::file_size(entry)});
    } else {
      KILTER_USER_CHECK(fs::is_regular_file(status), "input " << path << " is not a regular file");
      files.push_back({path, fs::file_size(path)});
    }
  }
  return files;
}

namespace {

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<FILE, FileCloser>;

File open_input(const std::string& path) {
  File file(std::fopen(path.c_str(), "rb"));
  KILTER_USER_CHECK(file, "input " << path << ": cannot open (" << std::strerror(errno) << ")");
  return file;
}

// Tracks the current document so that empty ones are counted instead of passed on.
class DocumentTracker {
 public:
  DocumentTracker(DocumentSink& sink, CorpusCounts& counts) : sink_(sink), counts_(counts) {}
  void add(const unsigned char* data, size_t size) {
    if (size == 0) return;
    sink_.bytes(data, size);
    current_ += size;
  }
  void end() {
    if (current_ == 0) {
      ++counts_.empty_documents;
    } else {
      sink_.end_document();
      ++counts_.documents;
      counts_.document_bytes += current_;
    }
    current_ = 0;
  }
  bool open_document() const { return current_ > 0; }
  void consumed(uint64_t size) {
    counts_.input_bytes += size;
    since_report_ += size;
    if (since_report_ >= (uint64_t(256) << 10)) report();
  }
  void report() {
    sink_.input_progress(counts_.input_bytes);
    since_report_ = 0;
  }

 private:
  DocumentSink& sink_;
  CorpusCounts& counts_;
  uint64_t current_ = 0;
  uint64_t since_report_ = 0;
};

// POSIX getline: one line at a time (bytes, NULs included), the buffer reused.
class LineReader {
 public:
  explicit LineReader(const std::string& path) : path_(path), file_(open_input(path)) {}
  ~LineReader() { std::free(line_); }
  // The next line including its '\n' (if any); false at the end of the file.
  bool next(const unsigned char*& data, size_t& size) {
    errno = 0;
    ssize_t n = ::getline(&line_, &capacity_, file_.get());
    if (n < 0) {
      KILTER_CHECK(!std::ferror(file_.get()), "input " << path_ << ": read error ("
                                                         << std::strerror(errno) << ")");
      return false;
    }
    ++line_number_;
    data = reinterpret_cast<const unsigned char*>(line_);
    size = size_t(n);
    return true;
  }
  uint64_t line_number() const { return line_number_; }

 private:
  std::string path_;
  File file_;
  char* line_ = nullptr;
  size_t capacity_ = 0;
  uint64_t line_number_ = 0;
};

void read_text_file(const InputFile& input, DocumentTracker& doc) {
  File file = open_input(input.path);
  std::vector<unsigned char> block(size_t(64) << 10);  // corpora are often many small files
  while (true) {
    size_t n = std::fread(block.data(), 1, block.size(), file.get());
    doc.add(block.data(), n);
    doc.consumed(n);
    if (n < block.size()) {
      KILTER_CHECK(!std::ferror(file.get()), "input " << input.path << ": read error");
      break;
    }
  }
  doc.end();
}

bool is_separator_line(const unsigned char* data, size_t size) {
  // "%\n", "%\r\n" or a final "%" without newline.
  if (size == 0 || data[0] != '%') return false;
  if (size == 1) return true;
  if (size == 2) return data[1] == '\n' || data[1] == '\r';
  return size == 3 && data[1] == '\r' && data[2] == '\n';
}

void read_fortune_file(const InputFile& input, DocumentTracker& doc) {
  LineReader lines(input.path);
  const unsigned char* data = nullptr;
  size_t size = 0;
  bool any_line = false;
  while (lines.next(data, size)) {
    any_line = true;
    doc.consumed(size);
    if (is_separator_line(data, size)) {
      doc.end();
    } else {
      doc.add(data, size);
    }
  }
  // The text after the last separator is a document too (files need not end with `%`); a file
  // that ends with its separator has nothing pending and adds no empty document.
  if (doc.open_document() || !any_line) doc.end();
}

void read_jsonl_file(const InputFile& input, DocumentTracker& doc) {
  LineReader lines(input.path);
  const unsigned char* data = nullptr;
  size_t size = 0;
  while (lines.next(data, size)) {
    doc.consumed(size);
    const char* text = reinterpret_cast<const char*>(data);
    bool blank = std::all_of(text, text + size, [](char c) { return std::isspace((unsigned char)c); });
    if (blank) continue;  // blank lines (e.g. a trailing empty line) are not records
    nlohmann::json record;
    try {
      record = nlohmann::json::parse(text, text + size);
    } catch (const nlohmann::json::exception& e) {
      KILTER_USER_FAIL("input " << input.path << ":" << lines.line_number() << ": not valid JSON ("
                           << e.what() << ")");
    }
    KILTER_USER_CHECK(record.is_object() && record.contains("text") && record["text"].is_string(),
                 "input " << input.path << ":" << lines.line_number()
                          << ": expected an object with a string field \"text\"");
    const std::string& value = record["text"].get_ref<const std::string&>();
    doc.add(reinterpret_cast<const unsigned char*>(value.data()), value.size());
    doc.end();
  }
}

}  // namespace

CorpusCounts read_corpus(const std::vector<InputFile>& inputs, InputFormat format,
                         DocumentSink& sink) {
  CorpusCounts counts;
  DocumentTracker doc(sink, counts);
  for (const InputFile& input : inputs) {
    switch (format) {
      case InputFormat::text: read_text_file(input, doc); break;
      case InputFormat::jsonl: read_jsonl_file(input, doc); break;
      case InputFormat::fortune: read_fortune_file(input, doc); break;
    }
    doc.report();
  }
  return counts;
}

}  // namespace kilter::io
