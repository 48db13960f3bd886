// Generation with a KV cache (lib/model/generate.h), the token picker, the text codec of
// sampling (lib/train/sampling.h) and the tokenizer recorded in checkpoints (io/checkpoint.h).
// Greedy generation against PyTorch is tests/e2e/sample_cli.sh.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string_view>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/tokenizer/tokenizer_train.h"
#include "io_testing.h"
#include "io/base/error.h"
#include "lib/model/generate.h"
#include "lib/model/model.h"
#include "lib/train/sampling.h"

namespace {

using kilter::model::Generator;
using kilter::model::ModelSpec;

ModelSpec small_config() {
  ModelSpec cfg;
  cfg.n_layer = 2;
  cfg.n_head = 2;
  cfg.n_embd = 16;
  cfg.block_size = 24;
  cfg.vocab_size = 37;
  return cfg;
}

// GPT-2 initialized weights from the CPU backend, with larger embeddings so logits differ clearly.
std::vector<float> initialized_params(const ModelSpec& cfg, uint64_t seed) {
  auto model = kilter::model::make_model("cpu", cfg, 1, "fp32");
  model->init_params(seed);
  std::vector<float> params(model->layout().num_params);
  model->get_params(params.data());
  for (size_t i = 0; i < size_t(cfg.vocab_size + cfg.block_size) * cfg.n_embd; ++i) params[i] *= 20.0f;
  return params;
}

std::vector<int32_t> some_tokens(int n, int vocab) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back((i * 7 + 3) % vocab);
  return t;
}

TEST(Generator, FeedingAllAtOnceEqualsOneByOne) {
  // The cache must make incremental feeding exactly the computation of a longer prefill.
  const ModelSpec cfg = small_config();
  const std::vector<float> params = initialized_params(cfg, 5);
  const std::vector<int32_t> tokens = some_tokens(cfg.block_size, cfg.vocab_size);
  for (int split : {1, 5, cfg.block_size - 1}) {
    Generator whole(cfg, params), parts(cfg, params);
    const float* a = whole.feed(tokens.data(), cfg.block_size);
    std::vector<float> expected(a, a + cfg.vocab_size);
    parts.feed(tokens.data(), split);
    const float* b = nullptr;
    for (int i = split; i < cfg.block_size; ++i) b = parts.feed(&tokens[size_t(i)], 1);
    EXPECT_EQ(parts.position(), cfg.block_size);
    float max_abs = 0;
    for (float v : expected) max_abs = std::max(max_abs, std::fabs(v));
    for (int v = 0; v < cfg.vocab_size; ++v)
      EXPECT_NEAR(b[v], expected[size_t(v)], 1e-5f * max_abs) << "split " << split << " id " << v;
  }
}

// Sharded parameters' view: a buffer that holds a unit only between need and forward_done (or the
// feed's pass_done), as rank 0 of a shard group does while it samples; zeros otherwise.
class UnitsOnDemand final : public kilter::model::ParamUnitHooks {
 public:
  UnitsOnDemand(const ModelSpec& cfg, const std::vector<float>& whole)
      : whole_(whole), buffer_(whole.size(), 0.0f),
        units_(kilter::model::param_unit_ranges(kilter::model::ParamLayout::build(cfg))), held_(units_.size()) {}
  float* buffer() { return buffer_.data(); }
  bool need(int unit) override {
    order.push_back(unit);
    if (held_[size_t(unit)]) return false;
    const kilter::model::ParamRange& r = units_[size_t(unit)];
    std::copy(whole_.begin() + long(r.offset), whole_.begin() + long(r.offset + r.count), buffer_.begin() + long(r.offset));
    held_[size_t(unit)] = true;
    return true;
  }
  void forward_done(int unit) override {
    const kilter::model::ParamRange& r = units_[size_t(unit)];
    std::fill(buffer_.begin() + long(r.offset), buffer_.begin() + long(r.offset + r.count), 0.0f);
    held_[size_t(unit)] = false;
  }
  void grads_final(int) override { ADD_FAILURE() << "a generator has no gradients"; }
  void pass_done() override {
    ++passes;
    for (size_t u = 0; u < units_.size(); ++u)
      if (held_[u]) forward_done(int(u));
  }
  std::vector<int> order;
  int passes = 0;

