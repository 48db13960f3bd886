// `kilter prep` and `kilter prep synth` (see prep.h): first pass collects document lengths,
// shards are cut by token count, second pass streams the tokens into the shard writers.
#include "io/prep.h"

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "io/dataset.h"
#include "io/dataset_output.h"
#include "io/base/error.h"
#include "io/progress.h"
#include "io/shard_writer.h"
#include "io/tokenizer/tokenizer.h"

namespace kilter::io {


std::vector<uint64_t> assign_shards(const std::vector<uint32_t>& lengths, uint32_t num_shards) {
  const uint64_t num_docs = lengths.size();
  KILTER_USER_CHECK(num_shards >= 1, "--shards must be at least 1");
  KILTER_USER_CHECK(num_shards <= num_docs, "--shards " << num_shards << " exceeds the number of "
                                                   << "non-empty documents (" << num_docs << ")");
  uint64_t total = 0;
  for (uint32_t length : lengths) total += length;
  std::vector<uint64_t> first(num_shards + 1, 0);
  first[num_shards] = num_docs;
  uint64_t doc = 0, prefix = 0;  // prefix = tokens of documents [0, doc)
  for (uint32_t s = 1; s < num_shards; ++s) {
    // Shard s starts at the first document whose start reaches s/N of the tokens, keeping at
    // least one document in every shard on both sides.
    const long double target = (long double)total * s / num_shards;
    while (doc < num_docs && (long double)prefix < target) prefix += lengths[doc++];
    uint64_t start = std::max<uint64_t>(doc, first[s - 1] + 1);
    start = std::min<uint64_t>(start, num_docs - (num_shards - s));
    while (doc < start) prefix += lengths[doc++];
    while (doc > start) prefix -= lengths[--doc];
    first[s] = start;
  }
  return first;
}

namespace {

// Writes the shards of a dataset in document order and finally its index.
class DatasetBuilder {
 public:
  DatasetBuilder(AtomicDirectory& out, const std::vector<uint32_t>& lengths, uint32_t num_shards,
                 uint32_t vocab, uint32_t eos, const std::string& tokenizer,
                 const std::string& tokenizer_data = std::string())
      : out_(out), lengths_(lengths),
        // dir, vocab_size, eos_id, tokenizer, tokenizer_data, shards, doc_lengths
        index_{std::string(), vocab, eos, tokenizer, tokenizer_data, {}, lengths},
        shards_(out, index_, lengths, num_shards) {}

  ShardWriter& writer() { return shards_.writer(); }
  uint64_t shard_first_doc(uint32_t s) const { return shards_.shard_first_doc(s); }
  uint64_t shard_end_doc(uint32_t s) const { return shards_.shard_end_doc(s); }
  void end_document() { shards_.end_document(); }

  // Writes index.h5 once every shard is complete; returns the index.
  const DatasetIndex& finish() {
    KILTER_CHECK(shards_.documents() == lengths_.size(),
                 "the input yielded " << shards_.documents() << " documents on the second pass, " << lengths_.size()
                                      << " on the first (did the input change?)");
    write_index(out_.file(kIndexFileName), index_);
    return index_;
  }

 private:
  AtomicDirectory& out_;
  const std::vector<uint32_t>& lengths_;
  DatasetIndex index_;
  ShardBuilder shards_;
};

void fill_report(PrepReport& report, const DatasetIndex& index, const std::string& out) {
  report.describe(index, out);
  report.min_shard_tokens = UINT64_MAX;
  for (const ShardInfo& shard : index.shards) {
    report.min_shard_tokens = std::min(report.min_shard_tokens, shard.num_tokens);
    report.max_shard_tokens = std::max(report.max_shard_tokens, shard.num_tokens);
  }
}

uint64_t total_size(const std::vector<InputFile>& inputs) {
  uint64_t total = 0;
  for (const InputFile& input : inputs) total += input.size;
  return total;
}

// Pass 1: only the lengths of the documents are kept.
class LengthCollector : public DocumentSink {
 public:
  explicit LengthCollector(Progress& progress) : progress_(progress) {}
  void bytes(const unsigned char*, size_t size) override { current_ += size; }
  void end_document() override {
    KILTER_CHECK(current_ <= UINT32_MAX, "document " << lengths.size() << " has " << current_
                                                     << " bytes; the format stores lengths as uint32");
    lengths.push_back(uint32_t(current_));
    current_ = 0;
  }
  void input_progress(uint64_t consumed) override { progress_.update(lengths.size(), consumed); }
  std::vector<uint32_t> lengths;

