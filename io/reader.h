// The prefetching reader: serves a rank's document pieces by global id. HDF5 metadata is read
// once on the calling thread; token ranges are read with pread() at the /tokens dataset's file
// offset by worker threads into a ring of reusable buffers, filled ahead of the trainer.
// Owner: io.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "io/dataset.h"

namespace kilter::io {

// One piece of a document: input tokens [start, start+len) and their targets, the tokens
// [start+1, start+len] where the token after the document's last is eos_id.
struct PieceRequest {
  uint64_t doc = 0;
  uint32_t start = 0;
  uint32_t len = 0;
};

struct ReaderOptions {
  int prefetch = 4;   // groups (micro-batches) in flight ahead of the consumer
  int threads = 2;    // pread() workers
  // Buffer allocator for the ring (pinned host memory when CUDA is on); default: aligned new.
  std::function<void*(size_t)> alloc;
  std::function<void(void*)> release;
};

// A completed group: piece i's len+1 tokens (inputs then the final target) start at
// tokens + offsets[i]. Valid until the next call to PrefetchReader::next().
struct ReadyGroup {
  uint64_t ticket = 0;
  const int32_t* tokens = nullptr;
  std::vector<size_t> offsets;
  std::vector<PieceRequest> pieces;
  double wait_seconds = 0;   // time next() blocked for this group (data_wait)
};

class PrefetchReader {
 public:
  // `dir` may differ from index.dir (a staged node-local copy).
  PrefetchReader(const DatasetIndex& index, const std::string& dir, const ReaderOptions& opts);
  ~PrefetchReader();
  PrefetchReader(const PrefetchReader&) = delete;
  PrefetchReader& operator=(const PrefetchReader&) = delete;

  // Queue a group of pieces (one micro-batch); groups complete and are returned in order.
  uint64_t enqueue(std::vector<PieceRequest> pieces);
  // Blocks until the oldest queued group is read; rethrows a worker's read error.
  const ReadyGroup& next();
  size_t queued() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kilter::io