 private:
  const std::vector<float>& whole_;
  std::vector<float> buffer_;
  std::vector<kilter::model::ParamRange> units_;
  std::vector<bool> held_;
};

TEST(Generator, UnitByUnitGivesTheWholeModelsLogits) {
  // Units asked for in order (embeddings, blocks, final unit), each feed, every unit freed after
  // it, and logits bit for bit the copy's: tied (gpt2) and untied (llama) heads.
  for (bool llama : {false, true}) {
    ModelSpec cfg = small_config();
    if (llama) {
      cfg.arch = "llama";
      cfg.n_kv_head = 1;
      cfg.ffn_hidden = 40;
      cfg.tie_embeddings = "false";
    }
    const std::vector<float> params = initialized_params(cfg, 11);
    UnitsOnDemand units(cfg, params);
    Generator whole(cfg, params), parts(cfg, units.buffer(), &units);
    const std::vector<int32_t> tokens = some_tokens(7, cfg.vocab_size);
    for (int count : {5, 1, 1}) {
      const int at = whole.position();
      units.order.clear();
      const float* expected = whole.feed(tokens.data() + at, count);
      const float* got = parts.feed(tokens.data() + at, count);
      for (int v = 0; v < cfg.vocab_size; ++v) ASSERT_EQ(got[v], expected[v]) << "llama " << llama << " id " << v;
      const std::vector<int> in_order = {0, 1, 2, 3};  // 2 layers: embeddings, 2 blocks, final unit
      EXPECT_EQ(units.order, in_order);
      for (float w : std::vector<float>(units.buffer(), units.buffer() + params.size())) ASSERT_EQ(w, 0.0f);
    }
    EXPECT_EQ(units.passes, 3);
  }
}

TEST(Generator, ResetForgetsTheCache) {
  const ModelSpec cfg = small_config();
  Generator g(cfg, initialized_params(cfg, 6));
  const std::vector<int32_t> tokens = some_tokens(6, cfg.vocab_size);
  g.feed(tokens.data(), 6);
  g.feed(tokens.data(), 3);  // the cache now holds 9 positions
  g.reset();
  const float* again = g.feed(tokens.data(), 6);
  Generator fresh(cfg, initialized_params(cfg, 6));
  const float* expected = fresh.feed(tokens.data(), 6);
  for (int v = 0; v < cfg.vocab_size; ++v) EXPECT_FLOAT_EQ(again[v], expected[v]);
}

TEST(Generator, RefusesIdsOutsideTheVocabularyAndContextOverflow) {
  const ModelSpec cfg = small_config();
  Generator g(cfg, initialized_params(cfg, 7));
  const int32_t bad[1] = {cfg.vocab_size};
  EXPECT_THROW(g.feed(bad, 1), kilter::Error);
  const std::vector<int32_t> tokens = some_tokens(cfg.block_size + 1, cfg.vocab_size);
  EXPECT_THROW(g.feed(tokens.data(), cfg.block_size + 1), kilter::Error);
  kilter::model::SamplingOptions options;
  EXPECT_THROW(kilter::model::generate(g, tokens, options), kilter::Error);  // prompt longer than the context
}

