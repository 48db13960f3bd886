// The sparsely backed device buffers of train.shard = parameters (io/base/cuda_virtual_buffer.h,
// the page arithmetic of lib/comm/unit_pages.h): a rank's chunk backed for good, a unit backed,
// written and read through a kernel, given back and backed again; the chunk keeps its values
// throughout, the pages outside read as the zeroed scratch page, and backing a unit takes device
// memory that giving it back (and trimming the pool) returns (cudaMemGetInfo).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "io/base/cuda_common.h"
#include "io/base/cuda_virtual_buffer.h"
#include "io/base/error.h"
#include "lib/comm/unit_pages.h"
#include "lib/model/cuda_ops.h"
#include "tests/gpu/gpu_test_util.h"

namespace kilter::gputest {
namespace {

namespace kc = model::cuda;

class VirtualBuffer : public DeviceTest {};

std::vector<float> read_back(const float* device, size_t n) {
  std::vector<float> host(n);
  KILTER_CUDA_CHECK(cudaMemcpy(host.data(), device, sizeof(float) * n, cudaMemcpyDeviceToHost));
  return host;
}

TEST_F(VirtualBuffer, UnitMappedWrittenReleasedChunkSurvives) {
  const size_t pages = 24;
  // A first buffer to learn the granularity, sized in its pages.
  backend::VirtualDeviceBuffer probe(1, "probe");
  const size_t page = probe.page_bytes();
  ASSERT_GT(page, 0u);
  std::printf("allocation granularity: %zu bytes\n", page);
  backend::VirtualDeviceBuffer params(pages * page, "test parameters");
  backend::VirtualDeviceBuffer copy(pages * page / 2, "test bf16 copy");
  ASSERT_EQ(params.pages(), pages);
  float* p = static_cast<float*>(params.data());
  const size_t floats = pages * page / 4, per_page = page / 4;
  comm::PageRefs refs(pages), copy_refs(copy.pages());

  // The chunk: floats [per_page / 2, 3 * per_page) (pages 0..2), backed for good.
  const size_t chunk_lo = per_page / 2, chunk_n = 3 * per_page - chunk_lo;
  for (const comm::PageSpan& run : refs.hold(comm::covering_pages(chunk_lo, chunk_n, 4, page)))
    params.back(run.first, run.end);
  EXPECT_EQ(params.backed_pages(), 3u);
  std::vector<float> chunk(chunk_n);
  for (size_t i = 0; i < chunk_n; ++i) chunk[i] = float(i % 1000) * 0.5f + 1.0f;
  KILTER_CUDA_CHECK(cudaMemcpy(p + chunk_lo, chunk.data(), sizeof(float) * chunk_n, cudaMemcpyHostToDevice));

  // The whole buffer reads without a fault: the chunk, and zeros (the scratch page) elsewhere.
  std::vector<float> whole = read_back(p, floats);
  for (size_t i = 0; i < floats; ++i) {
    const float want = i >= chunk_lo && i < chunk_lo + chunk_n ? chunk[i - chunk_lo] : 0.0f;
    ASSERT_EQ(whole[i], want) << "float " << i;
  }

  // A unit of 16 pages from mid page 2 (sharing page 2 with the chunk): backed, which takes memory.
  const size_t unit_lo = 2 * per_page + per_page / 4, unit_n = 16 * per_page;
  const comm::PageSpan unit = comm::covering_pages(unit_lo, unit_n, 4, page);
  EXPECT_EQ(unit, (comm::PageSpan{2, 19}));
  KILTER_CUDA_CHECK(cudaDeviceSynchronize());
  size_t free_before = 0, free_backed = 0, free_after = 0, total = 0;
  KILTER_CUDA_CHECK(cudaMemGetInfo(&free_before, &total));
  for (int round = 0; round < 3; ++round) {
    for (const comm::PageSpan& run : refs.hold(unit)) params.back(run.first, run.end);
    EXPECT_EQ(params.backed_pages(), 19u) << "page 2 is the chunk's already";
    for (const comm::PageSpan& run : copy_refs.hold(comm::covering_pages(unit_lo, unit_n, 2, page)))
      copy.back(run.first, run.end);
    if (round == 0) {
      KILTER_CUDA_CHECK(cudaMemGetInfo(&free_backed, &total));
      EXPECT_GE(free_before - free_backed, 16 * page) << "backing 16 pages must take device memory";
    }
    // Write the unit (outside the chunk), then a kernel reads it into the bf16 copy.
    std::vector<float> values(unit_n);
    for (size_t i = 0; i < unit_n; ++i) values[i] = float(int(i % 977) - 488) * 0.25f + float(round);
    KILTER_CUDA_CHECK(cudaMemcpy(p + unit_lo, values.data(), sizeof(float) * unit_n, cudaMemcpyHostToDevice));
    auto* c = static_cast<kc::bf16*>(copy.data());
    kc::round_params_bf16(c + unit_lo, p + unit_lo, unit_n, nullptr, 0, 0, nullptr);
    KILTER_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<kc::bf16> rounded(unit_n);
    KILTER_CUDA_CHECK(cudaMemcpy(rounded.data(), c + unit_lo, sizeof(kc::bf16) * unit_n, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < unit_n; i += 997)
      ASSERT_EQ(__bfloat162float(rounded[i]), values[i]) << "round " << round << " float " << i;  // exact in bf16
    // Released: its pages (not the chunk's page 2) go back to the pool.
    for (const comm::PageSpan& run : refs.drop(unit)) params.unback(run.first, run.end);
    for (const comm::PageSpan& run : copy_refs.drop(comm::covering_pages(unit_lo, unit_n, 2, page)))
      copy.unback(run.first, run.end);
    EXPECT_EQ(params.backed_pages(), 3u);
    EXPECT_EQ(params.pooled_pages(), 16u) << "the pages are kept for the next unit";
    // The chunk survived, the unit's range outside it reads the scratch page again (whatever the
    // writes left there is the same on every unbacked page).
    whole = read_back(p, floats);
    for (size_t i = 0; i < chunk_n; ++i) ASSERT_EQ(whole[chunk_lo + i], chunk[i]) << "chunk float " << i;
  }
  params.trim_pool(0);
  copy.trim_pool(0);
  KILTER_CUDA_CHECK(cudaDeviceSynchronize());
  KILTER_CUDA_CHECK(cudaMemGetInfo(&free_after, &total));
  EXPECT_GE(free_after, free_backed + 16 * page) << "the unit's pages were not given back";
  std::printf("free: %zu before, %zu backed, %zu after\n", free_before, free_backed, free_after);
}

TEST_F(VirtualBuffer, BackingTwiceOrPastTheEndIsAnError) {
  backend::VirtualDeviceBuffer b(1, "test");
  EXPECT_EQ(b.pages(), 1u);
  b.back(0, 1);
  EXPECT_THROW(b.back(0, 1), Error);
  EXPECT_THROW(b.back(1, 2), Error);
  b.unback(0, 1);
  EXPECT_THROW(b.unback(0, 1), Error);
}

}  // namespace
}  // namespace kilter::gputest
