// Device discovery, below everything that uses a GPU (the CUDA model, the NCCL communicator, the
// one-GPU-per-rank check): whether a device is usable, which one this process uses, and what it
// is. Plain C++ on purpose: callers without the CUDA headers include it. Implementation:
// io/base/cuda_device.cu (with the compute stream of io/base/cuda_common.h). The namespace is
// the CUDA backend's, whose code it serves.
#pragma once
#include <cstdint>
#include <string>

namespace kilter::backend {

// cudaGetDeviceCount > 0. False (never an exception) when there is no driver, the driver is
// older than the runtime ("driver insufficient"), or no device is visible.
bool cuda_device_present();
// Why no device is usable ("" when one is): cudaGetErrorString of the failed query, or
// "no CUDA device visible".
std::string cuda_device_absent_reason();

// The device this process uses: local rank (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID,
// MPI_LOCALRANKID, MV2_COMM_WORLD_LOCAL_RANK, PMI_LOCAL_RANK, first one set; else 0) modulo
// the number of visible devices. Selected once per process; every CUDA entry point of kilter
// (the model, the NCCL communicator) makes it current on its calling thread.
int cuda_device_index();
// That device as the other ranks may compare it: `id` equal on two ranks means one physical GPU,
// on any host (the GPU's UUID; the host and PCI bus id where the driver gives no UUID); `label`
// names it in messages: "cuda device 0 (NVIDIA H100 80GB HBM3, PCI 0000:1b:00.0, GPU-8f3c...)".
struct CudaDeviceIdentity {
  std::string id;
  std::string label;
};
CudaDeviceIdentity cuda_device_identity();
// That device's free and total memory (cudaMemGetInfo, which makes the context first). False,
// never an exception, when no device is usable.
bool cuda_device_memory(uint64_t* free_bytes, uint64_t* total_bytes);

}  // namespace kilter::backend
