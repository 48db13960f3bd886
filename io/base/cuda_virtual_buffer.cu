// A device buffer backed page by page (cuda_virtual_buffer.h).
#include <cuda.h>
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "io/base/cuda_common.h"
#include "io/base/cuda_virtual_buffer.h"
#include "io/base/error.h"

namespace kilter::backend {

namespace {

// The driver's virtual memory management, resolved once through the runtime.
struct DriverVmm {
  CUresult (*get_granularity)(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags) = nullptr;
  CUresult (*reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long) = nullptr;
  CUresult (*address_free)(CUdeviceptr, size_t) = nullptr;
  CUresult (*create)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long) = nullptr;
  CUresult (*release)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long) = nullptr;
  CUresult (*unmap)(CUdeviceptr, size_t) = nullptr;
  CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) = nullptr;
  CUresult (*error_string)(CUresult, const char**) = nullptr;
};

template <typename Fn>
void resolve(const char* name, Fn*& fn) {
  void* address = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  const cudaError_t status = cudaGetDriverEntryPointByVersion(name, &address, 12000, cudaEnableDefault, &found);
#else  // toolkits 12.0 to 12.4: the entry point of the runtime's own version
  const cudaError_t status = cudaGetDriverEntryPoint(name, &address, cudaEnableDefault, &found);
#endif
  KILTER_CHECK(status == cudaSuccess && found == cudaDriverEntryPointSuccess && address,
               "CUDA virtual memory (train.shard = parameters): the driver has no " << name << " ("
                   << cudaGetErrorString(status) << "); a driver for CUDA 12 or later is needed");
  fn = reinterpret_cast<Fn*>(address);
}

const DriverVmm& driver_vmm() {
  static const DriverVmm vmm = [] {
    DriverVmm d;
    resolve("cuMemGetAllocationGranularity", d.get_granularity);
    resolve("cuMemAddressReserve", d.reserve);
    resolve("cuMemAddressFree", d.address_free);
    resolve("cuMemCreate", d.create);
    resolve("cuMemRelease", d.release);
    resolve("cuMemMap", d.map);
    resolve("cuMemUnmap", d.unmap);
    resolve("cuMemSetAccess", d.set_access);
    resolve("cuGetErrorString", d.error_string);
    return d;
  }();
  return vmm;
}

std::string driver_error(CUresult result) {
  const char* text = nullptr;
  if (driver_vmm().error_string && driver_vmm().error_string(result, &text) == CUDA_SUCCESS && text) return text;
  return "CUresult " + std::to_string(int(result));
}

}  // namespace

