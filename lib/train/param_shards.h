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
// Every rank issues the same collectives in the same order (every rank runs the same number of
// micro-batches: train_step.cpp pads with empty ones); each is a watchdog section.
#pragma once
#include <mpi.h>

#include <memory>
#include <vector>

#include "lib/comm/communicator.h"
#include "lib/model/model.h"
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

  // UnitShards: frees the pages outside this rank's chunks.
  void release_all() override;

  // model::ParamUnitHooks
  bool need(int unit) override;
  void forward_done(int unit) override;
  void grads_final(int unit) override;
  void pass_done() override;
  void head_done() override;

  // Training samples (output.sample_every): group rank 0 generates, holding one unit at a time (a
  // tied head's embeddings for the whole feed); every other rank of its group sends it its chunk
  // of each unit. Before each feed the root announces it (more = true), and the end (false); the
  // others follow serve_sample(), which returns at the end. Each feed gathers units 0 .. last.
  int num_units() const { return int(units_.size()); }
  void announce_sample_feed(bool more);
  void gather_to_root(int unit);
  void release_at_root(int unit) { release_params(unit); }
  void serve_sample();

  // comm::GradientReducer: the reduction happened unit by unit.
  void begin() override {}
  void ready(size_t, size_t) override {}
  // Groups below the world (HSDP): each chunk's step sum is all-reduced across the groups.
  double finish() override;
  std::vector<comm::BufferRange> owned() const override;
  void gather(float*) override {}

 private:
  void release_params(int unit);
  void reduce_scatter_grads(int unit);

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm replicas_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::vector<model::ParamRange> units_;
  // Per unit: each group rank's chunk (offset within the buffer, count), as MPI counts.
  std::vector<std::vector<int>> counts_, displs_;
  std::vector<bool> gathered_;
  float* params_ = nullptr;
  float* grads_ = nullptr;
  size_t padded_ = 0;
  bool reshard_after_forward_ = true;
  std::vector<float> pack_;  // the reduce-scatter's input, a piece of every rank's chunk
  std::vector<int> piece_counts_;
};

}  // namespace kilter::train
