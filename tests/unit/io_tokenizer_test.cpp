// Tokenizers (io/tokenizer*.cpp): a small hand-made byte-level BPE tokenizer.json encodes as
// its merges say; added tokens, normalizers and pre-tokenizer steps; unsupported components are
// refused by name; the EOS rule; `prep --tokenizer` records the tokenizer and does not depend on
// the thread count. Exact agreement with the reference libraries: tests/e2e/tokenizer_exact.sh.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "io/tokenizer/tokenizer.h"
#include "io_testing.h"

namespace kilter::io {
namespace {

using namespace kilter::io::testing;
using json = nlohmann::json;

std::vector<uint32_t> encode(const Tokenizer& tokenizer, const std::string& text) {
  std::vector<uint32_t> ids;
  tokenizer.encode(text, ids);
  return ids;
}

std::string refusal(const json& root) {
  try {
    make_hf_bpe_tokenizer(root.dump(), "tok.json");
  } catch (const Error& e) {
    return e.message();
  }
  return "(accepted)";
}

// `prep --format jsonl --tokenizer TOKENIZER --out OUT` of tmp's in.jsonl (file names in tmp).
PrepOptions jsonl_prep(const ScratchDir& tmp, const std::string& tokenizer, const std::string& out) {
  PrepOptions options;
  options.inputs = {tmp.path("in.jsonl")};
  options.format = InputFormat::jsonl;
  options.tokenizer = tmp.path(tokenizer);
  options.out = tmp.path(out);
  options.progress = false;
  return options;
}

TEST(IoTokenizer, ByteTokenizer) {
  auto tokenizer = make_byte_tokenizer();
  std::vector<uint32_t> ids = encode(*tokenizer, "a\xff");
  EXPECT_EQ(ids, (std::vector<uint32_t>{'a', 0xff}));
  ids.push_back(256);
  EXPECT_EQ(tokenizer->decode(ids.data(), ids.size()), "a\xff");
  EXPECT_EQ(load_tokenizer("byte", "", "x")->vocab_size(), 257u);
}

TEST(IoTokenizer, HfBpeMergesByRank) {
  auto tokenizer = make_hf_bpe_tokenizer(tiny_bpe_tokenizer().dump(), "tok.json");
  EXPECT_EQ(tokenizer->kind(), "hf-bpe");
  EXPECT_EQ(tokenizer->vocab_size(), 262u);
  EXPECT_EQ(tokenizer->eos_id(), 261u);
  // "hello" -> he ll o -> hell o; " world" -> Ġw or l d; "!" stays a byte.
  EXPECT_EQ(encode(*tokenizer, "hello world!"),
            (std::vector<uint32_t>{258, 'o', 259, 260, 'l', 'd', '!'}));
  // The added token is split out before the regex; the EOS decodes to "".
  std::vector<uint32_t> ids = encode(*tokenizer, "he<|endoftext|>he");
  EXPECT_EQ(ids, (std::vector<uint32_t>{256, 261, 256}));
  EXPECT_EQ(tokenizer->decode(ids.data(), ids.size()), "hehe");
  // Non-ASCII and invalid UTF-8 round-trip through the byte map.
  const std::string text = "caf\xc3\xa9 \xf0\x9f\x98\x80 \xff\xfe end\r\n";
  ids = encode(*tokenizer, text);
  EXPECT_EQ(tokenizer->decode(ids.data(), ids.size()), text);
}

TEST(IoTokenizer, HfBpeRecordedBytesRebuildIt) {
  auto tokenizer = make_hf_bpe_tokenizer(tiny_bpe_tokenizer().dump(), "tok.json");
  auto again = load_tokenizer("hf-bpe", tokenizer->file_bytes(), "index.h5");
  EXPECT_EQ(encode(*again, "hello world"), encode(*tokenizer, "hello world"));
  auto imported = load_tokenizer("imported", tokenizer->file_bytes(), "index.h5");
  EXPECT_EQ(imported->vocab_size(), 262u);
}

TEST(IoTokenizer, HfBpeEosRuleWithoutEndOfText) {
  json root = tiny_bpe_tokenizer();
  root["added_tokens"] = json::array();
  auto tokenizer = make_hf_bpe_tokenizer(root.dump(), "tok.json");
  EXPECT_EQ(tokenizer->eos_id(), 261u);  // one past the largest id (260)
  EXPECT_EQ(tokenizer->vocab_size(), 262u);
}

TEST(IoTokenizer, HfBpeNormalizerAndPreTokenizerSteps) {
  json root = tiny_bpe_tokenizer();
  root["normalizer"] = {{"type", "Sequence"},
                        {"normalizers", json::array({{{"type", "NFC"}}, {{"type", "Lowercase"}}})}};
  auto tokenizer = make_hf_bpe_tokenizer(root.dump(), "tok.json");
  // NFC composes e + U+0301 into U+00E9 (bytes c3 a9); Lowercase maps H to h.
  EXPECT_EQ(encode(*tokenizer, "HE"), (std::vector<uint32_t>{256}));
  EXPECT_EQ(encode(*tokenizer, "e\xcc\x81"), (std::vector<uint32_t>{0xc3, 0xa9}));

  root = tiny_bpe_tokenizer();
  root["pre_tokenizer"] = {{"type", "Sequence"},
                           {"pretokenizers",
                            json::array({{{"type", "Digits"}, {"individual_digits", true}},
                                         {{"type", "ByteLevel"}, {"add_prefix_space", true},
                                          {"use_regex", false}}})}};
  tokenizer = make_hf_bpe_tokenizer(root.dump(), "tok.json");
  // Digits isolate each digit; ByteLevel then prefixes a space to every piece.
  EXPECT_EQ(encode(*tokenizer, "12"), (std::vector<uint32_t>{' ', '1', ' ', '2'}));
}

TEST(IoTokenizer, UnsupportedComponentsAreRefusedByName) {
  json root = tiny_bpe_tokenizer();
  root["model"]["type"] = "WordPiece";
  EXPECT_NE(refusal(root).find("model.type = WordPiece is not supported"), std::string::npos)
      << refusal(root);
  root = tiny_bpe_tokenizer();
  root["normalizer"] = {{"type", "BertNormalizer"}};
  EXPECT_NE(refusal(root).find("normalizer.type = BertNormalizer is not supported"), std::string::npos);
  root = tiny_bpe_tokenizer();
  root["pre_tokenizer"] = {{"type", "Metaspace"}};
  EXPECT_NE(refusal(root).find("pre_tokenizer.type = Metaspace is not supported"), std::string::npos);
  root = tiny_bpe_tokenizer();
  root["pre_tokenizer"] = {{"type", "Sequence"},
                           {"pretokenizers", json::array({{{"type", "Split"},
                                                           {"pattern", {{"Regex", "\\s+"}}},
                                                           {"behavior", "MergedWithNext"}}})}};
  EXPECT_NE(refusal(root).find("pre_tokenizer.pretokenizers[0].behavior = MergedWithNext is not supported"),
            std::string::npos)
      << refusal(root);
  root = tiny_bpe_tokenizer();
  root["pre_tokenizer"] = nullptr;
  EXPECT_NE(refusal(root).find("no ByteLevel step"), std::string::npos);
  root = tiny_bpe_tokenizer();
  root["model"]["dropout"] = 0.1;
  EXPECT_NE(refusal(root).find("model.dropout"), std::string::npos);
  EXPECT_NE(refusal(json::array()).find("tok.json"), std::string::npos);
}

TEST(IoTokenizer, BadFilesNameThemselves) {
  ScratchDir tmp;
  write_file(tmp.path("junk.model"), "not a model");
  try {
    load_tokenizer_file(tmp.path("junk.model"));
    FAIL() << "junk accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("junk.model"), std::string::npos) << e.message();
  }
  EXPECT_THROW(load_tokenizer_file(tmp.path("missing.json")), Error);
  EXPECT_THROW(load_tokenizer("imported", "", "index.h5"), Error);
  EXPECT_THROW(load_tokenizer("wordpiece", "x", "index.h5"), Error);
}

TEST(IoTokenizer, PrepRecordsTheTokenizerAndIgnoresTheThreadCount) {
  ScratchDir tmp;
  write_file(tmp.path("tok.json"), tiny_bpe_tokenizer().dump());
  std::string jsonl;
  for (int i = 0; i < 3000; ++i)
    jsonl += "{\"text\": \"hello world " + std::to_string(i) + (i % 7 ? "" : " <|endoftext|>") + "\"}\n";
  write_file(tmp.path("in.jsonl"), jsonl);
  std::string hashes[2];
  for (unsigned threads : {1u, 3u}) {
    PrepOptions options = jsonl_prep(tmp, "tok.json", "out" + std::to_string(threads));
    options.shards = 2;
    options.threads = threads;
    PrepReport report = prepare_dataset(options);
    EXPECT_EQ(report.documents, 3000u);
    EXPECT_EQ(report.tokenizer, "hf-bpe");
    DatasetIndex index = load_index(options.out);
    EXPECT_EQ(index.tokenizer, "hf-bpe");
    EXPECT_EQ(index.vocab_size, 262u);
    EXPECT_EQ(index.eos_id, 261u);
    EXPECT_EQ(index.tokenizer_data, read_file(tmp.path("tok.json")));
    EXPECT_TRUE(validate_dataset(options.out).empty());
    std::vector<uint32_t> tokens = shard_tokens(options.out + "/shard-00000.h5");
    EXPECT_EQ(std::vector<uint32_t>(tokens.begin(), tokens.begin() + 4),
              (std::vector<uint32_t>{258, 'o', 259, 260}));
    hashes[threads == 1 ? 0 : 1] = index.shards[0].hash + index.shards[1].hash;
  }
  EXPECT_EQ(hashes[0], hashes[1]);
}

// BOS (issue 38): the special token the post-processor's template puts first (Llama 3's
// TemplateProcessing, inside a Sequence); `prep --bos` puts it before every document; a tokenizer
// without one (GPT-2's ByteLevel post-processor) is refused by --bos, naming the file.
TEST(IoTokenizer, PrepBosPutsTheTemplatesFirstTokenBeforeEveryDocument) {
  json root = tiny_bpe_tokenizer();
  EXPECT_EQ(make_hf_bpe_tokenizer(root.dump(), "tok.json")->bos_id(), -1);
  root["added_tokens"].push_back({{"id", 262}, {"content", "<|begin_of_text|>"}, {"special", true},
                                  {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                                  {"normalized", false}});
  root["post_processor"] = json::parse(R"({"type": "Sequence", "processors": [
      {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
      {"type": "TemplateProcessing",
       "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
       "pair": [],
       "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [262], "tokens": ["<|begin_of_text|>"]}}}]})");
  EXPECT_EQ(make_hf_bpe_tokenizer(root.dump(), "tok.json")->bos_id(), 262);
  ScratchDir tmp;
  write_file(tmp.path("llama.json"), root.dump());
  write_file(tmp.path("gpt2.json"), tiny_bpe_tokenizer().dump());
  write_file(tmp.path("in.jsonl"), "{\"text\": \"hello\"}\n{\"text\": \"\"}\n{\"text\": \" world\"}\n");
  PrepOptions options = jsonl_prep(tmp, "llama.json", "out");
  options.bos = true;
  const PrepReport report = prepare_dataset(options);
  EXPECT_EQ(report.bos_id, 262);
  EXPECT_EQ(report.documents, 2u);  // the empty document stays empty (dropped), without a lone BOS
  EXPECT_EQ(shard_tokens(options.out + "/shard-00000.h5"),
            (std::vector<uint32_t>{262, 258, 'o', 262, 259, 260, 'l', 'd'}));
  options.tokenizer = tmp.path("gpt2.json");
  options.out = tmp.path("out2");
  const std::string refused = error_message([&] { prepare_dataset(options); });  // "" where accepted
  EXPECT_NE(refused.find("gpt2.json defines no BOS token"), std::string::npos) << refused;
}

TEST(IoTokenizer, ValidateChecksTheRecordedTokenizer) {
  ScratchDir tmp;
  write_file(tmp.path("tok.json"), tiny_bpe_tokenizer().dump());
  write_file(tmp.path("in.jsonl"), "{\"text\": \"hello\"}\n{\"text\": \"world\"}\n");
  const PrepOptions options = jsonl_prep(tmp, "tok.json", "out");
  prepare_dataset(options);
  DatasetIndex index = read_index_file(options.out);
  index.tokenizer_data.resize(index.tokenizer_data.size() / 2);  // a truncated file
  write_index(options.out + "/index.h5", index);
  EXPECT_TRUE(any_contains(validate_dataset(options.out), "tokenizer_data: not valid JSON"));
  index = read_index_file(options.out);
  index.tokenizer_data = tiny_bpe_tokenizer().dump();
  index.eos_id = 5;
  write_index(options.out + "/index.h5", index);
  EXPECT_TRUE(any_contains(validate_dataset(options.out), "eos_id is 5 but the recorded tokenizer's is 261"));
  index.eos_id = 261;
  index.tokenizer_data.clear();
  write_index(options.out + "/index.h5", index);
  EXPECT_TRUE(any_contains(validate_dataset(options.out), "tokenizer is 'hf-bpe' but tokenizer_data is missing"));
}

}  // namespace
}  // namespace kilter::io
