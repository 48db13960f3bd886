// `kilter prep --format llmc|nanogpt|megatron|npy` (see import.h): open and check every input,
// pass 1 splits the token stream into documents (lengths, largest id, range checks with the byte
// offset of a bad id), pass 2 streams the tokens into shard writers; the directory is built under
// a temporary name and renamed into place when complete.
#include "io/import/import.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <sstream>

#include "io/dataset.h"
#include "io/dataset_output.h"
#include "io/base/error.h"
#include "io/import/import_source.h"
#include "io/prep.h"
#include "io/progress.h"
#include "io/shard_writer.h"
#include "io/tokenizer/tokenizer.h"

namespace kilter::io {

using import_detail::Dtype;
using import_detail::Segment;
using import_detail::TokenSource;

bool is_import_format(const std::string& name) {
  return name == "llmc" || name == "nanogpt" || name == "megatron" || name == "npy";
}

ImportFormat parse_import_format(const std::string& name) {
  if (name == "llmc") return ImportFormat::llmc;
  if (name == "nanogpt") return ImportFormat::nanogpt;
  if (name == "megatron") return ImportFormat::megatron;
  if (name == "npy") return ImportFormat::npy;
  KILTER_USER_FAIL("--format " << name << ": not an import format (llmc | nanogpt | megatron | npy)");
}

const char* import_format_name(ImportFormat format) {
  switch (format) {
    case ImportFormat::llmc: return "llmc";
    case ImportFormat::nanogpt: return "nanogpt";
    case ImportFormat::megatron: return "megatron";
    case ImportFormat::npy: return "npy";
  }
  return "?";
}

namespace {

// Converts elements of one segment to uint32 ids in chunks, checking each against `limit`
// (ids >= limit are refused with their byte offset), and reports runs of ids and the document
// boundaries: every EOT, every segment that ends a document, and the end of the stream.
class Splitter {
 public:
  Splitter(uint32_t eot, uint64_t limit, const char* limit_why) : eot_(eot), limit_(limit), limit_why_(limit_why) {}

  template <typename Sink>
  void run(const std::vector<std::unique_ptr<TokenSource>>& sources, Sink& sink, Progress& progress) {
    for (const auto& source : sources) {
      source->for_each_segment([&](const Segment& segment) {
        run_segment(segment, sink, progress);
        if (segment.ends_document) sink.boundary();
      });
    }
    sink.boundary();
  }

  uint64_t max_id() const { return max_id_; }
  uint64_t eot_count() const { return eot_count_; }

 private:
  static constexpr uint64_t kChunk = uint64_t(1) << 16;
  static constexpr uint64_t kReleaseBytes = uint64_t(64) << 20;

  template <typename Sink>
  void run_segment(const Segment& segment, Sink& sink, Progress& progress) {
    const size_t item = import_detail::dtype_bytes(segment.dtype);
    uint64_t released = segment.offset;
    for (uint64_t first = 0; first < segment.count; first += kChunk) {
      const uint64_t n = std::min(kChunk, segment.count - first);
      const uint64_t offset = segment.offset + first * item;
      convert(segment, offset, n);
      uint64_t run_start = 0;
      for (uint64_t i = 0; i < n; ++i) {
        if (buffer_[i] != eot_) continue;
        if (i > run_start) sink.tokens(buffer_.data() + run_start, i - run_start);
        ++eot_count_;
        sink.boundary();
        run_start = i + 1;
      }
      if (n > run_start) sink.tokens(buffer_.data() + run_start, n - run_start);
      const uint64_t done = offset + n * item;
      consumed_ += n * item;
      progress.update(sink.documents(), consumed_);
      if (done - released >= kReleaseBytes) {
        segment.file->release(released, done - released);
        released = done;
      }
    }
  }

  template <typename T>
  void convert_as(const Segment& segment, uint64_t offset, uint64_t n) {
    const unsigned char* p = segment.file->data() + offset;
    for (uint64_t i = 0; i < n; ++i) {
      T value;
      std::memcpy(&value, p + i * sizeof(T), sizeof(T));
      if (value < T(0) || uint64_t(value) >= limit_) bad_id(segment, offset + i * sizeof(T), int64_t(value), value < T(0));
      buffer_[i] = uint32_t(value);
      if (uint32_t(value) != eot_ && uint64_t(value) > max_id_) max_id_ = uint64_t(value);
    }
  }

