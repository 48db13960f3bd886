// Copy-and-verify of a dataset into a node-local directory (`[data] stage_dir`): the io/ half of
// staging. lib/train/staging.h decides which rank of a node calls it; this part only copies.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/dataset.h"

namespace kilter::io {

struct StageReport {
  std::string dir;               // where the staged dataset now lives
  uint32_t shards_copied = 0;
  uint32_t shards_reused = 0;    // a verified copy was already there
  uint32_t shards_replaced = 0;  // a copy was there but did not verify: copied again
  uint64_t bytes_copied = 0;
  double seconds = 0;
};

// Makes `stage_dir` hold index.h5 and every shard of `index`, each verified against the index's
// content hash (all shards: every rank's reader and load_index() check every shard's header). An existing shard file whose hash matches is kept;
// any other is replaced (copied to a temporary name, verified, renamed). Throws naming the file
// when a source shard itself does not match the index, or on I/O errors (disk full, permissions).
StageReport stage_shards(const DatasetIndex& index, const std::string& stage_dir);

}  // namespace kilter::io