 private:
  Progress& progress_;
  uint64_t current_ = 0;
};

// Pass 2: the bytes go to the shard writers.
class ShardFiller : public DocumentSink {
 public:
  ShardFiller(DatasetBuilder& builder, Progress& progress) : builder_(builder), progress_(progress) {}
  void bytes(const unsigned char* data, size_t size) override {
    builder_.writer().append_bytes(data, size);
  }
  void end_document() override {
    builder_.end_document();
    ++documents_;
  }
  void input_progress(uint64_t consumed) override { progress_.update(documents_, consumed); }

 private:
  DatasetBuilder& builder_;
  Progress& progress_;
  uint64_t documents_ = 0;
};

// The corpus reader's options: prep's --threads also decode Parquet row groups.
CorpusOptions corpus_options(const PrepOptions& options) {
  CorpusOptions corpus = options.corpus;
  corpus.threads = options.threads;
  return corpus;
}

// Parquet cells skipped, for the message of an input without documents ("" where none were).
std::string skipped_cells(const CorpusCounts& counts) {
  if (counts.null_cells == 0 && counts.non_string_cells == 0) return "";
  std::string text = "; " + std::to_string(counts.null_cells) + " null cells and " +
                     std::to_string(counts.non_string_cells) + " cells that hold no string were skipped";
  if (counts.non_string_cells > 0) text += ": name the text column with --text-key";
  return text;
}

// What the first pass read and skipped, for the report.
void add_first_pass(PrepReport& report, const CorpusCounts& counts) {
  report.input_bytes = counts.input_bytes;
  report.bad_lines = counts.bad_lines;
  report.bad_line_examples = counts.bad_line_examples;
  report.null_cells = counts.null_cells;
  report.non_string_cells = counts.non_string_cells;
}

// ---- prep with a tokenizer ----------------------------------------------------------------

// Encodes batches of documents on worker threads; futures hand the results back, and the caller
// consumes them in submission order, so the output does not depend on the thread count.
class BatchEncoder {
 public:
  struct Result {
    std::vector<uint32_t> tokens;   // every document's ids, concatenated
    std::vector<uint64_t> lengths;  // per document (0: the document encodes to nothing)
  };

  // bos >= 0: that id begins every document that encodes to something.
  BatchEncoder(const Tokenizer& tokenizer, unsigned threads, int64_t bos) : tokenizer_(tokenizer), bos_(bos) {
    for (unsigned t = 0; t < threads; ++t) workers_.emplace_back([this] { work(); });
  }
  ~BatchEncoder() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    ready_.notify_all();
    for (std::thread& worker : workers_) worker.join();
  }

  std::future<Result> submit(std::vector<std::string> docs) {
    auto task = std::make_shared<std::packaged_task<Result()>>(
        [this, docs = std::move(docs)] { return encode(docs); });
    std::future<Result> result = task->get_future();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back([task] { (*task)(); });
    }
    ready_.notify_one();
    return result;
  }

 private:
  Result encode(const std::vector<std::string>& docs) const {
    Result result;
    for (const std::string& doc : docs) {
      size_t before = result.tokens.size();
      if (bos_ >= 0) result.tokens.push_back(uint32_t(bos_));
      tokenizer_.encode(doc, result.tokens);
      if (bos_ >= 0 && result.tokens.size() == before + 1) result.tokens.pop_back();  // nothing but the BOS
      result.lengths.push_back(result.tokens.size() - before);
    }
    return result;
  }