  void convert(const Segment& segment, uint64_t offset, uint64_t n) {
    buffer_.resize(kChunk);
    switch (segment.dtype) {
      case Dtype::u8: return convert_as<uint8_t>(segment, offset, n);
      case Dtype::i8: return convert_as<int8_t>(segment, offset, n);
      case Dtype::u16: return convert_as<uint16_t>(segment, offset, n);
      case Dtype::i16: return convert_as<int16_t>(segment, offset, n);
      case Dtype::u32: return convert_as<uint32_t>(segment, offset, n);
      case Dtype::i32: return convert_as<int32_t>(segment, offset, n);
      case Dtype::u64: return convert_as<uint64_t>(segment, offset, n);
      case Dtype::i64: return convert_as<int64_t>(segment, offset, n);
    }
  }

  [[noreturn]] void bad_id(const Segment& segment, uint64_t offset, int64_t value, bool negative) {
    std::ostringstream os;
    os << segment.file->path() << ": byte offset " << offset << ": token id ";
    if (negative) {
      os << value << " is negative";
    } else {
      os << uint64_t(value) << " is out of range: ids must be below " << limit_ << " (" << limit_why_ << ")";
    }
    KILTER_FAIL(os.str());
  }

  uint32_t eot_;
  uint64_t limit_;
  const char* limit_why_;
  std::vector<uint32_t> buffer_;
  uint64_t max_id_ = 0;
  uint64_t eot_count_ = 0;
  uint64_t consumed_ = 0;  // token bytes read so far (progress)
};

// Pass 1: document lengths only.
class LengthSink {
 public:
  void tokens(const uint32_t*, uint64_t n) { current_ += n; }
  void boundary() {
    if (current_ == 0) return;
    KILTER_CHECK(current_ <= UINT32_MAX, "document " << lengths.size() << " has " << current_
                                                     << " tokens; the dataset format stores lengths as uint32");
    lengths.push_back(uint32_t(current_));
    current_ = 0;
  }
  uint64_t documents() const { return lengths.size(); }
  std::vector<uint32_t> lengths;

 private:
  uint64_t current_ = 0;
};

// Pass 2: tokens into the shard writers, a new shard at each shard's first document.
class ShardSink {
 public:
  ShardSink(AtomicDirectory& out, DatasetIndex& index, const std::vector<uint32_t>& lengths, uint32_t num_shards)
      : lengths_(lengths), shards_(out, index, lengths, num_shards) {}
  void tokens(const uint32_t* ids, uint64_t n) {
    KILTER_CHECK(shards_.writing(), "the inputs hold more documents than on the first pass (did they change?)");
    shards_.writer().append(ids, n);
    current_ += n;
  }
  void boundary() {
    if (current_ == 0) return;
    current_ = 0;
    shards_.end_document();
  }
  uint64_t documents() const { return shards_.documents(); }
  void finish() {
    KILTER_CHECK(shards_.documents() == lengths_.size() && !shards_.writing(),
                 "the inputs yielded " << shards_.documents() << " documents on the second pass, " << lengths_.size()
                                       << " on the first (did they change?)");
  }

