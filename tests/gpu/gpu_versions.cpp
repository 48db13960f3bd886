// The CUDA libraries this binary loads on this machine, their versions and files: what the device
// check prints first (tests/gpu/device-check.sh), so that every result below it names the cuDNN,
// cuBLASLt, NCCL and driver that produced it. Runs without a device too (the driver shows as
// "none", cuDNN's sub-libraries stay unopened). Exit 0; 1 when cuDNN or cuBLASLt could not be
// loaded where a device is present.
#include <cstdio>
#include <string>

#include "lib/backend/cuda_model.h"
#include "lib/backend/cuda_versions.h"

int main() {
  namespace kb = kilter::backend;
  const bool device = kb::cuda_device_present();
  std::printf("device: %s\n", device ? kb::cuda_device_model().c_str() : ("none (" + kb::cuda_device_absent_reason() + ")").c_str());
  int missing = 0;
  for (const kb::LoadedLibrary& lib : kb::cuda_loaded_libraries(/*load_all=*/true)) {
    std::printf("%-13s %s\n", lib.name.c_str(), lib.version.c_str());
    for (const std::string& file : lib.files) std::printf("  %s\n", file.c_str());
    if (lib.files.empty()) std::printf("  (not loaded)\n");
    if (device && lib.version == "none" && (lib.name == "cudnn" || lib.name == "cublasLt")) ++missing;
  }
  return missing == 0 ? 0 : 1;
}
