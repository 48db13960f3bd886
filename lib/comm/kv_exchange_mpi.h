// The K/V exchange of cut pieces over MPI (context parallelism; docs/comm.md, "K/V exchange of cut
// pieces"): MpiKvExchange, the model::KvExchange a CPU backend calls layer by layer
// (lib/model/kv_exchange.h) for one micro-batch (lib/comm/kv_schedule.h), on a communicator of
// its own, nonblocking, with every wait bounded by comm.timeout_s.
#pragma once
#include <mpi.h>

#include <memory>
#include <string>

#include "lib/comm/kv_schedule.h"

namespace kilter::comm {

// One micro-batch's exchange. Every call of kv_exchange.h's order posts or waits; the receives
// of a layer are posted together with its sends, so every rank posts before it waits. Messages
// go one per (peer, layer, direction), tagged (slot, layer, direction) within MPI_TAG_UB. The
// prefix K/V of every layer are kept from its forward_wait to its backward_wait_add (docs/comm.md
// gives the memory). A wait longer than timeout_s throws kilter::Error naming the ranks that did
// not deliver, the layer, the step and the pieces.
class MpiKvExchange final : public CutExchange {
 public:
  // `comm`: the exchange's own communicator (the trainer's duplicate of the training one),
  // ranks as in the schedule.
  MpiKvExchange(MPI_Comm comm, KvSchedule schedule, const KvExchangeOptions& opts);
  // Requests still open (an error unwinds) are cancelled where they are receives and otherwise
  // left to the abort that follows.
  ~MpiKvExchange() override;
  MpiKvExchange(const MpiKvExchange&) = delete;
  MpiKvExchange& operator=(const MpiKvExchange&) = delete;

  void forward_send(int layer, const float* qkv) override;
  void forward_wait(int layer) override;
  const float* prefix_kv(int layer, int piece) override;
  float* prefix_dkv(int layer, int piece) override;
  void backward_send(int layer) override;
  void backward_wait_add(int layer, float* dqkv) override;
  void progress() override;
  void finish() override;
  const KvSchedule& schedule() const override { return schedule_; }
  double wait_seconds() const override { return wait_seconds_; }

 private:
  struct Impl;
  KvSchedule schedule_;
  std::unique_ptr<Impl> impl_;
  double wait_seconds_ = 0;
};

// MPI tags of the exchange: (slot mod slots_per_tag_range, layer, direction) packed under
// MPI_TAG_UB of `comm`. Throws when 2 x n_layer tags do not fit.
int kv_exchange_tag(MPI_Comm comm, uint32_t slot, int layer, bool backward, int n_layer);

}  // namespace kilter::comm