 private:
  const std::vector<uint32_t>& lengths_;
  ShardBuilder shards_;
  uint64_t current_ = 0;
};

void warn(ImportReport& report, const std::string& text) {
  std::fprintf(stderr, "kilter prep: warning: %s\n", text.c_str());
  report.warnings.push_back(text);
}

}  // namespace

ImportReport import_dataset(const ImportOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  KILTER_USER_CHECK(!options.inputs.empty(), "--input: no input files given");
  KILTER_USER_CHECK(options.shards >= 1, "--shards must be at least 1");
  KILTER_USER_CHECK(options.eot >= -1 && options.eot < int64_t(UINT32_MAX), "--eot " << options.eot << ": not a token id");
  KILTER_USER_CHECK(options.vocab >= 0 && options.vocab <= int64_t(UINT32_MAX), "--vocab " << options.vocab << ": out of range");
  ImportReport report;

  // Every input is opened and its structure checked before anything is written.
  std::vector<std::unique_ptr<TokenSource>> sources;
  for (const std::string& input : options.inputs) {
    sources.push_back(import_detail::open_token_source(options.format, input));
    report.input_bytes += sources.back()->input_bytes();
  }

  DatasetIndex index;
  std::unique_ptr<Tokenizer> tokenizer;
  if (!options.tokenizer.empty()) {
    // The file's content decides its kind (a tokenizer.json or a SentencePiece model), as for prep.
    tokenizer = options.tokenizer == "byte" ? make_byte_tokenizer() : load_tokenizer_file(options.tokenizer);
    index.tokenizer = tokenizer->kind();
    index.tokenizer_data = tokenizer->file_bytes();
  } else {
    index.tokenizer = "imported";  // ids only
  }

  uint32_t eot = sources.front()->conventional_eot();
  if (tokenizer) eot = tokenizer->eos_id();
  if (options.eot >= 0) eot = uint32_t(options.eot);
  uint64_t vocab = uint64_t(options.vocab);
  if (tokenizer) {
    KILTER_CHECK(vocab == 0 || vocab >= tokenizer->vocab_size(),
                 "--vocab " << vocab << " is smaller than the vocabulary of --tokenizer " << options.tokenizer << " ("
                            << tokenizer->vocab_size() << ")");
    if (vocab == 0) vocab = tokenizer->vocab_size();
  }
  if (vocab > 0)
    KILTER_USER_CHECK(eot < vocab, "--eot " << eot << " is not below the vocabulary size " << vocab
                                       << (options.eot >= 0 ? "" : " (the EOT id is the format's convention; pass --eot ID)"));
  const char* limit_why = options.vocab > 0 ? "--vocab" : tokenizer ? "the vocabulary of --tokenizer" : "ids are stored as uint32";

  // Pass 1: document lengths, the largest id, every id checked.
  LengthSink lengths;
  Splitter scan(eot, vocab > 0 ? vocab : uint64_t(UINT32_MAX), limit_why);
  {
    Progress progress("import scan", report.input_bytes, options.progress);
    scan.run(sources, lengths, progress);
    progress.finish();
  }
  KILTER_CHECK(!lengths.lengths.empty(), "the inputs hold no tokens besides EOT ids (" << scan.eot_count() << " EOT "
                                                                                       << eot << "): nothing to import");
  if (scan.eot_count() == 0 && options.format != ImportFormat::megatron)
    warn(report, "no EOT id " + std::to_string(eot) + " in the inputs: the whole stream is one document (pass --eot ID)");
  if (vocab == 0) {
    vocab = std::max<uint64_t>(scan.max_id(), eot) + 1;
    report.vocab_inferred = true;
    warn(report, "vocab_size " + std::to_string(vocab) +
                     " inferred as the largest id + 1; pass --vocab V (or --tokenizer FILE) for the model's real vocabulary");
  }
  index.vocab_size = uint32_t(vocab);
  index.eos_id = eot;
  index.doc_lengths = lengths.lengths;
  // A tokenizer file whose vocabulary or EOS the dataset does not share (a model vocabulary padded
  // beyond it, another EOT) is recorded as "imported" with its bytes: it still decodes, but
  // `prep validate` does not hold the dataset to the tokenizer's vocab_size and eos_id.
  if (tokenizer && !index.tokenizer_data.empty() &&
      (tokenizer->vocab_size() != index.vocab_size || tokenizer->eos_id() != index.eos_id))
    index.tokenizer = "imported";

  // Pass 2: the tokens into the shards.
  AtomicDirectory out(options.out, options.force);
  {
    ShardSink shards(out, index, index.doc_lengths, options.shards);
    Splitter copy(eot, vocab, limit_why);
    Progress progress("import write", report.input_bytes, options.progress);
    copy.run(sources, shards, progress);
    shards.finish();
    progress.finish();
  }
  write_index(out.file(kIndexFileName), index);
  out.commit();

  report.describe(index, options.out);
  report.eot_tokens = scan.eot_count();
  report.max_id = scan.max_id();
  report.seconds = seconds_since(start);
  return report;
}

}  // namespace kilter::io