  void work() {
    while (true) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        ready_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      job();  // a packaged_task: exceptions travel to the future
    }
  }

  const Tokenizer& tokenizer_;
  int64_t bos_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
};

// The token spill file: ids in their on-disk width, in document order; removed when done.
class SpillFile {
 public:
  SpillFile(std::string path, uint32_t token_bytes) : path_(std::move(path)), token_bytes_(token_bytes) {
    file_ = std::fopen(path_.c_str(), "w+b");
    KILTER_CHECK(file_, path_ << ": cannot create the token spill file (" << std::strerror(errno) << ")");
  }
  ~SpillFile() {
    if (file_) std::fclose(file_);
    std::remove(path_.c_str());
  }
  SpillFile(const SpillFile&) = delete;
  SpillFile& operator=(const SpillFile&) = delete;

  void write(const std::vector<uint32_t>& tokens) {
    if (tokens.empty()) return;
    size_t written;
    if (token_bytes_ == 2) {
      narrow_.resize(tokens.size());
      for (size_t i = 0; i < tokens.size(); ++i) narrow_[i] = uint16_t(tokens[i]);
      written = std::fwrite(narrow_.data(), 2, narrow_.size(), file_);
    } else {
      written = std::fwrite(tokens.data(), 4, tokens.size(), file_);
    }
    KILTER_CHECK(written == tokens.size(), path_ << ": write failed (disk full?)");
  }
  void rewind() {
    KILTER_CHECK(std::fflush(file_) == 0, path_ << ": write failed (disk full?)");
    std::rewind(file_);
  }
  // Reads the next `count` ids into `out`.
  void read(size_t count, std::vector<uint32_t>& out) {
    out.resize(count);
    size_t got;
    if (token_bytes_ == 2) {
      narrow_.resize(count);
      got = std::fread(narrow_.data(), 2, count, file_);
      for (size_t i = 0; i < got; ++i) out[i] = narrow_[i];
    } else {
      got = std::fread(out.data(), 4, count, file_);
    }
    KILTER_CHECK(got == count, path_ << ": short read of the token spill file");
  }

 private:
  std::string path_;
  uint32_t token_bytes_;
  FILE* file_ = nullptr;
  std::vector<uint16_t> narrow_;
};

// Pass 1 with a tokenizer: documents are gathered into batches of about 512 KiB, encoded on the
// worker threads, and their ids appended to the spill file in order. At most 4 batches per
// thread are in flight, which bounds memory whatever the corpus size.
class TokenizingSink : public DocumentSink {
 public:
  TokenizingSink(const Tokenizer& tokenizer, unsigned threads, int64_t bos, SpillFile& spill, Progress& progress)
      : encoder_(tokenizer, threads, bos), max_in_flight_(4 * threads), spill_(spill),
        progress_(progress), vocab_(tokenizer.vocab_size()) {}

  void bytes(const unsigned char* data, size_t size) override {
    current_.append(reinterpret_cast<const char*>(data), size);
  }
  void end_document() override {
    batch_bytes_ += current_.size();
    batch_.push_back(std::move(current_));
    current_.clear();
    if (batch_bytes_ >= kBatchBytes || batch_.size() >= kBatchDocuments) submit();
  }
  void input_progress(uint64_t consumed) override { progress_.update(lengths.size(), consumed); }

  // Encodes what is left and waits for every batch.
  void finish() {
    submit();
    while (!in_flight_.empty()) drain_one();
  }

  std::vector<uint32_t> lengths;
  uint64_t empty_documents = 0;  // documents with text but no ids

 private:
  static constexpr size_t kBatchBytes = size_t(512) << 10;
  static constexpr size_t kBatchDocuments = 8192;

