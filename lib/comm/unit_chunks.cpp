// The chunk layout of fully sharded parameters (unit_chunks.h).
#include "lib/comm/unit_chunks.h"

#include <algorithm>

#include "io/base/error.h"
#include "lib/model/model.h"

namespace kilter::comm {

size_t UnitChunk::lo(int rank) const { return std::min(count, size_t(rank) * chunk); }

size_t UnitChunk::part(int rank) const { return std::min(count, size_t(rank + 1) * chunk) - lo(rank); }

UnitChunks::UnitChunks(const std::vector<model::ParamRange>& units, int group_size, int rank)
    : group_size_(group_size), rank_(rank) {
  KILTER_CHECK(group_size >= 1 && rank >= 0 && rank < group_size,
               "parameter shard chunks: rank " << rank << " outside a group of " << group_size);
  for (const model::ParamRange& u : units) {
    UnitChunk c;
    c.offset = u.offset;
    c.count = u.count;
    c.chunk = ((u.count + size_t(group_size) - 1) / size_t(group_size) + 63) / 64 * 64;
    units_.push_back(c);
  }
}

UnitChunks UnitChunks::of(const model::ParamLayout& layout, int group_size, int rank) {
  return UnitChunks(model::param_unit_ranges(layout), group_size, rank);
}

size_t UnitChunks::staging_floats() const {
  size_t most = 0;
  for (const UnitChunk& c : units_) most = std::max(most, c.chunk * size_t(group_size_));
  return most;
}

size_t UnitChunks::largest_chunk() const {
  size_t most = 0;
  for (const UnitChunk& c : units_) most = std::max(most, c.chunk);
  return most;
}

std::vector<model::ParamRange> UnitChunks::owned() const {
  std::vector<model::ParamRange> ranges;
  for (const UnitChunk& c : units_)
    if (c.part(rank_) > 0) ranges.push_back({c.offset + c.lo(rank_), c.part(rank_)});
  return ranges;
}

std::vector<model::ParamRange> UnitChunks::outside(int u) const {
  const UnitChunk& c = units_[size_t(u)];
  const size_t lo = c.lo(rank_), end = lo + c.part(rank_);
  std::vector<model::ParamRange> ranges;
  if (lo > 0) ranges.push_back({c.offset, lo});
  if (end < c.count) ranges.push_back({c.offset + end, c.count - end});
  return ranges;
}

}  // namespace kilter::comm
