// The memory plan: what one rank of a run holds, figure by figure, from the config
// alone (no allocation), the node's total against the machine's memory (and, on the cuda
// backend, each rank's device figures against its device's memory), and the cheapest setting
// that makes a run fit. `kilter plan --memory` prints it; `kilter train` prints it and refuses a
// run that cannot fit before any rank allocates model memory.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <mpi.h>

#include <nlohmann/json.hpp>

#include "lib/core/config.h"

namespace kilter::train {

struct MemoryPlanInput {
  Config cfg;              // model.vocab_size resolved (> 0)
  int world_size = 1;
  int ranks_per_node = 1;  // ranks sharing one machine's memory
  bool resuming = false;   // the resume's read buffers count too
  std::string backend = "cpu";  // cpu | cuda (train.backend resolved)
  uint64_t device_bytes = 0;    // cuda: the memory one rank's device offers (0: unknown)
};

// Bytes of one rank (rank 0 when it differs: unsharded, it also holds the checkpoint snapshot).
struct MemoryPlan {
  MemoryPlanInput input;
  // train.shard in force: none | optimizer | parameters (none where P = 1), over shard groups of
  // shard_group ranks (train.shard_group resolved; 1 unsharded); sharded: a group of more than one.
  std::string shard = "none";
  int shard_group = 1;
  bool sharded = false;
  std::string grad_dtype = "fp32";  // the gradient accumulation buffer's (train.grad_dtype resolved)
  uint64_t num_params = 0, padded_params = 0;
  uint64_t unit_floats = 0;      // the largest unit parameters gathers at once (a block, the embeddings, the head)
  // cpu: host memory. cuda: the device's (and `engine`, the GEMM workspaces, only there).
  // The working weights (fp32, or bf16 where bf16 is stored) and, under bf16, the fp32 master
  // weights: both whole (none), the master 1/G (optimizer), both 1/G (parameters).
  uint64_t parameters = 0;
  uint64_t gathered = 0;         // parameters: the other ranks' parts of the units resident at once (the
                                 // embeddings, and two blocks or a block and the final unit; every unit
                                 // with train.reshard_after_forward = false)
  uint64_t gradients = 0;        // the gradient buffer: whole (none, optimizer); 1/G plus the units'
                                 // whole gradients resident at once (parameters)
  uint64_t optimizer = 0;        // AdamW m and v: all parameters, or this rank's 1/G
  uint64_t activations = 0;      // kept for backward + backward scratch, largest micro-batch
  uint64_t engine = 0;           // cuda: cuBLASLt's workspace, upload slots, operand copies
  uint64_t cudnn = 0;            // cuda: cuDNN SDPA's workspace and its rows outside the arena
  // cpu under optimizer: Open MPI's temporaries of the gradient reduce-scatters in flight (rank 0:
  // the root of each stage's reduction, the most; other: the most of any other rank)
  uint64_t comm_scratch_rank0 = 0, comm_scratch_other = 0;
  uint64_t checkpoint_rank0 = 0;  // rank 0's: the snapshot (params + moments), or sharded its pieces
  uint64_t checkpoint_other = 0;  // the other ranks' (sharded: their pieces; the resume's reads)
  uint64_t prefetch = 0;         // the reader's ring of micro-batches and the assembled batch
  uint64_t runtime = 0;          // MPI, oneDNN, the plan, code: measured, a constant
  uint64_t rank0_total = 0, other_total = 0;  // host bytes (cuda: checkpoint, prefetch, runtime)
  uint64_t node_total = 0;       // rank 0 + (ranks_per_node - 1) others
  uint64_t machine_bytes = 0;    // this machine's memory (0: unknown)
  uint64_t device_total = 0;     // cuda: one rank's device bytes (parameters ... engine)
  bool device_fits = true;       // cuda: device_total <= input.device_bytes (or unknown)
  bool fits = true;              // the node's host memory and (cuda) the device both hold it
  std::string advice;            // when it does not fit: the cheapest setting that does ("" if none)
};

// The plan for the backend's buffers (lib/backend/cpu_model.cpp allocates the CPU backend's;
// lib/backend/cuda_memory.h counts the CUDA backend's), with machine_bytes = this machine's
// memory (MemTotal, or a smaller cgroup limit).
MemoryPlan plan_memory(const MemoryPlanInput& in);
MemoryPlan plan_memory(const MemoryPlanInput& in, uint64_t machine_bytes);

// This machine's memory: min(MemTotal, the cgroup limit), or KILTER_TEST_NODE_MEMORY_BYTES when
// set (tests stand a small machine in). 0 when unknown.
uint64_t machine_memory_bytes();
// The memory this process's CUDA device has free now (after its context), or
// KILTER_TEST_DEVICE_MEMORY_BYTES when set. 0 when there is no usable device.
uint64_t device_memory_bytes();

// A table for people (one figure per line, GiB) and the same figures as JSON (bytes).
std::string format_memory_plan(const MemoryPlan& plan);
nlohmann::json memory_plan_json(const MemoryPlan& plan);

// The error a run that does not fit gets: the figure, the machine, the cheapest setting.
std::string memory_refusal(const MemoryPlan& plan);

// The start of `kilter train`, collective over `world`, before the model exists: every rank
// plans for its own machine (and, on cuda, its own device's free memory); when every rank's
// node and device can hold the run rank 0 prints the plan, else every rank throws the same
// kilter::Error (memory_refusal of the first rank that found it).
void check_memory_plan(MPI_Comm world, const Config& cfg, int ranks_per_node, bool resuming,
                       const std::string& backend);

}  // namespace kilter::train
