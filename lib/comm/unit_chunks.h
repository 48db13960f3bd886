// The chunk layout of fully sharded parameters (train.shard = parameters): how each parameter unit
// (model.h ParamUnitHooks: the embeddings, each block, the final norm with an untied head) is
// divided among the G ranks of a shard group. Every rank's chunk of a unit is a whole number of
// 64-float groups, `chunk` floats, the last ranks' shorter or empty where the unit ends; a
// collective that needs equal counts per rank (NCCL's all-gather and reduce-scatter) moves `chunk`
// floats per rank through a staging buffer of G * chunk floats. The host shards
// (lib/train/param_shards.cpp) cut the units with it too. No MPI, no device: unit-tested alone.
#pragma once
#include <cstddef>
#include <vector>

#include "lib/model/layout.h"

namespace kilter::comm {

struct UnitChunk {
  size_t offset = 0;  // the unit's first float in the padded buffer
  size_t count = 0;   // the unit's floats
  size_t chunk = 0;   // floats per rank (a multiple of 64): G * chunk >= count
  // Rank r's part of the unit: [offset + lo(r), offset + lo(r) + part(r)).
  size_t lo(int rank) const;
  size_t part(int rank) const;
};

class UnitChunks {
 public:
  UnitChunks() = default;  // no units
  // Throws kilter::Error unless 0 <= rank < group_size.
  UnitChunks(const std::vector<model::ParamRange>& units, int group_size, int rank);
  static UnitChunks of(const model::ParamLayout& layout, int group_size, int rank);

  int num_units() const { return int(units_.size()); }
  int group_size() const { return group_size_; }
  int rank() const { return rank_; }
  const UnitChunk& unit(int u) const { return units_[size_t(u)]; }
  // The largest G * chunk over the units: the staging buffer's floats.
  size_t staging_floats() const;
  // The largest chunk: a reduce-scatter's result.
  size_t largest_chunk() const;
  // This rank's non-empty parts of every unit, in unit order: what it owns (its gradient and
  // optimizer shard).
  std::vector<model::ParamRange> owned() const;
  // The ranges of unit u outside this rank's part (zero, one or two), which a release clears.
  std::vector<model::ParamRange> outside(int u) const;

 private:
  std::vector<UnitChunk> units_;
  int group_size_ = 1, rank_ = 0;
};

}  // namespace kilter::comm
