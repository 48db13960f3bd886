// Training samples (output.sample_every) under fully sharded parameters (train.shard =
// parameters), whichever memory holds the shards: the group's first rank generates, holding one
// unit of the weights at a time (a tied head's embeddings for the whole feed), and every rank of
// its group sends it its chunk of each unit, read through Model::copy_params_to_host (the host
// buffer on the cpu backend, the device's master on cuda). No rank holds the whole model: the
// root's buffer is address space whose pages are backed only while a unit is in use.
// A feed is one pass of the generator over the units: the root announces it (more = true) before
// unit 0 and the end (false) after the last feed; the others follow serve(), which sends units
// 0 .. last each feed and returns at the end. Every collective is a watchdog section.
#pragma once
#include <mpi.h>

#include <vector>

#include "lib/comm/unit_chunks.h"
#include "lib/model/model.h"
#include "lib/train/unit_shards.h"

namespace kilter::train {

class SampleFeed final : public model::ParamUnitHooks {
 public:
  // group: the shard group (dup'd here; collective over it); `shards` brings the watchdog and the
  // step its sections name.
  SampleFeed(MPI_Comm group, model::Model& model, const UnitShards& shards);
  ~SampleFeed() override;
  SampleFeed(const SampleFeed&) = delete;
  SampleFeed& operator=(const SampleFeed&) = delete;

  bool root() const { return chunks_.rank() == 0; }
  // The root's: the weights as the generator reads them (the layout's offsets), and the end of
  // the sample (the others' serve() returns).
  float* weights() { return weights_; }
  void end();
  // The others': sends this rank's chunks, feed after feed, until the root's end().
  void serve();

  // model::ParamUnitHooks, on the root: a unit is gathered when first read in a feed, its pages
  // returned when the generator is done with it.
  bool need(int unit) override;
  void forward_done(int unit) override;
  void grads_final(int) override {}
  void pass_done() override;

 private:
  void announce(bool more);
  void gather(int unit);

  comm::UnitChunks chunks_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  model::Model& model_;
  const UnitShards& shards_;
  float* weights_ = nullptr;  // the root's: padded floats of address space
  size_t weights_bytes_ = 0;
  std::vector<float> part_;   // this rank's part of the unit being sent
  std::vector<bool> held_;
};

}  // namespace kilter::train