  void submit() {
    if (batch_.empty()) return;
    in_flight_.push_back(encoder_.submit(std::move(batch_)));
    batch_.clear();
    batch_bytes_ = 0;
    while (in_flight_.size() > max_in_flight_) drain_one();
  }

  void drain_one() {
    BatchEncoder::Result result = in_flight_.front().get();
    in_flight_.pop_front();
    for (uint64_t length : result.lengths) {
      if (length == 0) {
        ++empty_documents;
        continue;
      }
      KILTER_CHECK(length <= UINT32_MAX, "document " << lengths.size() << " has " << length
                                                     << " tokens; the format stores lengths as uint32");
      lengths.push_back(uint32_t(length));
    }
    for (uint32_t id : result.tokens)
      KILTER_CHECK(id < vocab_, "the tokenizer produced id " << id << ", not below its vocab_size "
                                                             << vocab_);
    spill_.write(result.tokens);
  }

  BatchEncoder encoder_;
  size_t max_in_flight_;
  SpillFile& spill_;
  Progress& progress_;
  uint32_t vocab_;
  std::string current_;
  std::vector<std::string> batch_;
  size_t batch_bytes_ = 0;
  std::deque<std::future<BatchEncoder::Result>> in_flight_;
};

PrepReport prepare_tokenized_dataset(const PrepOptions& options, const std::vector<InputFile>& inputs,
                                     uint64_t input_bytes, std::chrono::steady_clock::time_point start) {
  std::unique_ptr<Tokenizer> tokenizer = load_tokenizer_file(options.tokenizer);
  const int64_t bos = options.bos ? tokenizer->bos_id() : -1;
  KILTER_USER_CHECK(!options.bos || bos >= 0, "--bos: the tokenizer " << options.tokenizer
                                               << " defines no BOS token (no template in its post_processor, no <s> or "
                                                  "<|begin_of_text|>); leave --bos out");
  const uint32_t token_bytes = token_bytes_for_vocab(tokenizer->vocab_size());
  unsigned threads = options.threads ? options.threads : std::thread::hardware_concurrency();
  threads = std::max(1u, threads);

  AtomicDirectory out(options.out, options.force);
  SpillFile spill(out.scratch("tokens"), token_bytes);
  Progress tokenize_progress("prep tokenize", input_bytes, options.progress);
  TokenizingSink sink(*tokenizer, threads, bos, spill, tokenize_progress);
  CorpusCounts first_pass = read_corpus(inputs, options.format, sink, corpus_options(options));
  sink.finish();
  tokenize_progress.update(sink.lengths.size(), first_pass.input_bytes);
  tokenize_progress.finish();
  KILTER_USER_CHECK(!sink.lengths.empty(),
               "the inputs hold no documents with tokens (" << first_pass.empty_documents
                   << " empty ones and " << sink.empty_documents
                   << " that encode to nothing were dropped" << skipped_cells(first_pass) << ")");

  DatasetBuilder builder(out, sink.lengths, options.shards, tokenizer->vocab_size(),
                         tokenizer->eos_id(), tokenizer->kind(), tokenizer->file_bytes());
  uint64_t total_tokens = 0;
  for (uint32_t length : sink.lengths) total_tokens += length;
  Progress write_progress("prep write", total_tokens * token_bytes, options.progress);
  spill.rewind();
  std::vector<uint32_t> chunk;
  constexpr uint64_t kChunkTokens = uint64_t(1) << 20;
  uint64_t copied = 0;
  for (size_t doc = 0; doc < sink.lengths.size(); ++doc) {
    for (uint64_t left = sink.lengths[doc]; left > 0;) {
      size_t n = size_t(std::min(left, kChunkTokens));
      spill.read(n, chunk);
      builder.writer().append(chunk.data(), n);
      left -= n;
      copied += n;
    }
    builder.end_document();
    if (doc % 4096 == 0) write_progress.update(doc + 1, copied * token_bytes);
  }
  write_progress.update(sink.lengths.size(), copied * token_bytes);
  write_progress.finish();
  const DatasetIndex& index = builder.finish();
  out.commit();

  PrepReport report;
  fill_report(report, index, options.out);
  report.empty_documents = first_pass.empty_documents + sink.empty_documents;
  report.bos_id = bos;
  add_first_pass(report, first_pass);
  report.seconds = seconds_since(start);
  return report;
}

}  // namespace

