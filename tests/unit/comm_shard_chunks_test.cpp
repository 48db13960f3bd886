// The chunk layout of fully sharded parameters (lib/comm/unit_chunks.h), which the NCCL shards'
// equal-count collectives and the ranks' owned ranges rest on: every unit tiled by the ranks'
// parts, in rank order, in whole 64-float groups; what a release clears is the rest of the unit.
#include <gtest/gtest.h>

#include <vector>

#include "io/base/error.h"
#include "lib/comm/unit_chunks.h"
#include "lib/model/layout.h"
#include "lib/model/model.h"

namespace kilter::comm {
namespace {

// A small GPT-2 (3 layers, 48 wide, vocabulary 101: units of uneven sizes), padded as a run of
// `world` ranks pads it.
model::ParamLayout small_layout(int world) {
  const model::ModelSpec spec{3, 4, 48, 32, 101};
  return model::ParamLayout::build(spec, size_t(world) * 64);
}

TEST(ShardChunks, RanksTileEveryUnitInOrder) {
  for (int group : {1, 2, 3, 4, 8}) {
    const model::ParamLayout layout = small_layout(group);
    const std::vector<model::ParamRange> units = model::param_unit_ranges(layout);
    ASSERT_EQ(units.size(), 3u + 2u);
    for (int rank = 0; rank < group; ++rank) {
      const UnitChunks chunks = UnitChunks::of(layout, group, rank);
      ASSERT_EQ(chunks.num_units(), int(units.size()));
      for (int u = 0; u < chunks.num_units(); ++u) {
        const UnitChunk& c = chunks.unit(u);
        EXPECT_EQ(c.offset, units[size_t(u)].offset);
        EXPECT_EQ(c.count, units[size_t(u)].count);
        EXPECT_EQ(c.chunk % 64, 0u) << "group " << group << " unit " << u;
        EXPECT_GE(c.chunk * size_t(group), c.count);
        // The smallest whole-group chunk that covers the unit.
        EXPECT_LT(c.chunk - 64, (c.count + size_t(group) - 1) / size_t(group)) << "group " << group << " unit " << u;
        size_t next = 0;
        for (int r = 0; r < group; ++r) {
          EXPECT_EQ(c.lo(r), next) << "group " << group << " unit " << u << " rank " << r;
          EXPECT_LE(c.part(r), c.chunk);
          next += c.part(r);
        }
        EXPECT_EQ(next, c.count);
        EXPECT_LE(c.chunk * size_t(group), chunks.staging_floats());
        EXPECT_LE(c.chunk, chunks.largest_chunk());
      }
    }
  }
}

TEST(ShardChunks, OwnedAndOutsideSplitEachUnit) {
  const int group = 3;
  const model::ParamLayout layout = small_layout(group);
  std::vector<int> owner(layout.padded_size, -1);
  for (int rank = 0; rank < group; ++rank) {
    const UnitChunks chunks = UnitChunks::of(layout, group, rank);
    for (const model::ParamRange& r : chunks.owned())
      for (size_t i = r.offset; i < r.offset + r.count; ++i) {
        EXPECT_EQ(owner[i], -1) << "float " << i << " owned twice";
        owner[i] = rank;
      }
    // Per unit: outside(u) and this rank's part cover the unit once each.
    for (int u = 0; u < chunks.num_units(); ++u) {
      const UnitChunk& c = chunks.unit(u);
      std::vector<int> seen(c.count, 0);
      for (const model::ParamRange& r : chunks.outside(u))
        for (size_t i = r.offset; i < r.offset + r.count; ++i) ++seen[i - c.offset];
      for (size_t i = c.lo(rank); i < c.lo(rank) + c.part(rank); ++i) ++seen[i];
      for (size_t i = 0; i < c.count; ++i) ASSERT_EQ(seen[i], 1) << "unit " << u << " float " << i;
    }
  }
  // The units cover the padded buffer; every float of it has exactly one owner.
  for (size_t i = 0; i < layout.padded_size; ++i) EXPECT_GE(owner[i], 0) << "float " << i << " owned by no rank";
}

TEST(ShardChunks, RefusesARankOutsideTheGroup) {
  const model::ParamLayout layout = small_layout(2);
  EXPECT_THROW(UnitChunks::of(layout, 2, 2), Error);
  EXPECT_THROW(UnitChunks::of(layout, 0, 0), Error);
}

}  // namespace
}  // namespace kilter::comm
