// The dataset format: synth round trip, load_index(), validate_dataset(), and each bad input of
// issue 3 (missing/truncated shard, offsets out of range or decreasing, wrong dtype or
// format_version, vocab/EOS mismatch, hash mismatch), each with an error naming file and problem.
#include <gtest/gtest.h>

#include <numeric>

#include "io/content_hash.h"
#include "io_testing.h"

namespace kilter::io {
namespace {

using namespace kilter::io::testing;

TEST(IoFormat, Fnv1aMatchesPublishedVectors) {
  // Test vectors of the FNV reference (isthe.com/chongo/tech/comp/fnv).
  Fnv1a64 empty;
  EXPECT_EQ(empty.hex(), "cbf29ce484222325");
  Fnv1a64 a;
  a.update("a", 1);
  EXPECT_EQ(a.hex(), "af63dc4c8601ec8c");
  Fnv1a64 foobar;
  foobar.update("foo", 3);
  foobar.update("bar", 3);  // streamed in two pieces
  EXPECT_EQ(foobar.hex(), "85944171f73967e8");
}

TEST(IoFormat, AssignShardsBalancesTokensAndKeepsOrder) {
  std::vector<uint32_t> lengths(1000);
  for (size_t i = 0; i < lengths.size(); ++i) lengths[i] = 1 + (i * 7919) % 200;
  std::vector<uint64_t> first = assign_shards(lengths, 7);
  ASSERT_EQ(first.size(), 8u);
  EXPECT_EQ(first.front(), 0u);
  EXPECT_EQ(first.back(), 1000u);
  uint64_t total = std::accumulate(lengths.begin(), lengths.end(), uint64_t(0));
  for (int s = 0; s < 7; ++s) {
    ASSERT_LT(first[s], first[s + 1]);
    uint64_t tokens = std::accumulate(lengths.begin() + first[s], lengths.begin() + first[s + 1], uint64_t(0));
    EXPECT_NEAR(double(tokens), total / 7.0, 200.0) << "shard " << s;  // within one document
  }
  // Every shard gets a document even when one document dominates.
  std::vector<uint32_t> skewed = {100000, 1, 1, 1};
  std::vector<uint64_t> f = assign_shards(skewed, 4);
  EXPECT_EQ(f, (std::vector<uint64_t>{0, 1, 2, 3, 4}));
  expect_error([&] { assign_shards(skewed, 5); }, {"--shards 5", "exceeds"});
}

TEST(IoFormat, SynthRoundTripAndValidate) {
  ScratchDir tmp;
  std::string dir = make_synth(tmp.path("d"), 500, 3);
  DatasetIndex index = load_index(dir);
  EXPECT_EQ(index.vocab_size, 1000u);
  EXPECT_EQ(index.eos_id, 999u);
  EXPECT_EQ(index.tokenizer, "synthetic");
  ASSERT_EQ(index.shards.size(), 3u);
  EXPECT_EQ(index.num_docs(), 500u);
  uint64_t docs = 0;
  for (uint32_t s = 0; s < 3; ++s) {
    EXPECT_EQ(index.shards[s].first_doc, docs);
    EXPECT_EQ(index.shards[s].file, shard_file_name(s));
    docs += index.shards[s].num_docs;
    EXPECT_EQ(shard_content_hash(dir + "/" + index.shards[s].file), index.shards[s].hash);
    // Tokens lie in [0, vocab-1): the EOS id is never stored.
    for (uint32_t t : shard_tokens(dir + "/" + index.shards[s].file)) ASSERT_LT(t, 999u);
  }
  EXPECT_EQ(index.shard_of(0), 0u);
  EXPECT_EQ(index.shard_of(index.shards[1].first_doc), 1u);
  EXPECT_EQ(index.shard_of(499), 2u);
  for (uint32_t length : index.doc_lengths) {
    EXPECT_GE(length, 1u);
    EXPECT_LE(length, 300u);
  }
  EXPECT_TRUE(validate_dataset(dir).empty()) << join(validate_dataset(dir));
}

TEST(IoFormat, SynthIsDeterministicFromTheSeed) {
  ScratchDir tmp;
  DatasetIndex a = load_index(make_synth(tmp.path("a"), 200, 2, 1000, "lognormal:4,1,500", 5));
  DatasetIndex b = load_index(make_synth(tmp.path("b"), 200, 2, 1000, "lognormal:4,1,500", 5));
  DatasetIndex c = load_index(make_synth(tmp.path("c"), 200, 2, 1000, "lognormal:4,1,500", 6));
  EXPECT_EQ(a.doc_lengths, b.doc_lengths);
  EXPECT_EQ(a.shards[0].hash, b.shards[0].hash);
  EXPECT_EQ(a.shards[1].hash, b.shards[1].hash);
  EXPECT_NE(a.shards[0].hash, c.shards[0].hash);
  for (uint32_t length : a.doc_lengths) EXPECT_LE(length, 500u);
}

TEST(IoFormat, LargeVocabStoresUint32) {
  ScratchDir tmp;
  std::string dir = make_synth(tmp.path("d"), 50, 1, 70000);
  ShardLayout layout;
  DatasetIndex index = load_index(dir);
  EXPECT_TRUE(check_shard_header(index, dir, 0, &layout).empty());
  EXPECT_EQ(layout.token_bytes, 4u);
  uint32_t largest = 0;
  for (uint32_t t : shard_tokens(dir + "/shard-00000.h5")) largest = std::max(largest, t);
  EXPECT_GT(largest, 65535u);  // 1 in 16 tokens is above 2^16 in expectation; 50+ docs hold many
  EXPECT_TRUE(validate_dataset(dir).empty());
  std::string small = make_synth(tmp.path("small"), 10, 1, 65535);
  EXPECT_TRUE(check_shard_header(load_index(small), small, 0, &layout).empty());
  EXPECT_EQ(layout.token_bytes, 2u);
}

TEST(IoFormat, BadLengthSpecsAreRefused) {
  expect_error([] { LengthDistribution::parse("gauss:1,2"); }, {"--lengths gauss:1,2"});
  expect_error([] { LengthDistribution::parse("uniform:0,5"); }, {"MIN"});
  expect_error([] { LengthDistribution::parse("lognormal:1"); }, {"lognormal:MU,SIGMA"});
  expect_error([] { LengthDistribution::parse("uniform:3,x"); }, {"'x' is not a number"});
}

class IoBadInput : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = make_synth(tmp_.path("d"), 120, 3); }
  std::string shard(uint32_t s) const { return dir_ + "/" + shard_file_name(s); }
  // load_index refuses the dataset with a message naming `file` and `problem`; validate agrees.
  void expect_refused(const std::string& file, const std::string& problem) {
    expect_error([&] { load_index(dir_); }, {file, problem});
    std::vector<std::string> problems = validate_dataset(dir_);
    EXPECT_TRUE(any_contains(problems, problem)) << join(problems);
    EXPECT_TRUE(any_contains(problems, file)) << join(problems);
  }
  ScratchDir tmp_;
  std::string dir_;
};

