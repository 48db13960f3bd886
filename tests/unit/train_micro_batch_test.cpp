// The trainer's micro-batch assembly (lib/train/micro_batch.h): a packed plan micro-batch
// (padded_len 0) becomes one cu_seqlens segment per piece with no padding; a naive one
// (padded_len > 0) becomes segments of exactly padded_len computed positions; and the work
// recorded for calibration follows what is computed.
#include <gtest/gtest.h>

#include <vector>

#include "io/base/error.h"
#include "lib/train/micro_batch.h"

namespace kilter::train {
namespace {

// A reader group of pieces with the given lengths: len + 1 tokens each (inputs, then the target
// of the last input), token values 100*piece + position.
struct Group {
  std::vector<int32_t> tokens;
  io::ReadyGroup group;
  balance::MicroBatch mb;
  Group(const std::vector<uint32_t>& lengths, uint32_t padded_len) {
    std::vector<size_t> offsets;
    for (size_t p = 0; p < lengths.size(); ++p) {
      offsets.push_back(tokens.size());
      for (uint32_t t = 0; t <= lengths[p]; ++t) tokens.push_back(int32_t(100 * p + t));
      group.pieces.push_back({uint64_t(p), 0, lengths[p]});
      mb.pieces.push_back({uint64_t(p), 0, lengths[p]});
      mb.target_tokens += lengths[p];
    }
    group.tokens = tokens.data();
    group.offsets = offsets;
    mb.padded_len = padded_len;
  }
};

TEST(TrainMicroBatch, PackedPiecesAreConcatenatedWithoutPadding) {
  Group g({5, 1, 3}, 0);
  model::Batch batch;
  assemble_batch(g.group, g.mb, batch);
  EXPECT_EQ(batch.N, 9);
  EXPECT_EQ(batch.cu_seqlens, (std::vector<int32_t>{0, 5, 6, 9}));
  EXPECT_EQ(batch.num_targets, 9);
  EXPECT_EQ(batch.inputs, (std::vector<int32_t>{0, 1, 2, 3, 4, 100, 200, 201, 202}));
  EXPECT_EQ(batch.targets, (std::vector<int32_t>{1, 2, 3, 4, 5, 101, 201, 202, 203}));
  StepWork work;
  work.add(batch);
  EXPECT_EQ(work.tokens_computed, 9);
  EXPECT_EQ(work.attn_work, 25.0 + 1.0 + 9.0);
  EXPECT_EQ(work.micro_batches, 1);
}

TEST(TrainMicroBatch, NaivePiecesArePaddedAndThePaddingIsComputed) {
  Group g({5, 1, 3}, 5);
  model::Batch batch;
  batch.clear();
  batch.append_piece(g.tokens.data(), nullptr, 2);  // leftovers of an earlier use are dropped
  assemble_batch(g.group, g.mb, batch);
  EXPECT_EQ(batch.N, 15);
  EXPECT_EQ(batch.cu_seqlens, (std::vector<int32_t>{0, 5, 10, 15}));
  EXPECT_EQ(batch.num_targets, 9);
  EXPECT_EQ(batch.inputs, (std::vector<int32_t>{0, 1, 2, 3, 4, 100, 0, 0, 0, 0, 200, 201, 202, 0, 0}));
  EXPECT_EQ(batch.targets, (std::vector<int32_t>{1, 2, 3, 4, 5, 101, -1, -1, -1, -1, 201, 202, 203, -1, -1}));
  StepWork work;
  work.add(batch);
  work.add(batch);
  EXPECT_EQ(work.tokens_computed, 30);
  EXPECT_EQ(work.attn_work, 2 * 3 * 25.0);
  EXPECT_EQ(work.micro_batches, 2);
  // A piece longer than its naive row is a plan error, named.
  Group bad({6}, 5);
  EXPECT_THROW(assemble_batch(bad.group, bad.mb, batch), kilter::Error);
}

// A later part of a cut piece (issue 23) keeps its offset as pos_offset; a batch of whole pieces
// has none, also after a batch that had one.
TEST(TrainMicroBatch, PartsOfCutPiecesKeepTheirOffset) {
  Group g({5, 1, 3}, 0);
  g.mb.pieces[1].offset = 512;
  g.mb.pieces[1].start = 512;
  model::Batch batch;
  assemble_batch(g.group, g.mb, batch);
  EXPECT_EQ(batch.pos_offset, (std::vector<int32_t>{0, 512, 0}));
  EXPECT_EQ(batch.piece_offset(1), 512);
  EXPECT_EQ(batch.cu_seqlens, (std::vector<int32_t>{0, 5, 6, 9}));
  Group whole({5, 1, 3}, 0);
  assemble_batch(whole.group, whole.mb, batch);
  EXPECT_TRUE(batch.pos_offset.empty());
  EXPECT_EQ(batch.exchange, nullptr);
}

}  // namespace
}  // namespace kilter::train