TEST(Generate, StopsAtTheContextAtMaxNewTokensAndAtEos) {
  const ModelSpec cfg = small_config();
  Generator g(cfg, initialized_params(cfg, 8));
  const std::vector<int32_t> prompt = some_tokens(10, cfg.vocab_size);
  kilter::model::SamplingOptions options;
  options.temperature = 0;
  options.max_new_tokens = 1000;
  auto full = kilter::model::generate(g, prompt, options);
  EXPECT_EQ(full.stop_reason, "context");
  EXPECT_EQ(int(full.tokens.size()), cfg.block_size - 10 + 1);  // the last token is never fed back
  options.max_new_tokens = 5;
  auto five = kilter::model::generate(g, prompt, options);
  EXPECT_EQ(five.stop_reason, "max_new_tokens");
  ASSERT_EQ(five.tokens.size(), 5u);
  EXPECT_EQ(std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + 5), five.tokens);
  options.eos_id = full.tokens[2];  // stop where greedy picks this id first
  auto eos = kilter::model::generate(g, prompt, options);
  EXPECT_EQ(eos.stop_reason, "eos");
  size_t first = 0;
  while (full.tokens[first] != options.eos_id) ++first;
  EXPECT_EQ(eos.tokens, std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + long(first)));
}

// An empty prompt draws its first token from the document starts (never from the model, which
// was not trained to predict a document's first token), then the model continues it.
TEST(Generate, UnpromptedSamplesStartWithADocumentStart) {
  const ModelSpec cfg = small_config();
  Generator g(cfg, initialized_params(cfg, 9));
  kilter::model::DocumentStarts starts;
  starts.ids = {5, 9, 30};
  starts.counts = {6, 3, 0};  // 30 starts no document: never drawn
  kilter::model::SamplingOptions options;
  options.temperature = 0;
  options.max_new_tokens = 12;
  options.eos_id = 36;
  auto greedy = kilter::model::generate(g, {}, options, &starts);
  ASSERT_FALSE(greedy.tokens.empty());
  EXPECT_EQ(greedy.tokens[0], 5);  // the most frequent start
  // The rest is what the model writes after that token.
  options.max_new_tokens = 11;
  auto after = kilter::model::generate(g, {5}, options);
  EXPECT_EQ(std::vector<int32_t>(greedy.tokens.begin() + 1, greedy.tokens.end()), after.tokens);

  std::map<int32_t, int> firsts;
  options.temperature = 1.0;
  options.max_new_tokens = 1;
  for (uint64_t seed = 0; seed < 300; ++seed) {
    options.seed = seed;
    auto one = kilter::model::generate(g, {}, options, &starts);
    ASSERT_EQ(one.tokens.size(), 1u);  // never empty: a document start is never the EOS
    ++firsts[one.tokens[0]];
  }
  EXPECT_EQ(firsts.size(), 2u);  // 5 and 9 only
  EXPECT_GT(firsts[5], firsts[9]);
  EXPECT_GT(firsts[9], 50);  // 1/3 of 300 expected
  options.top_k = 1;  // top-k acts on the starts as on the model's logits
  for (uint64_t seed = 0; seed < 20; ++seed) {
    options.seed = seed;
    EXPECT_EQ(kilter::model::generate(g, {}, options, &starts).tokens, std::vector<int32_t>{5});
  }
  options.max_new_tokens = 0;
  EXPECT_TRUE(kilter::model::generate(g, {}, options, &starts).tokens.empty());

  options.max_new_tokens = 4;
  EXPECT_THROW(kilter::model::generate(g, {}, options), kilter::Error);  // nothing to start from
  kilter::model::DocumentStarts outside;
  outside.ids = {cfg.vocab_size};
  outside.counts = {1};
  EXPECT_THROW(kilter::model::generate(g, {}, options, &outside), kilter::Error);
}

