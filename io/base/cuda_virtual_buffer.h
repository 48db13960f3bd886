// A device buffer whose virtual range is whole but whose physical memory is not: CUDA virtual
// memory management (cuMemAddressReserve, cuMemCreate, cuMemMap) reserves the range once, cut
// into pages of the device's allocation granularity, and backs only the pages asked for with
// memory of their own. Every other page is mapped onto one shared scratch page, zeroed at the
// start, so that a kernel over the whole buffer (an optimizer step, a norm, a memset) never
// faults: it reads what the scratch page holds and its writes there are lost. Physical pages
// given back are pooled and reused, so backing a unit again costs mappings, not allocations.
// The driver's functions come through the runtime (cudaGetDriverEntryPointByVersion): nothing
// links libcuda. Plain C++ header; io/base/cuda_virtual_buffer.cu holds the CUDA side. The
// namespace is the CUDA backend's, whose code it serves.
#pragma once
#include <cstddef>
#include <memory>

namespace kilter::backend {

class VirtualDeviceBuffer {
 public:
  // Reserves `bytes` (rounded up to whole pages) on the current device; `what` names the buffer
  // in errors. Throws kilter::Error naming the driver call and the bytes when the device has no
  // virtual memory management or the memory runs out.
  VirtualDeviceBuffer(size_t bytes, const char* what);
  ~VirtualDeviceBuffer();
  VirtualDeviceBuffer(const VirtualDeviceBuffer&) = delete;
  VirtualDeviceBuffer& operator=(const VirtualDeviceBuffer&) = delete;

  void* data() const;
  // The scratch page, also mapped alone past the buffer's end: zero it (cudaMemsetAsync) where a
  // whole-buffer write may have left something there.
  void* scratch_page() const;
  size_t page_bytes() const;  // the allocation granularity
  size_t pages() const;
  // Pages [first, end) get physical memory of their own (from the pool, else new); their
  // contents are undefined. Pages backed already are an error.
  void back(size_t first, size_t end);
  // Pages [first, end) go back to the scratch page, their memory to the pool. The caller makes
  // sure no queued device work still reads or writes them (unmapping is not stream-ordered).
  void unback(size_t first, size_t end);
  size_t backed_pages() const;
  size_t pooled_pages() const;  // physical pages held for reuse, backing nothing
  // Frees the pooled pages beyond `keep`.
  void trim_pool(size_t keep);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kilter::backend