TEST_F(IoBadInput, MissingShard) {
  fs::remove(shard(1));
  expect_refused("shard-00001.h5", "shard file is missing");
}

TEST_F(IoBadInput, MissingIndex) {
  fs::remove(dir_ + "/index.h5");
  expect_error([&] { load_index(dir_); }, {"index.h5", "index file is missing"});
  EXPECT_FALSE(validate_dataset(dir_).empty());
}

TEST_F(IoBadInput, TruncatedShard) {
  fs::resize_file(shard(2), fs::file_size(shard(2)) - 100);
  // HDF5 itself notices the end-of-file mismatch; the message carries its text and the file.
  expect_refused("shard-00002.h5", "truncated");
}

TEST_F(IoBadInput, OffsetsOutOfRange) {
  DatasetIndex index = load_index(dir_);
  set_offset(shard(0), 5, index.shards[0].num_tokens + 10);
  std::vector<std::string> problems = validate_dataset(dir_);
  EXPECT_TRUE(any_contains(problems, "offsets[5]")) << join(problems);
  EXPECT_TRUE(any_contains(problems, "out of range")) << join(problems);
  EXPECT_TRUE(any_contains(problems, "shard-00000.h5")) << join(problems);
}

TEST_F(IoBadInput, OffsetsDecreasing) {
  uint64_t third = get_offset(shard(1), 3);
  set_offset(shard(1), 4, third - 1);
  std::vector<std::string> problems = validate_dataset(dir_);
  EXPECT_TRUE(any_contains(problems, "offsets decrease at entry 4")) << join(problems);
  EXPECT_TRUE(any_contains(problems, "shard-00001.h5")) << join(problems);
}

TEST_F(IoBadInput, WrongTokenDtype) {
  retype_tokens(shard(0), H5T_IEEE_F32LE);
  expect_refused("shard-00000.h5", "/tokens has type float32, expected uint16");
}

TEST_F(IoBadInput, BigEndianTokensAreRefused) {
  retype_tokens(shard(0), H5T_STD_U16BE);
  expect_refused("shard-00000.h5", "uint16 big-endian");
}

TEST_F(IoBadInput, ShardFormatVersion) {
  set_uint_attribute(shard(1), "format_version", 2);
  expect_refused("shard-00001.h5", "format_version is 2");
}

