// The collectives of sharded parameters (param_shards.h) in flight: the units' all-gathers and
// reduce-scatters inside the shard group, started in one order on every rank, completed while
// the rank computes. A communication thread runs them in start order (the same on every rank):
// a gather as MPI_Iallgatherv, tested every kPollInterval (Open MPI advances a nonblocking
// collective only inside MPI calls; polling keeps it moving without a core spinning in MPI, as
// the gradient reducer's polling thread does, lib/comm/gradient_reducer.cpp); a reduce-scatter as
// blocking MPI_Reduce_scatters, one the same in every run (Open MPI's MPI_Ireduce_scatter sums in
// another order on 3 ranks and more), piece by piece: `piece` floats of every rank's chunk packed
// at a time, so that MPI's scratch is a piece's (Open MPI's reduce-scatter of a whole unit takes
// a temporary of the whole unit, a large vocabulary's embeddings). Without
// MPI_THREAD_MULTIPLE there is no thread: wait() runs every collective started up to the one it
// waits for, in start order, blocking (the ranks' schedule is unchanged, only its overlap is lost).
#pragma once
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

namespace kilter::train {

class ShardCollectives {
 public:
  using Ticket = uint64_t;

  // comm: the shard group (not owned; it outlives this object); largest_chunk: the most floats of
  // one rank's chunk of a unit (the pieces are no larger).
  ShardCollectives(MPI_Comm comm, size_t largest_chunk);
  // Stops the thread. A collective still in flight (an error is unwinding: a rank is gone) is left
  // to the thread, detached, rather than waited for forever.
  ~ShardCollectives();
  ShardCollectives(const ShardCollectives&) = delete;
  ShardCollectives& operator=(const ShardCollectives&) = delete;

  // All-gathers buf[displs[r], + counts[r]) of every group rank r into every rank's buf (this
  // rank's own chunk in place). counts and displs stay valid until the gather is waited for.
  Ticket start_gather(float* buf, const std::vector<int>& counts, const std::vector<int>& displs, int unit);
  // Sums buf (every rank's chunk r at displs[r], counts[r] floats, in rank order) over the group,
  // in place: this rank's chunk receives the sum. counts and displs stay valid until it is waited for.
  Ticket start_reduce_scatter(float* buf, const std::vector<int>& counts, const std::vector<int>& displs, int unit);
  // Blocks until the collective has completed. Throws kilter::Error naming it and the unit when it
  // failed.
  void wait(Ticket ticket);
  bool done(Ticket ticket) const;
  // Whether collectives progress on a thread (MPI_THREAD_MULTIPLE) or only inside wait().
  bool overlaps() const { return threaded_; }

 private:
  struct State;
  Ticket start(int kind, float* buf, const std::vector<int>& counts, const std::vector<int>& displs, int unit);
  static void communication_thread(State& s);

  std::shared_ptr<State> state_;
  bool threaded_ = false;
  std::thread thread_;
};

}  // namespace kilter::train
