// Input corpora for `kilter prep` (see corpus.h).
#include "io/corpus.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <thread>

#include <glob.h>

#include <nlohmann/json.hpp>

#include "io/compressed_input.h"
#include "io/did_you_mean.h"
#include "io/base/error.h"
#include "io/parquet_input.h"

namespace kilter::io {

namespace fs = std::filesystem;

InputFormat parse_input_format(const std::string& name) {
  if (name == "text") return InputFormat::text;
  if (name == "jsonl") return InputFormat::jsonl;
  if (name == "fortune") return InputFormat::fortune;
  if (name == "parquet") return InputFormat::parquet;
  if (name == "arrow") return InputFormat::arrow;
  const std::vector<std::string> formats = {"text", "jsonl", "fortune", "parquet", "arrow", "llmc", "nanogpt", "megatron", "npy"};
  KILTER_USER_FAIL("--format " << name << ": not a format kilter prep reads" << did_you_mean_hint(name, formats)
                   << " (documents: text | jsonl | fortune | parquet | arrow; already tokenized: llmc | nanogpt | megatron | npy)");
}

namespace {
std::vector<std::string> glob_paths(const std::string& pattern) {
  glob_t found{};
  const int rc = glob(pattern.c_str(), 0, nullptr, &found);
  std::vector<std::string> matches;
  if (rc == 0)
    for (size_t i = 0; i < found.gl_pathc; ++i) matches.emplace_back(found.gl_pathv[i]);
  globfree(&found);
  std::sort(matches.begin(), matches.end());
  return matches;
}
}  // namespace

std::vector<InputFile> expand_inputs(const std::vector<std::string>& paths, InputFormat format) {
  KILTER_USER_CHECK(!paths.empty(), "--input: no input paths given");
  std::vector<InputFile> files;
  for (const std::string& path : paths) {
    std::error_code ec;
    fs::file_status status = fs::status(path, ec);
    if ((ec || !fs::exists(status)) && path.find_first_of("*?[") != std::string::npos) {
      const std::vector<std::string> matches = glob_paths(path);
      KILTER_USER_CHECK(!matches.empty(), "input " << path << ": no file matches the pattern; check the folder and the pattern");
      for (const std::string& match : matches) {
        KILTER_USER_CHECK(fs::is_regular_file(match), "input " << match << " (from " << path << ") is not a regular file");
        files.push_back({match, fs::file_size(match)});
      }
      continue;
    }
    KILTER_USER_CHECK(!ec && fs::exists(status), "input " << path << " does not exist");
    if (fs::is_directory(status)) {
      std::vector<std::string> entries;
      for (const fs::directory_entry& entry : fs::directory_iterator(path)) {
        // symlink_status: links are skipped, so `foo.u8 -> foo` style aliases are read once.
        if (!fs::is_regular_file(entry.symlink_status())) continue;
        if (format == InputFormat::fortune && entry.path().extension() == ".dat") continue;
        if (format == InputFormat::parquet && entry.path().extension() != ".parquet") continue;
        if (format == InputFormat::arrow && entry.path().extension() != ".arrow") continue;
        entries.push_back(entry.path().string());
      }
      KILTER_USER_CHECK(!entries.empty(), "input directory " << path << " holds no "
                                                             << (format == InputFormat::parquet ? "*.parquet files"
                                                                 : format == InputFormat::arrow ? "*.arrow files" : "regular files"));
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

void read_text_file(const InputFile& input, DocumentTracker& doc) {
  InputStream stream(input.path);
  std::vector<unsigned char> block(size_t(64) << 10);  // corpora are often many small files
  uint64_t reported = 0;
  while (size_t n = stream.read(block.data(), block.size())) {
    doc.add(block.data(), n);
    doc.consumed(stream.file_bytes() - reported);
    reported = stream.file_bytes();
  }
  doc.consumed(stream.file_bytes() - reported);
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
  StreamLineReader lines(input.path);
  const unsigned char* data = nullptr;
  size_t size = 0;
  bool any_line = false;
  while (lines.next(data, size)) {
    any_line = true;
    doc.consumed(lines.take_file_bytes());
    if (is_separator_line(data, size)) {
      doc.end();
    } else {
      doc.add(data, size);
    }
  }
  doc.consumed(lines.take_file_bytes());
  // The text after the last separator is a document too (files need not end with `%`); a file
  // that ends with its separator has nothing pending and adds no empty document.
  if (doc.open_document() || !any_line) doc.end();
}

// The string at `key` in `record`: the key itself, else the dotted path; null when absent or not
// a string.
const std::string* text_at(const nlohmann::json& record, const std::string& key) {
  if (!record.is_object()) return nullptr;
  auto direct = record.find(key);
  if (direct != record.end()) return direct->is_string() ? &direct->get_ref<const std::string&>() : nullptr;
  const nlohmann::json* node = &record;
  size_t start = 0;
  while (true) {
    const size_t dot = key.find('.', start);
    const std::string part = key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!node->is_object()) return nullptr;
    auto it = node->find(part);
    if (it == node->end()) return nullptr;
    node = &*it;
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return node->is_string() ? &node->get_ref<const std::string&>() : nullptr;
}

void read_jsonl_file(const InputFile& input, DocumentTracker& doc, const CorpusOptions& options,
                     CorpusCounts& counts) {
  StreamLineReader lines(input.path);
  const unsigned char* data = nullptr;
  size_t size = 0;
  // A bad line: skipped and counted while the budget lasts, else the error that names it.
  const auto bad_line = [&](const std::string& what) {
    const std::string place = input.path + ":" + std::to_string(lines.line_number()) + ": " + what;
    KILTER_USER_CHECK(counts.bad_lines < options.max_bad_lines,
                 "input " << place << (options.max_bad_lines == 0 ? std::string()
                                                                  : "; that is more than --max-bad-lines " +
                                                                        std::to_string(options.max_bad_lines) + " bad lines")
                          << ". Fix the line, or pass --max-bad-lines N to skip and count up to N such lines");
    ++counts.bad_lines;
    if (counts.bad_line_examples.size() < 5) counts.bad_line_examples.push_back(place);
  };
  while (lines.next(data, size)) {
    doc.consumed(lines.take_file_bytes());
    const char* text = reinterpret_cast<const char*>(data);
    bool blank = std::all_of(text, text + size, [](char c) { return std::isspace((unsigned char)c); });
    if (blank) continue;  // blank lines (e.g. a trailing empty line) are not records
    nlohmann::json record;
    try {
      record = nlohmann::json::parse(text, text + size);
    } catch (const nlohmann::json::exception& e) {
      bad_line(std::string("not valid JSON (") + e.what() + ")");
      continue;
    }
    const std::string* value = text_at(record, options.text_key);
    if (!value) {
      bad_line("expected an object with a string field \"" + options.text_key + "\"" +
               (options.text_key == "text" ? " (name another with --text-key KEY, dotted paths allowed)" : ""));
      continue;
    }
    doc.add(reinterpret_cast<const unsigned char*>(value->data()), value->size());
    doc.end();
  }
  doc.consumed(lines.take_file_bytes());
}

// The cells of the text column, row group by row group, or record batch by record batch for
// Arrow IPC (io/parquet_input.h).
void read_columnar_file(const InputFile& input, InputFormat format, DocumentTracker& doc, const CorpusOptions& options,
                        CorpusCounts& counts) {
  ParquetReadOptions parquet;
  parquet.column = options.text_key;
  parquet.threads = options.threads ? options.threads : std::max(1u, std::thread::hardware_concurrency());
  ParquetCounts cells;
  (format == InputFormat::arrow ? read_arrow_ipc_documents : read_parquet_documents)(
      input.path, parquet,
      [&doc](const char* data, size_t size) {
        doc.add(reinterpret_cast<const unsigned char*>(data), size);
        doc.end();
      },
      [&doc](uint64_t bytes) { doc.consumed(bytes); }, cells);
  counts.empty_documents += cells.empty;
  counts.null_cells += cells.nulls;
  counts.non_string_cells += cells.non_string;
}

}  // namespace

CorpusCounts read_corpus(const std::vector<InputFile>& inputs, InputFormat format,
                         DocumentSink& sink, const CorpusOptions& options) {
  CorpusCounts counts;
  DocumentTracker doc(sink, counts);
  for (const InputFile& input : inputs) {
    switch (format) {
      case InputFormat::text: read_text_file(input, doc); break;
      case InputFormat::jsonl: read_jsonl_file(input, doc, options, counts); break;
      case InputFormat::fortune: read_fortune_file(input, doc); break;
      case InputFormat::parquet:
      case InputFormat::arrow: read_columnar_file(input, format, doc, options, counts); break;
    }
    doc.report();
  }
  return counts;
}

}  // namespace kilter::io
