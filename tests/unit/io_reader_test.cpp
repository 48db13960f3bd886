// The prefetching reader: random pieces return exactly the right tokens (EOS as the target
// after a document's last token), groups come back in order through a small ring, the
// allocator hook is used, and bad files are refused or surface as errors in next().
#include <gtest/gtest.h>

#include <atomic>
#include <random>

#include "io/reader.h"
#include "io_testing.h"

namespace kilter::io {
namespace {

using namespace kilter::io::testing;

// Reference: every document's tokens, read through HDF5.
std::vector<std::vector<uint32_t>> all_documents(const DatasetIndex& index) {
  std::vector<std::vector<uint32_t>> docs;
  for (const ShardInfo& shard : index.shards) {
    std::vector<uint32_t> tokens = shard_tokens(index.dir + "/" + shard.file);
    uint64_t position = 0;
    for (uint64_t d = 0; d < shard.num_docs; ++d) {
      uint32_t length = index.doc_lengths[shard.first_doc + d];
      docs.emplace_back(tokens.begin() + position, tokens.begin() + position + length);
      position += length;
    }
  }
  return docs;
}

std::vector<PieceRequest> random_group(const DatasetIndex& index, std::mt19937_64& rng, int pieces) {
  std::vector<PieceRequest> group;
  for (int i = 0; i < pieces; ++i) {
    uint64_t doc = rng() % index.num_docs();
    uint32_t length = index.doc_lengths[doc];
    uint32_t start = uint32_t(rng() % length);
    uint32_t len = 1 + uint32_t(rng() % (length - start));
    if (rng() % 3 == 0) { start = 0; len = length; }  // whole documents end with EOS
    group.push_back({doc, start, len});
  }
  return group;
}

void expect_group_correct(const ReadyGroup& ready, const std::vector<std::vector<uint32_t>>& docs,
                          uint32_t eos) {
  ASSERT_EQ(ready.offsets.size(), ready.pieces.size());
  for (size_t i = 0; i < ready.pieces.size(); ++i) {
    const PieceRequest& p = ready.pieces[i];
    const std::vector<uint32_t>& doc = docs[p.doc];
    const int32_t* got = ready.tokens + ready.offsets[i];
    for (uint32_t t = 0; t <= p.len; ++t) {
      uint64_t position = uint64_t(p.start) + t;
      int32_t want = position < doc.size() ? int32_t(doc[position]) : int32_t(eos);
      ASSERT_EQ(got[t], want) << "piece " << i << " doc " << p.doc << " start " << p.start
                              << " len " << p.len << " token " << t;
    }
  }
}

TEST(IoReader, RandomPiecesAreExact) {
  ScratchDir tmp;
  DatasetIndex index = load_index(make_synth(tmp.path("d"), 400, 4, 1000, "lognormal:4,1.2,3000"));
  auto docs = all_documents(index);
  ReaderOptions options;
  options.prefetch = 2;
  options.threads = 3;
  PrefetchReader reader(index, index.dir, options);
  std::mt19937_64 rng(3);
  std::vector<std::vector<PieceRequest>> sent;
  for (int g = 0; g < 5; ++g) {  // more groups than the ring holds: they wait for slots
    sent.push_back(random_group(index, rng, 1 + int(rng() % 200)));
    EXPECT_EQ(reader.enqueue(sent.back()), uint64_t(g));
  }
  EXPECT_EQ(reader.queued(), 5u);
  for (int round = 0; round < 40; ++round) {
    const ReadyGroup& ready = reader.next();
    EXPECT_EQ(ready.ticket, uint64_t(round));
    ASSERT_EQ(ready.pieces.size(), sent[round].size());
    expect_group_correct(ready, docs, index.eos_id);
    EXPECT_GE(ready.wait_seconds, 0.0);
    sent.push_back(random_group(index, rng, 1 + int(rng() % 200)));
    reader.enqueue(sent.back());
  }
}

TEST(IoReader, DocumentEndsGetEosTargets) {
  ScratchDir tmp;
  DatasetIndex index = load_index(make_synth(tmp.path("d"), 20, 1, 300, "uniform:5,9"));
  auto docs = all_documents(index);
  PrefetchReader reader(index, index.dir, ReaderOptions{});
  uint32_t length = index.doc_lengths[7];
  // The full document, its last token alone, and a piece that stops one short of the end.
  reader.enqueue({{7, 0, length}, {7, length - 1, 1}, {7, 0, length - 1}});
  const ReadyGroup& ready = reader.next();
  EXPECT_EQ(ready.tokens[ready.offsets[0] + length], 299);  // eos_id = vocab - 1
  EXPECT_EQ(ready.tokens[ready.offsets[1]], int32_t(docs[7][length - 1]));
  EXPECT_EQ(ready.tokens[ready.offsets[1] + 1], 299);
  EXPECT_EQ(ready.tokens[ready.offsets[2] + length - 1], int32_t(docs[7][length - 1]));
  expect_group_correct(ready, docs, index.eos_id);
}

TEST(IoReader, Uint32TokensAndAllocatorHook) {
  ScratchDir tmp;
  DatasetIndex index = load_index(make_synth(tmp.path("d"), 60, 2, 100000, "uniform:1,500"));
  auto docs = all_documents(index);
  std::atomic<int> allocations{0}, releases{0};
  ReaderOptions options;
  options.alloc = [&](size_t bytes) { ++allocations; return std::malloc(bytes); };
  options.release = [&](void* p) { ++releases; std::free(p); };
  {
    PrefetchReader reader(index, index.dir, options);
    std::mt19937_64 rng(9);
    for (int g = 0; g < 10; ++g) {
      reader.enqueue(random_group(index, rng, 50));
      expect_group_correct(reader.next(), docs, index.eos_id);
    }
  }
  EXPECT_GE(allocations.load(), 1);
  EXPECT_EQ(allocations.load(), releases.load());
}

TEST(IoReader, StagedCopyDirectoryIsUsed) {
  ScratchDir tmp;
  DatasetIndex index = load_index(make_synth(tmp.path("d"), 30, 2));
  auto docs = all_documents(index);
  fs::copy(tmp.path("d"), tmp.path("copy"));
  fs::remove_all(tmp.path("d"));  // only the copy exists now
  PrefetchReader reader(index, tmp.path("copy"), ReaderOptions{});
  reader.enqueue({{0, 0, index.doc_lengths[0]}, {29, 0, index.doc_lengths[29]}});
  expect_group_correct(reader.next(), docs, index.eos_id);
}

TEST(IoReader, BadRequestsAreRefused) {
  ScratchDir tmp;
  DatasetIndex index = load_index(make_synth(tmp.path("d"), 10, 1));
  PrefetchReader reader(index, index.dir, ReaderOptions{});
  expect_error([&] { reader.enqueue({{10, 0, 1}}); }, {"document 10 is out of range"});
  expect_error([&] { reader.enqueue({{0, index.doc_lengths[0], 1}}); }, {"does not lie inside document 0"});
  expect_error([&] { reader.next(); }, {"no group queued"});
  ReaderOptions zero;
  zero.prefetch = 0;
  expect_error([&] { PrefetchReader r(index, index.dir, zero); }, {"data.prefetch"});
}

TEST(IoReader, CorruptOffsetsAreRefusedAtConstruction) {
  ScratchDir tmp;
  DatasetIndex index = load_index(make_synth(tmp.path("d"), 50, 2));
  const std::string shard = index.dir + "/shard-00001.h5";
  uint64_t second = get_offset(shard, 2);
  set_offset(shard, 3, second - 1);
  expect_error([&] { PrefetchReader r(index, index.dir, ReaderOptions{}); },
               {"shard-00001.h5", "offsets decrease at entry 3"});
  set_offset(shard, 3, index.shards[1].num_tokens + 7);
  expect_error([&] { PrefetchReader r(index, index.dir, ReaderOptions{}); },
               {"shard-00001.h5", "offsets[3]", "out of range"});
}

TEST(IoReader, ShardTruncatedWhileReadingSurfacesInNext) {
  ScratchDir tmp;
  DatasetIndex index = load_index(make_synth(tmp.path("d"), 50, 1, 1000, "uniform:200,300"));
  PrefetchReader reader(index, index.dir, ReaderOptions{});
  const std::string shard = index.dir + "/shard-00000.h5";
  ShardLayout layout;
  ASSERT_TRUE(check_shard_header(index, index.dir, 0, &layout).empty());
  // Cut the file in the middle of /tokens after the reader checked it: the pread comes up short.
  fs::resize_file(shard, layout.tokens_file_offset + layout.num_tokens);
  reader.enqueue({{49, 0, index.doc_lengths[49]}});
  expect_error([&] { reader.next(); }, {"shard-00000.h5", "truncated"});
  // The reader goes on serving groups that can be read.
  reader.enqueue({{0, 0, 5}});
  EXPECT_EQ(reader.next().pieces.size(), 1u);
}

TEST(IoReader, OutOfVocabTokenSurfacesInNext) {
  ScratchDir tmp;
  DatasetIndex index = load_index(make_synth(tmp.path("d"), 10, 1));
  set_token(index.dir + "/shard-00000.h5", 0, 5000);
  PrefetchReader reader(index, index.dir, ReaderOptions{});
  reader.enqueue({{0, 0, 1}});
  expect_error([&] { reader.next(); }, {"shard-00000.h5", "token id 5000 is not below vocab_size 1000"});
}

}  // namespace
}  // namespace kilter::io
