// `kilter prep tokenizer train` (see tokenizer_train.h). The corpus is streamed once; a
// reservoir keeps a uniform sample of its lines (memory bounded by --sample, deterministic for a
// seed), which SentencePiece's trainer then reads through its SentenceIterator.
#include "io/tokenizer/tokenizer_train.h"

#include <sentencepiece_trainer.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>
#include <unordered_map>

#include "io/base/error.h"
#include "io/progress.h"
#include "io/tokenizer/tokenizer.h"

namespace kilter::io {

namespace {

// Splits documents into lines (without '\n' or a trailing '\r') and keeps a uniform sample.
class LineSampler : public DocumentSink {
 public:
  LineSampler(uint64_t capacity, uint64_t seed, Progress& progress)
      : capacity_(capacity), rng_(seed), progress_(progress) {}

  void bytes(const unsigned char* data, size_t size) override {
    for (size_t i = 0; i < size; ++i) {
      if (data[i] == '\n') {
        end_line();
      } else {
        line_.push_back(char(data[i]));
      }
    }
  }
  void end_document() override {
    end_line();
    ++documents;
  }
  void input_progress(uint64_t consumed) override { progress_.update(documents, consumed); }

  std::vector<std::string> sample;
  uint64_t documents = 0;
  uint64_t sentences = 0;

 private:
  void end_line() {
    if (!line_.empty() && line_.back() == '\r') line_.pop_back();
    if (line_.find_first_not_of(" \t") == std::string::npos) {
      line_.clear();
      return;
    }
    ++sentences;
    if (sample.size() < capacity_) {
      sample.push_back(std::move(line_));
    } else {
      // Algorithm R: line n (1-based) replaces a kept one with probability capacity/n.
      uint64_t slot = uint64_t((unsigned __int128)rng_() * sentences >> 64);
      if (slot < capacity_) sample[slot] = std::move(line_);
    }
    line_.clear();
  }

  uint64_t capacity_;
  std::mt19937_64 rng_;
  Progress& progress_;
  std::string line_;
};

class VectorIterator : public sentencepiece::SentenceIterator {
 public:
  explicit VectorIterator(const std::vector<std::string>& lines) : lines_(lines) {}
  bool done() const override { return next_ >= lines_.size(); }
  void Next() override { ++next_; }
  const std::string& value() const override { return lines_[next_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& lines_;
  size_t next_ = 0;
};

}  // namespace

TokenizerTrainReport train_sentencepiece(const TokenizerTrainOptions& options) {
  auto start = std::chrono::steady_clock::now();
  KILTER_CHECK(options.kind == "bpe" || options.kind == "unigram",
               "--kind: '" << options.kind << "' is not one of bpe, unigram");
  KILTER_CHECK(options.vocab >= 8, "--vocab " << options.vocab << " is too small (at least 8)");
  KILTER_CHECK(options.sample >= 1, "--sample must be at least 1");
  KILTER_CHECK(options.character_coverage > 0 && options.character_coverage <= 1,
               "--character-coverage must be in (0, 1]");
  KILTER_CHECK(!options.out.empty(), "--out: no output file given");
  std::vector<InputFile> inputs = expand_inputs(options.inputs, options.format);
  uint64_t input_bytes = 0;
  for (const InputFile& input : inputs) input_bytes += input.size;

  Progress progress("tokenizer sample", input_bytes, options.progress);
  LineSampler sampler(options.sample, options.seed, progress);
  CorpusCounts counts = read_corpus(inputs, options.format, sampler);
  progress.update(sampler.documents, counts.input_bytes);
  progress.finish();
  KILTER_CHECK(!sampler.sample.empty(), "the inputs hold no non-empty lines to train on");

  unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::unordered_map<std::string, std::string> args = {
      {"model_type", options.kind},
      {"vocab_size", std::to_string(options.vocab)},
      {"character_coverage", std::to_string(options.character_coverage)},
      {"byte_fallback", options.byte_fallback ? "true" : "false"},
      {"input_sentence_size", "0"},  // the reservoir above already drew the sample
      {"max_sentence_length", "16384"},
      {"num_threads", std::to_string(threads)},
      {"minloglevel", options.progress ? "0" : "1"},
  };
  VectorIterator lines(sampler.sample);
  std::string model;
  auto status = sentencepiece::SentencePieceTrainer::Train(args, &lines, &model);
  KILTER_CHECK(status.ok(), "SentencePiece training failed: " << status.ToString()
                                << " (a smaller --vocab or more input text may help)");

  // Written to a sibling temporary file and renamed, so --out never holds half a model.
  namespace fs = std::filesystem;
  fs::path target = fs::absolute(options.out);
  if (target.has_parent_path()) fs::create_directories(target.parent_path());
  std::string temp = target.string() + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream file(temp, std::ios::binary | std::ios::trunc);
    file.write(model.data(), std::streamsize(model.size()));
    file.flush();
    KILTER_CHECK(file, "--out " << options.out << ": cannot write " << temp);
  }
  fs::rename(temp, target);

  TokenizerTrainReport report;
  report.out = options.out;
  report.documents = sampler.documents;
  report.sentences = sampler.sentences;
  report.sampled_sentences = sampler.sample.size();
  report.vocab = make_sentencepiece_tokenizer(model, options.out)->vocab_size();
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace kilter::io