PrepReport prepare_dataset(const PrepOptions& options) {
  auto start = std::chrono::steady_clock::now();
  std::vector<InputFile> inputs = expand_inputs(options.inputs, options.format);
  const uint64_t input_bytes = total_size(inputs);
  if (!options.tokenizer.empty()) return prepare_tokenized_dataset(options, inputs, input_bytes, start);
  KILTER_USER_CHECK(!options.bos, "--bos needs a tokenizer that defines a BOS token (--tokenizer FILE); the byte "
                                  "tokenizer has none");

  AtomicDirectory out(options.out, options.force);  // refuses an existing --out before the scan
  Progress scan_progress("prep scan", input_bytes, options.progress);
  LengthCollector collector(scan_progress);
  CorpusCounts first_pass = read_corpus(inputs, options.format, collector, corpus_options(options));
  scan_progress.update(first_pass.documents, first_pass.input_bytes);
  scan_progress.finish();
  KILTER_USER_CHECK(first_pass.documents > 0,
               "the inputs hold no non-empty documents (" << first_pass.empty_documents
                                                         << " empty ones were dropped" << skipped_cells(first_pass) << ")");

  DatasetBuilder builder(out, collector.lengths, options.shards, kByteVocabSize, kByteEosId, "byte");
  Progress write_progress("prep write", input_bytes, options.progress);
  ShardFiller filler(builder, write_progress);
  CorpusCounts second_pass = read_corpus(inputs, options.format, filler, corpus_options(options));
  write_progress.update(second_pass.documents, second_pass.input_bytes);
  write_progress.finish();
  const DatasetIndex& index = builder.finish();
  out.commit();

  PrepReport report;
  fill_report(report, index, options.out);
  report.empty_documents = first_pass.empty_documents;
  add_first_pass(report, first_pass);
  report.seconds = seconds_since(start);
  return report;
}

LengthDistribution LengthDistribution::parse(const std::string& spec) {
  auto colon = spec.find(':');
  std::string kind = spec.substr(0, colon);
  std::vector<double> values;
  if (colon != std::string::npos) {
    std::stringstream list(spec.substr(colon + 1));
    std::string item;
    while (std::getline(list, item, ',')) {
      char* end = nullptr;
      double value = std::strtod(item.c_str(), &end);
      KILTER_USER_CHECK(!item.empty() && end && *end == '\0',
                   "--lengths " << spec << ": '" << item << "' is not a number");
      values.push_back(value);
    }
  }
  LengthDistribution d;
  if (kind == "lognormal") {
    KILTER_USER_CHECK(values.size() == 2 || values.size() == 3,
                 "--lengths " << spec << ": expected lognormal:MU,SIGMA[,MAX]");
    d.kind = Kind::lognormal;
    d.mu = values[0];
    d.sigma = values[1];
    KILTER_USER_CHECK(d.sigma >= 0, "--lengths " << spec << ": SIGMA must be >= 0");
    if (values.size() == 3) {
      KILTER_USER_CHECK(values[2] >= 1 && values[2] <= UINT32_MAX,
                   "--lengths " << spec << ": MAX must be in [1, 2^32-1]");
      d.max = uint64_t(values[2]);
    }
  } else if (kind == "uniform") {
    KILTER_USER_CHECK(values.size() == 2, "--lengths " << spec << ": expected uniform:MIN,MAX");
    KILTER_USER_CHECK(values[0] >= 1 && values[1] >= values[0] && values[1] <= UINT32_MAX,
                 "--lengths " << spec << ": need 1 <= MIN <= MAX < 2^32");
    d.kind = Kind::uniform;
    d.min = uint64_t(values[0]);
    d.max = uint64_t(values[1]);
  } else {
    KILTER_USER_FAIL("--lengths " << spec << ": expected lognormal:MU,SIGMA[,MAX] or uniform:MIN,MAX");
  }
  return d;
}

