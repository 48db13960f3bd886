// cuda_versions.h: versions from the libraries' own calls, files from /proc/self/maps.
#include "lib/backend/cuda_versions.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "io/error.h"
#include "lib/backend/cublaslt_loader.h"
#include "lib/backend/cuda_model.h"
#ifdef KILTER_WITH_CUDNN
#include <cudnn.h>
#endif

namespace kilter::backend {

namespace {

// Files mapped into this process whose name contains `stem` (libcudnn, libcublasLt, ...).
std::vector<std::string> mapped_files(const std::string& stem) {
  std::ifstream maps("/proc/self/maps");
  std::set<std::string> files;
  std::string line;
  while (std::getline(maps, line)) {
    const size_t slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    const size_t base = path.rfind('/');
    if (path.compare(base + 1, stem.size(), stem) == 0) files.insert(path);
  }
  return {files.begin(), files.end()};
}

// major.minor.patch of a library's integer version (major * 10000 + minor * 100 + patch).
std::string dotted(long code) {
  char text[32];
  std::snprintf(text, sizeof text, "%ld.%ld.%ld", code / 10000, (code / 100) % 100, code % 100);
  return text;
}

// A symbol of an already mapped library (the first mapped file named `stem`).
void* mapped_symbol(const std::string& stem, const char* symbol) {
  for (const std::string& file : mapped_files(stem)) {
    void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (handle == nullptr) continue;
    void* found = dlsym(handle, symbol);
    dlclose(handle);
    if (found != nullptr) return found;
  }
  return nullptr;
}

std::string runtime_version() {
  int version = 0;
  if (cudaRuntimeGetVersion(&version) != cudaSuccess) {
    cudaGetLastError();
    return "none";
  }
  return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
}

std::string cublaslt_version(bool load) {
  if (load) {
    try {
      cublaslt();
    } catch (const Error&) {
      return "none";
    }
  }
  using GetVersion = size_t (*)();
  auto get = reinterpret_cast<GetVersion>(mapped_symbol("libcublasLt", "cublasLtGetVersion"));
  return get != nullptr ? dotted(static_cast<long>(get())) : "none";
}

std::string nccl_version(bool load) {
  if (load) dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);  // kept open: its files stay mapped
  using GetVersion = int (*)(int*);
  auto get = reinterpret_cast<GetVersion>(mapped_symbol("libnccl", "ncclGetVersion"));
  int code = 0;
  if (get == nullptr || get(&code) != 0) return "none";
  return dotted(code);
}

// cuDNN 9 opens its sub-libraries (graph, engines, heuristics) on first use: a handle loads them.
void open_cudnn_sublibraries() {
#ifdef KILTER_WITH_CUDNN
  if (!cuda_device_present()) return;
  try {
    cuda_device_index();
  } catch (const Error&) {
    return;
  }
  cudnnHandle_t handle = nullptr;
  if (cudnnCreate(&handle) == CUDNN_STATUS_SUCCESS) cudnnDestroy(handle);
#endif
}

}  // namespace

std::string cuda_driver_version() {
  int api = 0;
  if (cudaDriverGetVersion(&api) != cudaSuccess || api == 0) {
    cudaGetLastError();
    return "none";
  }
  std::string module = "unknown";
  std::ifstream proc("/proc/driver/nvidia/version");
  std::string line;
  if (std::getline(proc, line)) {
    // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 ..."
    std::istringstream words(line.substr(line.find("Module") == std::string::npos ? 0 : line.find("Module") + 6));
    words >> module;
  }
  return module + " (CUDA " + std::to_string(api / 1000) + "." + std::to_string((api % 1000) / 10) + ")";
}

std::string cudnn_version() {
#ifdef KILTER_WITH_CUDNN
  return dotted(static_cast<long>(cudnnGetVersion()));
#else
  return "none";
#endif
}

std::string cuda_device_model() {
  if (!cuda_device_present()) return "none";
  try {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, cuda_device_index()) != cudaSuccess) {
      cudaGetLastError();
      return "none";
    }
    return std::string(prop.name) + " sm_" + std::to_string(prop.major) + std::to_string(prop.minor);
  } catch (const Error&) {
    return "none";
  }
}

std::vector<LoadedLibrary> cuda_loaded_libraries(bool load_all) {
  if (load_all) open_cudnn_sublibraries();
  std::vector<LoadedLibrary> libraries;
  libraries.push_back({"driver", cuda_driver_version(), mapped_files("libcuda.so")});
  libraries.push_back({"cuda runtime", runtime_version(), mapped_files("libcudart")});
  libraries.push_back({"cudnn", cudnn_version(), mapped_files("libcudnn")});
  const std::string lt = cublaslt_version(load_all);
  libraries.push_back({"cublasLt", lt, mapped_files("libcublasLt")});
  const std::string nccl = nccl_version(load_all);
  libraries.push_back({"nccl", nccl, mapped_files("libnccl")});
  return libraries;
}

}  // namespace kilter::backend
