// Device discovery and the per-process CUDA context kilter shares between the model and the
// NCCL communicator: which device this rank uses, and the compute stream every model kernel runs
// on (the communicator orders its collectives after work queued there).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "io/base/cuda_common.h"
#include "io/base/cuda_device.h"

namespace kilter::backend {

const char* cublas_status_name(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED (no usable device or driver?)";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED (out of device memory)";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "unknown cuBLAS status";
  }
}

std::string cuda_device_absent_reason() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later queries start clean
    return cudaGetErrorString(status);
  }
  return count > 0 ? std::string() : std::string("no CUDA device visible");
}

bool cuda_device_present() { return cuda_device_absent_reason().empty(); }

namespace {

int local_rank_from_environment() {
  const char* names[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID",
                         "MV2_COMM_WORLD_LOCAL_RANK", "PMI_LOCAL_RANK"};
  for (const char* name : names) {
    const char* value = std::getenv(name);
    if (value != nullptr && *value != '\0') return std::atoi(value);
  }
  return 0;
}

std::once_flag g_device_once;
int g_device = -1;

}  // namespace

int cuda_device_index() {
  std::call_once(g_device_once, [] {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess || count == 0) {
      cudaGetLastError();
      return;  // g_device stays -1; the check below reports it on every call
    }
    g_device = local_rank_from_environment() % count;
  });
  KILTER_CHECK(g_device >= 0, "train.backend=cuda: no usable CUDA device (" << cuda_device_absent_reason() << ")");
  KILTER_CUDA_CHECK(cudaSetDevice(g_device));
  return g_device;
}

CudaDeviceIdentity cuda_device_identity() {
  const int device = cuda_device_index();
  cudaDeviceProp prop{};
  KILTER_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  char bus[32] = {0};
  if (cudaDeviceGetPCIBusId(bus, int(sizeof bus), device) != cudaSuccess) {
    cudaGetLastError();
    std::snprintf(bus, sizeof bus, "unknown");
  }
  // The UUID in nvidia-smi's form: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
  const auto* bytes = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
  bool any = false;
  std::string uuid = "GPU-";
  for (int i = 0; i < 16; ++i) {
    char hex[3];
    std::snprintf(hex, sizeof hex, "%02x", bytes[i]);
    uuid += hex;
    if (i == 3 || i == 5 || i == 7 || i == 9) uuid += '-';
    any |= bytes[i] != 0;
  }
  CudaDeviceIdentity identity;
  if (any) {
    identity.id = uuid;
  } else {  // a bus id is unique on its host only
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    identity.id = std::string(host) + "/" + bus;
  }
  identity.label = "cuda device " + std::to_string(device) + " (" + prop.name + ", PCI " + bus +
                   (any ? ", " + uuid : std::string()) + ")";
  return identity;
}

bool cuda_device_memory(uint64_t* free_bytes, uint64_t* total_bytes) {
  if (!cuda_device_present()) return false;
  size_t free_now = 0, total = 0;
  try {
    cuda_device_index();
  } catch (const Error&) {
    return false;
  }
  if (cudaMemGetInfo(&free_now, &total) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  *free_bytes = free_now;
  *total_bytes = total;
  return true;
}

cudaStream_t cuda_compute_stream() {
  static std::once_flag once;
  static cudaStream_t stream = nullptr;
  cuda_device_index();
  std::call_once(once, [] { KILTER_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)); });
  return stream;
}

}  // namespace kilter::backend
