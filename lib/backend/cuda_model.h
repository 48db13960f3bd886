// The CUDA backend of the GPT-2 model (docs/design.md "Model"): the same Model interface as
// the CPU backend, with parameters, gradients, AdamW moments and activations in device memory.
// Plain C++ on purpose: lib/backend/select.cpp includes it under #ifdef KILTER_WITH_CUDA without
// the CUDA headers. Implementation: lib/backend/cuda_model.cu; the device it runs on:
// io/base/cuda_device.h.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "io/base/cuda_device.h"
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

}  // namespace kilter::backend