TEST(TokenPicker, GreedyTopKAndSeeds) {
  const std::vector<float> logits = {0.5f, 2.0f, 2.0f, -1.0f, 1.5f};
  kilter::model::TokenPicker greedy(0.0, 0, 1);
  EXPECT_EQ(greedy.pick(logits.data(), 5), 1);  // a tie goes to the lower id
  kilter::model::TokenPicker top1(2.0, 1, 99);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(top1.pick(logits.data(), 5), 1);
  kilter::model::TokenPicker top3(1.0, 3, 7);
  for (int i = 0; i < 200; ++i) {
    const int id = top3.pick(logits.data(), 5);
    EXPECT_TRUE(id == 1 || id == 2 || id == 4) << id;
  }
  kilter::model::TokenPicker a(1.0, 0, 42), b(1.0, 0, 42), c(1.0, 0, 43);
  std::vector<int> sa, sb, sc;
  for (int i = 0; i < 100; ++i) {
    sa.push_back(a.pick(logits.data(), 5));
    sb.push_back(b.pick(logits.data(), 5));
    sc.push_back(c.pick(logits.data(), 5));
  }
  EXPECT_EQ(sa, sb);
  EXPECT_NE(sa, sc);
  EXPECT_THROW(kilter::model::TokenPicker(-0.5, 0, 1), kilter::Error);
  const std::vector<float> bad = {0.0f, NAN};
  EXPECT_THROW(greedy.pick(bad.data(), 2), kilter::Error);
}

TEST(TokenPicker, FrequenciesFollowTheSoftmaxAtTheTemperature) {
  const std::vector<float> logits = {1.0f, 0.0f, -1.0f, 0.5f};
  const double temperature = 0.7;
  kilter::model::TokenPicker picker(temperature, 0, 2024);
  std::map<int, int> counts;
  const int draws = 40000;
  for (int i = 0; i < draws; ++i) ++counts[picker.pick(logits.data(), 4)];
  double total = 0;
  for (float l : logits) total += std::exp(l / temperature);
  for (int v = 0; v < 4; ++v)  // standard error ~ 0.0025 at these frequencies
    EXPECT_NEAR(double(counts[v]) / draws, std::exp(logits[size_t(v)] / temperature) / total, 0.012) << v;
}

TEST(TextCodec, ByteTextIdsOnlyKindsAndEmptyPrompts) {
  using kilter::train::TextCodec;
  TextCodec bytes = TextCodec::from_record("byte", "", 256, "test");
  ASSERT_TRUE(bytes.tokenizer);
  EXPECT_EQ(bytes.decode({72, 105, 256}), "Hi");
  EXPECT_EQ(kilter::train::prompt_ids(bytes, "Hi", {}, false, "test"), (std::vector<int32_t>{72, 105}));
  EXPECT_TRUE(kilter::train::prompt_ids(bytes, "", {}, false, "test").empty());
  // An empty prompt starts from the document starts; without any (older checkpoints), from the
  // EOS id, with a note saying why the start may be poor.
  std::string note;
  kilter::model::DocumentStarts starts;
  EXPECT_EQ(kilter::train::unprompted_start(bytes, starts, "test", note), (std::vector<int32_t>{256}));
  EXPECT_NE(note.find("no document starts"), std::string::npos) << note;
  note.clear();
  starts = kilter::train::to_document_starts({{72, 3}, {84, 1}});
  EXPECT_EQ(starts.ids, (std::vector<int32_t>{72, 84}));
  EXPECT_EQ(starts.counts, (std::vector<uint64_t>{3, 1}));
  EXPECT_TRUE(kilter::train::unprompted_start(bytes, starts, "test", note).empty());
  EXPECT_EQ(note, "");
  TextCodec ids = TextCodec::from_record("imported", "", 50256, "test");
  EXPECT_FALSE(ids.tokenizer);
  EXPECT_EQ(ids.decode({1, 22, 333}), "[1 22 333]");
  EXPECT_THROW(kilter::train::prompt_ids(ids, "text", {}, false, "test"), kilter::Error);
  EXPECT_EQ(kilter::train::prompt_ids(ids, "", {5, 6}, true, "test"), (std::vector<int32_t>{5, 6}));
  try {
    TextCodec::from_record("no-such-kind", "abc", 3, "checkpoint x.h5");
    FAIL() << "an unknown tokenizer kind loaded";
  } catch (const kilter::Error& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint x.h5"), std::string::npos) << e.what();
  }
}

