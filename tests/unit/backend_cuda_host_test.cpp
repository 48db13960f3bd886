// The CUDA backend's host side, which needs no device (built only with CUDA; the CPU machine
// runs it): kilter does not link cuBLASLt, and the table of its functions loads on first use
// (lib/backend/cublaslt_loader.h); the device-memory query answers false without a device.
#include <gtest/gtest.h>

#include <dlfcn.h>

#include <cstdint>
#include <string>

#include "lib/backend/cublaslt_loader.h"
#include "lib/model/model.h"

namespace {

TEST(CublasLtLoader, NotLoadedUntilAskedThenEveryFunction) {
  // Nothing before the first call: the process did not map the library at start-up.
  const std::string soname = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
  EXPECT_EQ(dlopen(soname.c_str(), RTLD_NOW | RTLD_NOLOAD), nullptr) << soname << " was mapped before first use";
  const kilter::backend::CublasLt& lt = kilter::backend::cublaslt();
  for (const void* fn : {reinterpret_cast<const void*>(lt.Create), reinterpret_cast<const void*>(lt.Destroy),
                         reinterpret_cast<const void*>(lt.Matmul), reinterpret_cast<const void*>(lt.MatmulAlgoGetHeuristic),
                         reinterpret_cast<const void*>(lt.MatmulDescCreate), reinterpret_cast<const void*>(lt.MatmulDescDestroy),
                         reinterpret_cast<const void*>(lt.MatmulDescSetAttribute),
                         reinterpret_cast<const void*>(lt.MatmulPreferenceCreate),
                         reinterpret_cast<const void*>(lt.MatmulPreferenceDestroy),
                         reinterpret_cast<const void*>(lt.MatmulPreferenceSetAttribute),
                         reinterpret_cast<const void*>(lt.MatrixLayoutCreate),
                         reinterpret_cast<const void*>(lt.MatrixLayoutDestroy),
                         reinterpret_cast<const void*>(lt.MatrixLayoutSetAttribute)})
    EXPECT_NE(fn, nullptr);
  // Descriptors need no device: one round trip through the loaded library.
  cublasLtMatrixLayout_t layout = nullptr;
  ASSERT_EQ(lt.MatrixLayoutCreate(&layout, CUDA_R_32F, 4, 3, 4), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(lt.MatrixLayoutDestroy(layout), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(&kilter::backend::cublaslt(), &lt) << "loaded once";
}

TEST(CudaDeviceMemory, FalseWithoutADevice) {
  if (kilter::model::cuda_available()) GTEST_SKIP() << "a CUDA device is present";
  uint64_t free_bytes = 1, total_bytes = 1;
  EXPECT_FALSE(kilter::model::cuda_device_memory(&free_bytes, &total_bytes));
  EXPECT_EQ(free_bytes, 1u);
}

}  // namespace
