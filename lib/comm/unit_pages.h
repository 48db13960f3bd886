// The page arithmetic of a sparsely backed device buffer (train.shard = parameters on the cuda
// backend): the buffer's virtual range is cut into pages of the device's allocation granularity,
// a page is backed by physical memory while anything holds it (this rank's chunks always, a
// gathered unit while it is in use), and two holders may share a page where a unit or a chunk
// does not start or end on a page boundary. PageRefs counts the holders of each page and says
// which pages start or stop being held; the device buffer (io/base/cuda_virtual_buffer.h) maps
// and unmaps those. No device: unit-tested alone.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace kilter::comm {

// Pages [first, end).
struct PageSpan {
  size_t first = 0, end = 0;
  size_t count() const { return end - first; }
  bool operator==(const PageSpan& o) const { return first == o.first && end == o.end; }
};

// `bytes` rounded up to a whole number of pages; throws kilter::Error unless page_bytes > 0.
size_t round_to_pages(size_t bytes, size_t page_bytes);
// The pages that cover elements [offset, offset + count) of `element_bytes` each (empty for count 0).
PageSpan covering_pages(size_t offset, size_t count, size_t element_bytes, size_t page_bytes);

// The pages a rank's device shards back beyond its chunks at most (the holders wait for a
// released unit's pages before they pass it), from each unit's covering pages in unit order (the
// embeddings, the blocks, the final unit): for the parameters and their working copy, the first
// and the last unit and three blocks (the one computing, the next one gathered, the one
// prefetched); for the gradients, the first unit (a tied head writes it first) and two others
// (the one in its backward, the one being reduce-scattered). Every unit where the forward keeps
// them all (keep_all: train.reshard_after_forward = false).
struct PageBudget {
  size_t params = 0, grads = 0;
};
PageBudget unit_page_budget(const std::vector<PageSpan>& units, bool keep_all);

class PageRefs {
 public:
  explicit PageRefs(size_t pages) : refs_(pages, 0) {}
  size_t pages() const { return refs_.size(); }
  // One more holder of every page in `span`: the runs of pages held by nobody before (to back).
  // Throws kilter::Error when the span passes the buffer's end.
  std::vector<PageSpan> hold(PageSpan span);
  // One holder fewer: the runs of pages held by nobody now (to give back). Throws kilter::Error
  // when a page in `span` was not held.
  std::vector<PageSpan> drop(PageSpan span);
  // Pages held by at least one holder.
  size_t held() const { return held_; }

 private:
  std::vector<uint32_t> refs_;
  size_t held_ = 0;
};

}  // namespace kilter::comm