// Words joined by spaces, without a leading one: how SentencePiece decodes "▁word" pieces.
class WordTokenizer final : public kilter::io::Tokenizer {
 public:
  std::string kind() const override { return "words"; }
  uint32_t vocab_size() const override { return 3; }
  uint32_t eos_id() const override { return 2; }
  void encode(std::string_view, std::vector<uint32_t>&) const override {}
  std::string decode(const uint32_t* ids, size_t count) const override {
    static const char* const words[2] = {"hello", "world"};
    std::string text;
    for (size_t i = 0; i < count; ++i)
      if (ids[i] < 2) text += (text.empty() ? "" : " ") + std::string(words[ids[i]]);
    return text;
  }
  const std::string& file_bytes() const override { return empty_; }

 private:
  std::string empty_;
};

TEST(TextCodec, ContinuationKeepsTheSpaceATokenizerDropsAtTheStart) {
  kilter::train::TextCodec codec;
  codec.kind = "words";
  codec.tokenizer = std::make_unique<WordTokenizer>();
  EXPECT_EQ(codec.decode({1}), "world");
  EXPECT_EQ(codec.continuation({0}, {1, 0}), " world hello");
  EXPECT_EQ(codec.continuation({2}, {0, 1}), "hello world");  // after an EOS start: nothing to skip
  kilter::train::TextCodec ids = kilter::train::TextCodec::from_record("imported", "", 5, "test");
  EXPECT_EQ(ids.continuation({1}, {2, 3}), "[2 3]");
}

// The document starts the trainer records: every document's first token, read through the
// reader, against the shards read directly; or an evenly spaced subset of documents.
TEST(DocumentStarts, CountTheFirstTokenOfEveryDocumentOrAnEvenSubset) {
  kilter::io::testing::ScratchDir scratch;
  const std::string dir = kilter::io::testing::make_synth(scratch.path("data"), 500, 3, 7, "uniform:1,40");
  const kilter::io::DatasetIndex index = kilter::io::load_index(dir);
  std::map<uint32_t, uint64_t> expected;
  std::vector<uint32_t> firsts;  // by global document id
  for (uint32_t s = 0; s < 3; ++s) {
    char name[32];
    std::snprintf(name, sizeof name, "/shard-%05u.h5", s);
    const std::vector<uint32_t> tokens = kilter::io::testing::shard_tokens(dir + name);
    for (uint64_t d = 0; d < index.shards[s].num_docs; ++d) {
      firsts.push_back(tokens[kilter::io::testing::get_offset(dir + name, d)]);
      ++expected[firsts.back()];
    }
  }
  ASSERT_EQ(firsts.size(), 500u);
  const auto all = kilter::train::count_document_starts(index, dir, {});
  EXPECT_EQ(all, (std::vector<std::pair<uint32_t, uint64_t>>(expected.begin(), expected.end())));
  // A list of documents, and at most 100 of them: every fifth.
  std::vector<uint64_t> docs(500);
  for (uint64_t d = 0; d < 500; ++d) docs[d] = d;
  std::map<uint32_t, uint64_t> fifth;
  for (uint64_t d = 0; d < 500; d += 5) ++fifth[firsts[d]];
  EXPECT_EQ(kilter::train::count_document_starts(index, dir, docs, 100),
            (std::vector<std::pair<uint32_t, uint64_t>>(fifth.begin(), fifth.end())));
}

// ---- checkpoints carry the tokenizer ----------------------------------------------------------

kilter::io::CheckpointContents tiny_checkpoint() {
  kilter::io::CheckpointContents c;
  c.tensors = {{"transformer.wte.weight", {5, 3}, 0, 15}, {"transformer.ln_f.bias", {3}, 15, 3}};
  for (int i = 0; i < 18; ++i) {
    c.params.push_back(0.5f * float(i));
    c.adam_m.push_back(0.0f);
    c.adam_v.push_back(0.0f);
  }
  c.info.kilter_version = "test";
  c.info.n_layer = c.info.n_head = c.info.n_embd = c.info.block_size = 1;
  c.info.vocab_size = 5;
  return c;
}

