// Fully sharded parameters (train.shard = parameters: ZeRO-3 / FSDP) on a CUDA device over NCCL:
// the device twin of param_shards.h, with the same units, chunks (lib/comm/unit_chunks.h) and
// schedule. Each rank keeps its chunk of every unit; a unit's parameters are all-gathered inside
// the shard group before its forward (the next unit's gather queued while this one computes:
// prefetch) and again before its backward, and cleared outside the chunk after use; its gradients
// are reduce-scattered into the chunk as soon as its backward ends, every micro-batch. Groups below
// the world (HSDP) all-reduce each chunk across the groups in finish(). The collectives run on the
// NCCL communicators' own streams, ordered with the model's compute stream by events; the host
// waits only at each pass's end, bounded by comm.timeout_s and bracketed by the watchdog, and the
// watchdog's abort hooks end both communicators. The buffers' pages outside the chunks are backed
// while a unit is gathered (its gradients: from its backward to its reduce-scatter) and given
// back once the device has passed its release. Under bf16 storage the model asks for a working
// copy (ParamUnitHooks::working_copy_storage): then the units gather that bf16 copy alone (half
// the bytes; the model keeps the fp32 master of the chunks, a distributed optimizer's), no fp32
// parameter page is backed but the few the model widens from the copy (the norms), and the
// gradients stay fp32. Plain C++: run_setup.cpp includes it where NCCL
// is built (KILTER_WITH_NCCL); the class lives in param_shards_nccl.cu.
#pragma once
#include <mpi.h>

#include <memory>

#include "lib/model/layout.h"
#include "lib/train/unit_shards.h"

namespace kilter::train {

// group: the shard group; replicas: the ranks of the same index in the other groups
// (MPI_COMM_NULL: the group is the world). Collective over both (the NCCL communicators are made
// from them). The shards own the parameter and gradient buffers (layout.padded_size floats each,
// as virtual ranges backed only at this rank's chunks and the units in use:
// io/base/cuda_virtual_buffer.h), and the working copy where asked; the CUDA model takes them in
// set_param_units (params_storage, working_copy_storage).
std::unique_ptr<UnitShards> make_nccl_param_shards(MPI_Comm group, MPI_Comm replicas, const model::ParamLayout& layout,
                                                   bool reshard_after_forward, double timeout_s);

}  // namespace kilter::train
