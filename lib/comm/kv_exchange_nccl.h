// The K/V exchange of cut pieces on GPUs: the NCCL twin of kv_exchange_mpi.h for the
// CUDA backend. Device buffers; per layer and direction the sends and receives of one
// micro-batch go in one ncclGroupStart/End on a stream of the exchange's own, ordered after the
// model's compute stream by events; the k|v columns are packed with cudaMemcpy2DAsync and the
// received dK/dV added into dqkv by a kernel on the compute stream, in peer order. Every wait
// polls its event and ncclCommGetAsyncError, bounded by comm.timeout_s (on timeout the NCCL
// communicator is aborted and a kilter::Error names the ranks, layer, step and piece).
// UNTESTED on a GPU so far (docs/gpu.md); compiled with -DENABLE_CUDA=ON -DENABLE_NCCL=ON.
#pragma once
#include <mpi.h>

#include <memory>

#include "lib/comm/kv_schedule.h"

namespace kilter::comm {

// The NCCL communicator and stream every micro-batch's exchange uses (one per run).
class NcclKvChannel;

// Collective over `comm`: rank 0 makes the ncclUniqueId and MPI_Bcast's it.
std::shared_ptr<NcclKvChannel> make_nccl_kv_channel(MPI_Comm comm, double timeout_s);

// One micro-batch's exchange on `channel` (pointers given to it are device pointers on the CUDA
// model's device, used on its compute stream).
std::unique_ptr<CutExchange> make_nccl_kv_exchange(std::shared_ptr<NcclKvChannel> channel, KvSchedule schedule,
                                                   const KvExchangeOptions& opts);

}  // namespace kilter::comm