std::string temp_path(const char* name) {
  return std::string("/tmp/kilter-sample-test-") + std::to_string(::getpid()) + "-" + name;
}

// A real SentencePiece model (BPE, byte fallback) trained on a few sentences.
std::string sentencepiece_model(const std::string& dir) {
  const std::string corpus = dir + "/corpus.txt", model = dir + "/sp.model";
  {
    std::ofstream f(corpus);
    for (int i = 0; i < 40; ++i)
      f << "The cat sat on the mat. A dog ran in the park, and the old man read his paper.\n"
        << "Hello world, said the teacher to the class of small children.\n";
  }
  kilter::io::TokenizerTrainOptions options;
  options.inputs = {corpus};
  options.vocab = 320;  // 256 byte pieces, the characters, some merges
  options.byte_fallback = true;
  options.out = model;
  options.progress = false;
  kilter::io::train_sentencepiece(options);
  std::ifstream in(model, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::vector<int32_t> encode(const kilter::train::TextCodec& codec, const std::string& text) {
  std::vector<uint32_t> ids;
  codec.tokenizer->encode(text, ids);
  return {ids.begin(), ids.end()};
}

std::vector<int32_t> joined(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// SentencePiece: "▁" pieces become spaces, except at the very start of a decode; a prompt that
// ends inside a character (byte-fallback pieces) decodes to U+FFFD on its own.
TEST(TextCodec, ContinuationWithSentencePiecePieces) {
  const std::string dir = temp_path("sp");
  std::filesystem::create_directories(dir);
  const auto codec = kilter::train::TextCodec::from_record("sentencepiece", sentencepiece_model(dir), -1, "test");
  const auto prompt = encode(codec, "The cat"), more = encode(codec, "sat on the mat.");
  EXPECT_EQ(codec.decode(more), "sat on the mat.");  // on its own: no leading space
  EXPECT_EQ(codec.continuation(prompt, more), " sat on the mat.");
  EXPECT_EQ(codec.decode(prompt) + codec.continuation(prompt, more), "The cat sat on the mat.");
  EXPECT_EQ(codec.continuation({}, more), "sat on the mat.");  // an unprompted sample
  // "€" is not in the model: three byte pieces. A prompt that stops after two of them.
  const auto euro = encode(codec, "The \xE2\x82\xAC cat");
  size_t lead = 0;
  while (lead < euro.size() && codec.decode({euro.begin(), euro.begin() + long(lead) + 1}).find("\xEF\xBF\xBD") ==
                                   std::string::npos)
    ++lead;
  ASSERT_LT(lead + 2, euro.size()) << "no byte-fallback pieces for the euro sign";
  const std::vector<int32_t> cut(euro.begin(), euro.begin() + long(lead) + 2), tail(euro.begin() + long(lead) + 2, euro.end());
  EXPECT_EQ(codec.continuation(cut, tail), "\xE2\x82\xAC cat");  // the whole character, not U+FFFD
  std::filesystem::remove_all(dir);
}

// Byte-level BPE (tokenizer.json): decoding concatenates bytes, so a prompt that ends inside a
// character and its continuation join into the text decoded at once.
TEST(TextCodec, ContinuationWithByteLevelBpe) {
  const auto codec = kilter::train::TextCodec::from_record("hf-bpe", kilter::io::testing::tiny_bpe_tokenizer().dump(), -1, "test");
  const auto prompt = encode(codec, "hello"), more = encode(codec, " world \xE2\x82\xAC!");
  EXPECT_EQ(codec.continuation(prompt, more), " world \xE2\x82\xAC!");
  const auto all = joined(prompt, more);
  for (size_t cut = 1; cut < all.size(); ++cut) {  // every split, including inside the euro sign
    const std::vector<int32_t> head(all.begin(), all.begin() + long(cut)), tail(all.begin() + long(cut), all.end());
    EXPECT_EQ(codec.decode(head) + codec.continuation(head, tail), "hello world \xE2\x82\xAC!") << cut;
  }
}

TEST(CheckpointTokenizer, RoundTripsKindBytesAndEos) {
  auto c = tiny_checkpoint();
  c.info.tokenizer = "hf-bpe";
  c.info.eos_id = 50256;
  for (int i = 0; i < 200000; ++i) c.info.tokenizer_data.push_back(char(i * 31 % 251));  // > 64 KiB
  const std::string path = temp_path("tok.h5");
  kilter::io::write_checkpoint_file(path, c);
  const auto info = kilter::io::read_checkpoint_info(path);
  EXPECT_EQ(info.tokenizer, "hf-bpe");
  EXPECT_EQ(info.eos_id, 50256);
  EXPECT_EQ(info.tokenizer_data, c.info.tokenizer_data);
  EXPECT_TRUE(info.document_starts.empty());
  std::vector<float> params(18, -1.0f);
  kilter::io::read_checkpoint_params(path, c.tensors, params.data());
  EXPECT_EQ(params, c.params);
  ::unlink(path.c_str());
}

TEST(CheckpointTokenizer, DocumentStartsRoundTripAndDamageIsRefused) {
  auto c = tiny_checkpoint();
  c.info.tokenizer = "byte";
  c.info.eos_id = 256;
  c.info.document_starts = {{3, 10}, {65, 7}, {4000000000u, 1}};
  const std::string path = temp_path("starts.h5");
  kilter::io::write_checkpoint_file(path, c);
  EXPECT_EQ(kilter::io::read_checkpoint_info(path).document_starts, c.info.document_starts);
  {
    hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, "document_starts", H5P_DEFAULT);
    const uint64_t rows[6] = {3, 10, 65, 8, 4000000000u, 1};
    H5Dwrite(d, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, rows);
    H5Dclose(d);
    H5Fclose(f);
  }
  try {
    kilter::io::read_checkpoint_info(path);
    FAIL() << "damaged document starts were accepted";
  } catch (const kilter::Error& e) {
    EXPECT_NE(std::string(e.what()).find("document_starts fails its checksum"), std::string::npos) << e.what();
  }
  ::unlink(path.c_str());
}

TEST(CheckpointTokenizer, OlderCheckpointsReadWithoutOneAndDamageIsRefused) {
  auto c = tiny_checkpoint();
  c.info.tokenizer = "byte";
  c.info.eos_id = 256;
  const std::string old_path = temp_path("old.h5");
  kilter::io::write_checkpoint_file(old_path, c);
  {  // what a checkpoint of an earlier kilter looks like: no tokenizer attributes
    hid_t f = H5Fopen(old_path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    H5Adelete(f, "tokenizer");
    H5Adelete(f, "eos_id");
    H5Fclose(f);
  }
  const auto info = kilter::io::read_checkpoint_info(old_path);
  EXPECT_EQ(info.tokenizer, "");
  EXPECT_TRUE(info.document_starts.empty());
  EXPECT_EQ(info.eos_id, -1);
  ::unlink(old_path.c_str());

  c.info.tokenizer = "sentencepiece";
  c.info.tokenizer_data = std::string(1000, 'x');
  const std::string bad_path = temp_path("bad.h5");
  kilter::io::write_checkpoint_file(bad_path, c);
  {  // flip the tokenizer bytes behind the checksum's back
    hid_t f = H5Fopen(bad_path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, "tokenizer_data", H5P_DEFAULT);
    std::string other(1000, 'y');
    H5Dwrite(d, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, other.data());
    H5Dclose(d);
    H5Fclose(f);
  }
  try {
    kilter::io::read_checkpoint_info(bad_path);
    FAIL() << "damaged tokenizer bytes were accepted";
  } catch (const kilter::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer_data fails its checksum"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(bad_path), std::string::npos) << e.what();
  }
  ::unlink(bad_path.c_str());
}

}  // namespace
