// The CUDA backend of the GPT-2 model (docs/design.md "Model"): the same Model interface as
// the CPU backend, with parameters, gradients, AdamW moments and activations in device memory.
// Plain C++ on purpose: lib/backend/select.cpp includes it under #ifdef KILTER_WITH_CUDA without
// the CUDA headers. Implementation: lib/backend/cuda_model.cu, cuda_device.cu.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "lib/model/model.h"

namespace kilter::backend {

// A CudaModel on this process's device (see cuda_device_index()). precision: "fp32" (IEEE fp32
// GEMMs) or "bf16" (bf16 tensor-core GEMMs with fp32 accumulation and fp32 master weights and
// moments; activations bf16 where train.bf16_storage's default, auto, passes its self-check,
// BackendOptions::bf16_storage). Throws kilter::Error naming train.precision for anything else,
// and naming the device when none is usable.
std::unique_ptr<model::Model> make_cuda_model(const model::ModelSpec& cfg, size_t pad_multiple,
                                              const std::string& precision);
// With every option: attention "auto" (cuDNN when built with it and usable here, else cuBLASLt,
// with a note on stderr), "cudnn" (an error naming train.attention when cuDNN cannot run) or
// "cublaslt"; cuda_graphs replays each micro-batch layout as CUDA graphs (layouts whose attention
// groups all run on cuBLASLt; the cuDNN API takes host-side lengths, which a graph would freeze).
std::unique_ptr<model::Model> make_cuda_model(const model::ModelSpec& cfg, size_t pad_multiple,
                                              const model::BackendOptions& options);

// cudaGetDeviceCount > 0. False (never an exception) when there is no driver, the driver is
// older than the runtime ("driver insufficient"), or no device is visible.
// The bf16-storage datapath's start-up self-check on this process's device (model.h:
// datapath_self_check): "" when it agrees with the CPU oracle, else why not.
std::string cuda_bf16_storage_self_check(const model::ModelSpec& cfg, const model::BackendOptions& options);
// cuDNN SDPA's self-check on this device (cuda_self_check.cu): a small model with the run's heads
// and head_dim on SDPA, on the datapath options.bf16_storage names (on or off), against the CPU
// oracle (on) or the same model on cuBLASLt attention (off). "" when it agrees, else why not.
std::string cuda_sdpa_self_check(const model::ModelSpec& cfg, const model::BackendOptions& options);
// cuDNN SDPA on later parts of cut pieces (cuda_sdpa_probe.cu): the engine alone on the run's heads
// and head_dim, whole pieces and later parts in one plan, against the CPU packed attention.
std::string cuda_sdpa_cut_self_check(const model::ModelSpec& cfg);

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