namespace {

// Uniform double in (0, 1] from the top 53 bits: std::mt19937_64 is specified bit for bit by
// the standard, the library's distributions are not, so the transforms are spelled out here.
double unit_interval(std::mt19937_64& rng) { return double((rng() >> 11) + 1) * 0x1.0p-53; }

uint32_t draw_length(const LengthDistribution& d, std::mt19937_64& rng) {
  if (d.kind == LengthDistribution::Kind::uniform) {
    uint64_t span = d.max - d.min + 1;
    return uint32_t(d.min + uint64_t((unsigned __int128)rng() * span >> 64));
  }
  // Box-Muller: one standard normal from two uniforms.
  double z = std::sqrt(-2.0 * std::log(unit_interval(rng))) *
             std::cos(2.0 * M_PI * unit_interval(rng));
  double length = std::round(std::exp(d.mu + d.sigma * z));
  if (!(length >= 1)) length = 1;
  if (length > double(d.max)) length = double(d.max);
  return uint32_t(length);
}

uint64_t shard_seed(uint64_t seed, uint32_t shard) {
  // splitmix64 of (seed, shard): independent token streams per shard, so shards can be written
  // in any order and the first pass never needs to draw tokens.
  uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (uint64_t(shard) + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

PrepReport synthesize_dataset(const SynthOptions& options) {
  auto start = std::chrono::steady_clock::now();
  KILTER_USER_CHECK(options.docs >= 1, "--docs must be at least 1");
  KILTER_USER_CHECK(options.vocab >= 2, "--vocab must be at least 2 (one token plus EOS)");
  LengthDistribution distribution = LengthDistribution::parse(options.lengths);

  std::mt19937_64 length_rng(options.seed);
  std::vector<uint32_t> lengths(options.docs);
  uint64_t total_tokens = 0;
  for (uint32_t& length : lengths) {
    length = draw_length(distribution, length_rng);
    total_tokens += length;
  }

  AtomicDirectory out(options.out, options.force);
  const uint32_t eos = options.vocab - 1;
  DatasetBuilder builder(out, lengths, options.shards, options.vocab, eos, "synthetic");
  const uint32_t token_bytes = token_bytes_for_vocab(options.vocab);
  Progress progress("synth", total_tokens * token_bytes, options.progress);
  std::vector<uint32_t> tokens(size_t(1) << 16);
  uint64_t written = 0;
  for (uint32_t shard = 0; shard < options.shards; ++shard) {
    std::mt19937_64 token_rng(shard_seed(options.seed, shard));
    for (uint64_t doc = builder.shard_first_doc(shard); doc < builder.shard_end_doc(shard); ++doc) {
      for (uint64_t left = lengths[doc]; left > 0;) {
        size_t n = size_t(std::min<uint64_t>(left, tokens.size()));
        for (size_t i = 0; i < n; i += 2) {
          uint64_t bits = token_rng();  // two tokens per draw, multiply-shift into [0, vocab-1)
          tokens[i] = uint32_t((uint64_t(uint32_t(bits)) * eos) >> 32);
          if (i + 1 < n) tokens[i + 1] = uint32_t(((bits >> 32) * eos) >> 32);
        }
        builder.writer().append(tokens.data(), n);
        left -= n;
        written += n;
      }
      builder.end_document();
      progress.update(doc + 1, written * token_bytes);
    }
  }
  progress.finish();
  const DatasetIndex& index = builder.finish();
  out.commit();

  PrepReport report;
  fill_report(report, index, options.out);
  report.seconds = seconds_since(start);
  return report;
}

}  // namespace kilter::io