TEST_F(IoBadInput, IndexFormatVersion) {
  set_uint_attribute(dir_ + "/index.h5", "format_version", 7);
  expect_error([&] { load_index(dir_); }, {"index.h5", "format_version is 7"});
  EXPECT_TRUE(any_contains(validate_dataset(dir_), "format_version is 7"));
}

TEST_F(IoBadInput, VocabMismatch) {
  set_uint_attribute(shard(2), "vocab_size", 999);
  expect_refused("shard-00002.h5", "vocab_size is 999 but the index says 1000");
}

TEST_F(IoBadInput, EosMismatch) {
  set_uint_attribute(shard(0), "eos_id", 5);
  expect_refused("shard-00000.h5", "eos_id is 5 but the index says 999");
}

TEST_F(IoBadInput, ShardIndexMismatch) {
  set_uint_attribute(shard(1), "shard_index", 0);
  expect_refused("shard-00001.h5", "shard_index is 0 but the index says 1");
}

TEST_F(IoBadInput, HashMismatchIsFoundByValidate) {
  uint32_t original = shard_tokens(shard(1))[10];
  set_token(shard(1), 10, (original + 1) % 999);
  EXPECT_NO_THROW(load_index(dir_));  // load_index does not read tokens (cheap by design)
  std::vector<std::string> problems = validate_dataset(dir_);
  ASSERT_EQ(problems.size(), 1u) << join(problems);
  EXPECT_NE(problems[0].find("shard-00001.h5"), std::string::npos);
  EXPECT_NE(problems[0].find("does not match the index"), std::string::npos);
}

TEST_F(IoBadInput, TokenOutOfVocabIsFoundByValidate) {
  set_token(shard(0), 3, 1000);
  std::vector<std::string> problems = validate_dataset(dir_);
  EXPECT_TRUE(any_contains(problems, "not below vocab_size 1000 (first: tokens[3] = 1000)"))
      << join(problems);
}

TEST_F(IoBadInput, IndexCountsInconsistent) {
  // doc_lengths no longer add up to the shard's token count.
  {
    h5::Handle f = h5::open_file(dir_ + "/index.h5", true);
    h5::Handle ds = h5::open_dataset(f, "doc_lengths", "index.h5");
    uint32_t length = 0;
    h5::read_range(ds, H5T_NATIVE_UINT32, 0, 1, &length, "index.h5", "doc_lengths");
    length += 1;
    h5::write_range(ds, H5T_NATIVE_UINT32, 0, 1, &length, "index.h5", "doc_lengths");
  }
  expect_error([&] { load_index(dir_); }, {"index.h5", "shard 0: shard_num_tokens"});
}

// Found by fuzzing (issue 17): shard counts that wrap around 2^64 to the right total used to pass
// the sum check and then index doc_lengths far out of range.
TEST_F(IoBadInput, ShardDocCountsThatWrapAreRefused) {
  {
    h5::Handle f = h5::open_file(dir_ + "/index.h5", true);
    h5::Handle ds = h5::open_dataset(f, "shard_num_docs", "index.h5");
    uint64_t counts[3];
    h5::read_range(ds, H5T_NATIVE_UINT64, 0, 3, counts, "index.h5", "shard_num_docs");
    counts[1] += counts[0] + 1;  // counts[0] := 2^64 - 1 takes the other 1 + counts[0] back
    counts[0] = ~uint64_t(0);
    h5::write_range(ds, H5T_NATIVE_UINT64, 0, 3, counts, "index.h5", "shard_num_docs");
  }
  expect_refused("index.h5", "shard_num_docs add up to more than 120");
}

// Found by fuzzing (issue 17): h5py writes str attributes as variable-length UTF-8 strings, which
// the reader used to refuse ("no appropriate function for conversion path").
TEST_F(IoBadInput, VariableLengthUtf8StringAttributesAreRead) {
  for (const std::string file : {dir_ + "/index.h5", shard(0), shard(1), shard(2)}) {
    h5::Handle f = h5::open_file(file, true);
    ASSERT_GE(H5Adelete(f, "tokenizer"), 0);
    h5::Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(type, H5T_VARIABLE);
    H5Tset_cset(type, H5T_CSET_UTF8);
    h5::Handle space(H5Screate(H5S_SCALAR), H5Sclose);
    h5::Handle attr(H5Acreate2(f, "tokenizer", type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    const char* value = "synthetic";
    ASSERT_GE(H5Awrite(attr, type, &value), 0);
  }
  EXPECT_EQ(load_index(dir_).tokenizer, "synthetic");
  EXPECT_TRUE(validate_dataset(dir_).empty()) << join(validate_dataset(dir_));
}

}  // namespace
}  // namespace kilter::io
