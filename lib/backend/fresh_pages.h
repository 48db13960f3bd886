// An allocator of zeroed pages straight from the system (anonymous mmap) that leaves the
// elements uninitialized on construction: a vector sized with it is all zeros and holds no
// resident memory until written. The CPU backend keeps its parameter and gradient buffers in it,
// so that under sharded parameters (train.shard = parameters) a rank's resident memory is what it
// gathers and owns, never the whole buffers (lib/train/param_shards.h returns freed pages).
#pragma once
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>

namespace kilter::backend {

template <typename T>
struct FreshPagesAllocator {
  static_assert(std::is_trivial<T>::value, "fresh pages hold trivial values (zero bits)");
  using value_type = T;
  FreshPagesAllocator() = default;
  template <typename U>
  FreshPagesAllocator(const FreshPagesAllocator<U>&) {}

  T* allocate(size_t n) {
    if (n == 0) return nullptr;
    void* p = mmap(nullptr, n * sizeof(T), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t n) {
    if (p != nullptr) munmap(p, n * sizeof(T));
  }
  // Value-initialization is skipped: the pages are zero already.
  template <typename U>
  void construct(U* p) noexcept {
    (void)p;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
  bool operator==(const FreshPagesAllocator&) const { return true; }
  bool operator!=(const FreshPagesAllocator&) const { return false; }
};

// Zeroes [p, p + n) and returns its whole pages to the system: they read as zeros afterwards and
// count in no resident memory until written again (the distributed optimizer's unowned master).
template <typename T>
void return_pages(T* p, size_t n) {
  static_assert(std::is_trivial<T>::value, "fresh pages hold trivial values (zero bits)");
  if (n == 0) return;
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = uintptr_t(p), end = uintptr_t(p + n);
  const uintptr_t lo = (begin + page - 1) / page * page, hi = end / page * page;
  if (lo >= hi) {
    std::memset(static_cast<void*>(p), 0, n * sizeof(T));
    return;
  }
  std::memset(static_cast<void*>(p), 0, lo - begin);
  std::memset(reinterpret_cast<void*>(hi), 0, end - hi);
  if (madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED) != 0) std::memset(reinterpret_cast<void*>(lo), 0, hi - lo);
}

}  // namespace kilter::backend
