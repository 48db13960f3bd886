// The CUDA libraries a process loaded, their versions and the files they came from: the driver,
// the CUDA runtime, cuDNN (its front library and the sub-libraries it opened), cuBLASLt and NCCL.
// What an engine probe's verdict is valid for (engine_probe.h: device, driver, cuDNN), and what the
// device check prints first, so that a result names the library that produced it. Plain C++: the
// trainer includes it without the CUDA headers. Implementation: cuda_versions_cuda.cpp.
#pragma once
#include <string>
#include <vector>

namespace kilter::backend {

struct LoadedLibrary {
  std::string name;     // "driver", "cuda runtime", "cudnn", "cublasLt", "nccl"
  std::string version;  // "9.19.0"; "none" where it could not be opened
  std::vector<std::string> files;  // the mapped files of that library (/proc/self/maps)
};

// load_all: open what kilter opens lazily first (cuBLASLt through its loader, NCCL by its soname,
// cuDNN's sub-libraries through a handle where a device is usable). Never throws.
std::vector<LoadedLibrary> cuda_loaded_libraries(bool load_all);

// The kernel driver's version ("580.65.06", from /proc/driver/nvidia/version) and the CUDA
// version it supports ("13.0"), "none" without a driver.
std::string cuda_driver_version();
// cudnnGetVersion() as "9.19.0"; "none" in a build without cuDNN.
std::string cudnn_version();
// The device this process uses, by model ("NVIDIA H100 80GB HBM3 sm_90"); "none" without one.
std::string cuda_device_model();

}  // namespace kilter::backend
