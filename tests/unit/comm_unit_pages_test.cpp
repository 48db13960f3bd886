// The page arithmetic of the sparsely backed device buffers under train.shard = parameters
// (lib/comm/unit_pages.h): the pages covering a range, the holders a page shared by a chunk and a
// unit has, and that a rank's chunks plus its units in use are what stays backed.
#include <gtest/gtest.h>

#include <vector>

#include "io/base/error.h"
#include "lib/comm/unit_chunks.h"
#include "lib/comm/unit_pages.h"
#include "lib/model/layout.h"
#include "lib/model/model.h"

namespace kilter::comm {
namespace {

constexpr size_t kPage = 2u << 20;  // a common granularity: 2 MiB

TEST(UnitPages, RoundsAndCovers) {
  EXPECT_EQ(round_to_pages(0, kPage), 0u);
  EXPECT_EQ(round_to_pages(1, kPage), kPage);
  EXPECT_EQ(round_to_pages(kPage, kPage), kPage);
  EXPECT_EQ(round_to_pages(kPage + 1, kPage), 2 * kPage);
  EXPECT_THROW(round_to_pages(5, 0), Error);
  const size_t floats_per_page = kPage / 4;
  EXPECT_EQ(covering_pages(0, 0, 4, kPage), PageSpan{});
  EXPECT_EQ(covering_pages(0, 1, 4, kPage), (PageSpan{0, 1}));
  EXPECT_EQ(covering_pages(0, floats_per_page, 4, kPage), (PageSpan{0, 1}));
  EXPECT_EQ(covering_pages(1, floats_per_page, 4, kPage), (PageSpan{0, 2}));
  EXPECT_EQ(covering_pages(floats_per_page, floats_per_page, 4, kPage), (PageSpan{1, 2}));
  EXPECT_EQ(covering_pages(floats_per_page - 1, 2, 4, kPage), (PageSpan{0, 2}));
  // bf16 elements: twice as many per page.
  EXPECT_EQ(covering_pages(floats_per_page, floats_per_page, 2, kPage), (PageSpan{0, 1}));
}

TEST(UnitPages, SharedPagesStayUntilTheLastHolderDrops) {
  PageRefs refs(10);
  EXPECT_EQ(refs.hold({2, 5}), (std::vector<PageSpan>{{2, 5}}));
  EXPECT_EQ(refs.held(), 3u);
  // Overlapping on page 4: only 5..7 are new.
  EXPECT_EQ(refs.hold({4, 7}), (std::vector<PageSpan>{{5, 7}}));
  EXPECT_EQ(refs.held(), 5u);
  // A hold over held and free pages gives the free runs apart.
  EXPECT_EQ(refs.hold({0, 9}), (std::vector<PageSpan>{{0, 2}, {7, 9}}));
  EXPECT_EQ(refs.drop({0, 9}), (std::vector<PageSpan>{{0, 2}, {7, 9}}));
  EXPECT_EQ(refs.drop({2, 5}), (std::vector<PageSpan>{{2, 4}}));  // page 4 still held
  EXPECT_EQ(refs.held(), 3u);
  EXPECT_EQ(refs.drop({4, 7}), (std::vector<PageSpan>{{4, 7}}));
  EXPECT_EQ(refs.held(), 0u);
  EXPECT_THROW(refs.drop({1, 2}), Error);   // not held
  EXPECT_THROW(refs.hold({8, 11}), Error);  // past the end
}

TEST(UnitPages, BudgetHoldsTheScheduleUnits) {
  // Embeddings of 7 pages, five blocks of 3 and 4, a final unit of 2.
  const std::vector<PageSpan> units{{0, 7}, {7, 10}, {10, 14}, {14, 17}, {17, 21}, {21, 24}, {24, 26}};
  const PageBudget b = unit_page_budget(units, false);
  EXPECT_EQ(b.params, 7u + 2u + 3u * 4u);
  EXPECT_EQ(b.grads, 7u + 2u * 4u);
  EXPECT_EQ(unit_page_budget(units, true).params, 26u) << "every unit kept";
  // Three blocks are all the blocks: never more than the buffer.
  const std::vector<PageSpan> few{{0, 7}, {7, 10}, {10, 14}, {14, 16}};
  EXPECT_EQ(unit_page_budget(few, false).params, 16u);
  // Never more than the whole buffer.
  const PageBudget small = unit_page_budget({{0, 1}, {1, 2}, {2, 3}}, false);
  EXPECT_EQ(small.params, 3u);
  EXPECT_EQ(small.grads, 3u);
  EXPECT_EQ(unit_page_budget({}, false).params, 0u);
}

TEST(UnitPages, ChunksAndOneUnitBackOnlyTheirPages) {
  // A 4-layer GPT-2 wide enough that a block spans several pages of a small granularity.
  const model::ModelSpec spec{4, 4, 256, 64, 1000};
  for (int group : {2, 4, 8}) {
    const model::ParamLayout layout = model::ParamLayout::build(spec, size_t(group) * 64);
    const size_t page = 64 * 1024;  // small pages so that the model spans many
    for (int rank = 0; rank < group; ++rank) {
      const UnitChunks chunks = UnitChunks::of(layout, group, rank);
      PageRefs refs(round_to_pages(layout.padded_size * 4, page) / page);
      size_t chunk_floats = 0;
      for (const model::ParamRange& r : chunks.owned()) {
        refs.hold(covering_pages(r.offset, r.count, 4, page));
        chunk_floats += r.count;
      }
      const size_t pinned = refs.held();
      // Each chunk costs at most its own pages plus one page at each end.
      EXPECT_LE(pinned * page, chunk_floats * 4 + 2 * page * chunks.owned().size()) << group << "/" << rank;
      EXPECT_LT(pinned, refs.pages()) << "group " << group << " rank " << rank << ": everything backed";
      for (int u = 0; u < chunks.num_units(); ++u) {
        const UnitChunk& c = chunks.unit(u);
        const PageSpan span = covering_pages(c.offset, c.count, 4, page);
        refs.hold(span);
        EXPECT_LE(refs.held(), pinned + span.count());
        EXPECT_GE(refs.held() * page, c.count * 4 - c.part(rank) * 4);
        refs.drop(span);
        EXPECT_EQ(refs.held(), pinned) << "unit " << u << ": dropping it gives back exactly its extra pages";
      }
    }
  }
}

}  // namespace
}  // namespace kilter::comm