#define KILTER_CU_CHECK(call, what)                                                                  \
  do {                                                                                               \
    const CUresult kilter_cu_status_ = (call);                                                       \
    KILTER_CHECK(kilter_cu_status_ == CUDA_SUCCESS,                                                  \
                 "CUDA virtual memory of the " << (what) << " on device " << impl_->device << ": "   \
                                               << #call << " failed: " << driver_error(kilter_cu_status_)); \
  } while (0)

struct VirtualDeviceBuffer::Impl {
  std::string what;
  int device = 0;
  size_t page = 0, pages = 0;
  CUdeviceptr base = 0;
  CUmemAllocationProp prop{};
  CUmemAccessDesc access{};
  CUmemGenericAllocationHandle scratch = 0;
  std::vector<CUmemGenericAllocationHandle> backing;  // per page: its own memory, or 0 (scratch)
  std::vector<CUmemGenericAllocationHandle> pool;
  size_t backed = 0;
  CUdeviceptr at(size_t p) const { return base + CUdeviceptr(p * page); }
};

VirtualDeviceBuffer::VirtualDeviceBuffer(size_t bytes, const char* what) : impl_(std::make_unique<Impl>()) {
  const DriverVmm& d = driver_vmm();
  Impl& m = *impl_;
  m.what = what;
  KILTER_CUDA_CHECK(cudaGetDevice(&m.device));
  m.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  m.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  m.prop.location.id = m.device;
  m.access.location = m.prop.location;
  m.access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  KILTER_CU_CHECK(d.get_granularity(&m.page, &m.prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED), m.what);
  KILTER_CHECK(m.page > 0, "CUDA virtual memory of the " << m.what << ": the device reports a granularity of 0");
  m.pages = (bytes + m.page - 1) / m.page;
  if (m.pages == 0) m.pages = 1;
  m.backing.assign(m.pages, 0);
  // One page more than the buffer: the scratch page's own address (scratch_page).
  KILTER_CU_CHECK(d.reserve(&m.base, (m.pages + 1) * m.page, m.page, 0, 0), m.what);
  try {
    KILTER_CU_CHECK(d.create(&m.scratch, m.page, &m.prop, 0), m.what);
    for (size_t p = 0; p <= m.pages; ++p) {
      KILTER_CU_CHECK(d.map(m.at(p), m.page, 0, m.scratch, 0), m.what);
      KILTER_CU_CHECK(d.set_access(m.at(p), m.page, &m.access, 1), m.what);
    }
    // Zero once: a whole-buffer read of what is not backed sees zeros until something writes there.
    KILTER_CUDA_CHECK(cudaMemset(reinterpret_cast<void*>(m.at(m.pages)), 0, m.page));
  } catch (...) {
    for (size_t p = 0; p <= m.pages; ++p) d.unmap(m.at(p), m.page);
    if (m.scratch) d.release(m.scratch);
    d.address_free(m.base, (m.pages + 1) * m.page);
    throw;
  }
}

VirtualDeviceBuffer::~VirtualDeviceBuffer() {
  const DriverVmm& d = driver_vmm();
  Impl& m = *impl_;
  cudaDeviceSynchronize();
  for (size_t p = 0; p <= m.pages; ++p) {
    d.unmap(m.at(p), m.page);
    if (p < m.pages && m.backing[p]) d.release(m.backing[p]);
  }
  for (CUmemGenericAllocationHandle h : m.pool) d.release(h);
  d.release(m.scratch);
  d.address_free(m.base, (m.pages + 1) * m.page);
}

void* VirtualDeviceBuffer::data() const { return reinterpret_cast<void*>(impl_->base); }
void* VirtualDeviceBuffer::scratch_page() const { return reinterpret_cast<void*>(impl_->at(impl_->pages)); }
size_t VirtualDeviceBuffer::page_bytes() const { return impl_->page; }
size_t VirtualDeviceBuffer::pages() const { return impl_->pages; }
size_t VirtualDeviceBuffer::backed_pages() const { return impl_->backed; }
size_t VirtualDeviceBuffer::pooled_pages() const { return impl_->pool.size(); }

void VirtualDeviceBuffer::back(size_t first, size_t end) {
  const DriverVmm& d = driver_vmm();
  Impl& m = *impl_;
  KILTER_CHECK(first <= end && end <= m.pages, "CUDA virtual memory of the " << m.what << ": pages [" << first << ", "
                                                   << end << ") pass its " << m.pages << " pages");
  for (size_t p = first; p < end; ++p) {
    KILTER_CHECK(m.backing[p] == 0, "CUDA virtual memory of the " << m.what << ": page " << p << " backed twice");
    CUmemGenericAllocationHandle h = 0;
    if (!m.pool.empty()) {
      h = m.pool.back();
      m.pool.pop_back();
    } else {
      const CUresult made = d.create(&h, m.page, &m.prop, 0);
      KILTER_CHECK(made == CUDA_SUCCESS, "CUDA virtual memory of the " << m.what << " on device " << m.device
                                             << ": no device memory for one more page (" << m.page << " bytes, "
                                             << m.backed << " backed): " << driver_error(made)
                                             << "; a larger train.shard_group or a smaller model fits");
    }
    KILTER_CU_CHECK(d.unmap(m.at(p), m.page), m.what);
    KILTER_CU_CHECK(d.map(m.at(p), m.page, 0, h, 0), m.what);
    KILTER_CU_CHECK(d.set_access(m.at(p), m.page, &m.access, 1), m.what);
    m.backing[p] = h;
    ++m.backed;
  }
}

void VirtualDeviceBuffer::unback(size_t first, size_t end) {
  const DriverVmm& d = driver_vmm();
  Impl& m = *impl_;
  KILTER_CHECK(first <= end && end <= m.pages, "CUDA virtual memory of the " << m.what << ": pages [" << first << ", "
                                                   << end << ") pass its " << m.pages << " pages");
  for (size_t p = first; p < end; ++p) {
    KILTER_CHECK(m.backing[p] != 0, "CUDA virtual memory of the " << m.what << ": page " << p << " not backed");
    KILTER_CU_CHECK(d.unmap(m.at(p), m.page), m.what);
    KILTER_CU_CHECK(d.map(m.at(p), m.page, 0, m.scratch, 0), m.what);
    KILTER_CU_CHECK(d.set_access(m.at(p), m.page, &m.access, 1), m.what);
    m.pool.push_back(m.backing[p]);
    m.backing[p] = 0;
    --m.backed;
  }
}

void VirtualDeviceBuffer::trim_pool(size_t keep) {
  while (impl_->pool.size() > keep) {
    driver_vmm().release(impl_->pool.back());
    impl_->pool.pop_back();
  }
}

}  // namespace kilter::backend
