// Fully sharded parameters (train.shard = parameters: ZeRO-3 / FSDP) on host memory. Each rank of
// the shard group holds 1/G of every unit (the embeddings, each block, the final norm with an
// untied head: model.h ParamUnitHooks): its chunk of the parameters, of the gradients and (through
// the model's sharded optimizer) of the AdamW moments. Before a unit's forward, and again before
// its backward, its parameters are all-gathered inside the group; after use the other ranks'
// chunks are freed (their pages returned to the system). The embeddings are freed after the
// encoder's forward; a tied head gathers them again, and its part of their gradient is
// reduce-scattered as soon as its backward is done (head_done). As soon as a unit's backward ends,
// every micro-batch, its gradients are reduce-scattered inside the group into each rank's chunk,
// piece by piece (MPI's scratch a piece's, not a unit's), which accumulates over the step, and the
// rest of the unit's gradient is freed. The step's "reduction"
// is then done: this class is also the run's GradientReducer, whose owned() are the chunks, whose
// reduction is done but for groups smaller than the world (HSDP: finish() all-reduces each chunk
// across the groups), and whose gather does nothing (the parameters stay sharded: the next forward
// gathers them).
// Overlap (param_shards_comm.h runs the collectives on a communication thread): while a unit
// computes, the gather of the next one (the unit above in the forward, below in the backward) is
// in flight: at most one unit prefetched beyond those in use. A unit's reduce-scatter runs while
// the backward of the unit below computes; it is waited for before the next one starts (one at a
// time: its result buffer and its unit's whole gradient), before its unit's gradient is written
// again (the next micro-batch's need) and at the step's end (finish). The last block stays
// gathered from its forward through its backward, which follows it at once (keeping it costs
// what prefetching it again would). The time a rank blocks on a gather and on a reduce-scatter
// are the phases gather_wait and scatter_wait (diag/diagnostics.h).
// Every rank issues the same collectives in the same order (every rank runs the same number of
// micro-batches: train_step.cpp pads with empty ones), and every wait is a watchdog section.
#pragma once
#include <mpi.h>

#include <memory>
#include <vector>

#include "lib/comm/communicator.h"
#include "lib/comm/unit_chunks.h"
#include "lib/diag/diagnostics.h"
#include "lib/model/model.h"
#include "lib/train/param_shards_comm.h"
#include "lib/train/unit_shards.h"

namespace kilter::train {

class ParamShards final : public UnitShards {
 public:
  // group: the shard group; replicas: the ranks of the same index in the other groups
  // (MPI_COMM_NULL: the group is the world). Both are dup'd here. params and grads: the model's
  // padded buffers.
  ParamShards(MPI_Comm group, MPI_Comm replicas, const model::ParamLayout& layout, float* params, float* grads,
              bool reshard_after_forward);
  ~ParamShards() override;

  // UnitShards: waits for the reduce-scatter in flight (scatter_wait) and keeps its result:
  // before the step's reduction (finish() would otherwise wait for it inside the reduction's
  // watchdog section).
  void wait_reduce_scatter() override { finish_scatter(); }
  // UnitShards: frees the pages outside this rank's chunks. Completes every collective in flight
  // first.
  void release_all() override;

  // model::ParamUnitHooks
  bool need(int unit) override;
  void forward_done(int unit) override;
  void grads_final(int unit) override;
  void pass_done() override;
  void head_done() override;

  int num_units() const { return chunks_.num_units(); }

  // comm::GradientReducer (begin, ready and gather: UnitShards).
  // The last reduce-scatter is waited for, where wait_reduce_scatter did not; groups below the
  // world (HSDP): each chunk's step sum is all-reduced across the groups (the seconds returned).
  double finish() override;
  std::vector<comm::BufferRange> owned() const override;

 private:
  // Starts the unit's gather (its parameters arrive in the background).
  void start_gather(int unit);
  // The unit's parameters whole: waits for its gather in flight (or gathers it now). True where
  // they arrived just now.
  bool arrive(int unit);
  // Waits for the reduce-scatter in flight, if any, and keeps its result: this rank's chunk.
  void finish_scatter();
  // Blocks on a collective as the watchdog section `what`; the wait is `phase` in the diagnostics.
  void wait_collective(ShardCollectives::Ticket ticket, diag::Phase phase, int unit, const char* what);
  void release_params(int unit);
  // Returns the pages of the unit's part of buffer (params_ or grads_) outside this rank's chunk.
  void free_outside(float* buffer, int unit);
  // Starts the unit's reduce-scatter (in place: this rank's chunk receives the group's sum).
  void start_scatter(int unit);

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm replicas_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  comm::UnitChunks chunks_;  // each unit's chunks in the group
  // Per unit: each group rank's chunk (offset within the unit, count), as MPI counts.
  std::vector<std::vector<int>> counts_, displs_;
  std::vector<bool> gathered_;   // whole, or arriving (a gather in flight)
  std::vector<bool> arriving_;   // a gather in flight not yet waited for
  std::vector<ShardCollectives::Ticket> gather_ticket_;
  int scatter_unit_ = -1;        // the unit whose reduce-scatter is in flight (-1: none)
  ShardCollectives::Ticket scatter_ticket_ = 0;
  int last_needed_ = -1;         // the pass's direction: the forward needs units upwards
  bool descending_ = false;
  float* params_ = nullptr;
  float* grads_ = nullptr;
  bool reshard_after_forward_ = true;
  std::unique_ptr<ShardCollectives> collectives_;  // on comm_: made after it, gone before it
};

}  // namespace kilter::train
