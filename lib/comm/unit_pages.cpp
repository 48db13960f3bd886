// The page arithmetic of a sparsely backed device buffer (unit_pages.h).
#include "lib/comm/unit_pages.h"

#include <algorithm>

#include "io/base/error.h"

namespace kilter::comm {

size_t round_to_pages(size_t bytes, size_t page_bytes) {
  KILTER_CHECK(page_bytes > 0, "device buffer pages: the allocation granularity is 0");
  return (bytes + page_bytes - 1) / page_bytes * page_bytes;
}

PageSpan covering_pages(size_t offset, size_t count, size_t element_bytes, size_t page_bytes) {
  KILTER_CHECK(page_bytes > 0, "device buffer pages: the allocation granularity is 0");
  if (count == 0) return {};
  const size_t lo = offset * element_bytes, hi = (offset + count) * element_bytes;
  return {lo / page_bytes, (hi + page_bytes - 1) / page_bytes};
}

PageBudget unit_page_budget(const std::vector<PageSpan>& units, bool keep_all) {
  PageBudget b;
  if (units.empty()) return b;
  size_t block = 0, all = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    all += units[u].count();
    if (u > 0 && u + 1 < units.size()) block = std::max(block, units[u].count());
  }
  const size_t first = units.front().count(), last = units.size() > 1 ? units.back().count() : 0;
  b.params = keep_all ? all : std::min(all, first + last + 3 * block);
  b.grads = std::min(all, first + 2 * std::max(block, last));
  return b;
}

namespace {
// Appends page p to the runs, extending the last run where it is adjacent.
void add_page(std::vector<PageSpan>& runs, size_t p) {
  if (!runs.empty() && runs.back().end == p)
    ++runs.back().end;
  else
    runs.push_back({p, p + 1});
}
}  // namespace

std::vector<PageSpan> PageRefs::hold(PageSpan span) {
  KILTER_CHECK(span.first <= span.end && span.end <= refs_.size(),
               "device buffer pages: pages [" << span.first << ", " << span.end << ") pass the buffer's "
                                              << refs_.size() << " pages");
  std::vector<PageSpan> fresh;
  for (size_t p = span.first; p < span.end; ++p)
    if (refs_[p]++ == 0) {
      ++held_;
      add_page(fresh, p);
    }
  return fresh;
}

std::vector<PageSpan> PageRefs::drop(PageSpan span) {
  KILTER_CHECK(span.first <= span.end && span.end <= refs_.size(),
               "device buffer pages: pages [" << span.first << ", " << span.end << ") pass the buffer's "
                                              << refs_.size() << " pages");
  std::vector<PageSpan> freed;
  for (size_t p = span.first; p < span.end; ++p) {
    KILTER_CHECK(refs_[p] > 0, "device buffer pages: page " << p << " dropped but not held");
    if (--refs_[p] == 0) {
      --held_;
      add_page(freed, p);
    }
  }
  return freed;
}

}  // namespace kilter::comm
