// Fully sharded parameters on host memory (param_shards.h).
#include "lib/train/param_shards.h"

#include <chrono>
#include <cstdint>

#include "io/base/error.h"
#include "lib/backend/fresh_pages.h"
#include "lib/diag/clock_sync.h"
#include "lib/train/watchdog.h"

namespace kilter::train {

ParamShards::ParamShards(MPI_Comm group, MPI_Comm replicas, const model::ParamLayout& layout, float* params,
                         float* grads, bool reshard_after_forward)
    : params_(params), grads_(grads), reshard_after_forward_(reshard_after_forward) {
  KILTER_CHECK(MPI_Comm_dup(group, &comm_) == MPI_SUCCESS, "MPI_Comm_dup (parameter shards) failed");
  if (replicas != MPI_COMM_NULL)
    KILTER_CHECK(MPI_Comm_dup(replicas, &replicas_) == MPI_SUCCESS, "MPI_Comm_dup (parameter shard replicas) failed");
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  chunks_ = comm::UnitChunks::of(layout, size_, rank_);
  for (int u = 0; u < num_units(); ++u) {
    const comm::UnitChunk& c = chunks_.unit(u);
    KILTER_CHECK(c.count <= size_t(INT32_MAX), "parameter unit at float " << c.offset << " holds " << c.count
                                                                            << " floats: more than one MPI count can");
    std::vector<int> counts(static_cast<size_t>(size_)), displs(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) {
      displs[size_t(r)] = int(c.lo(r));
      counts[size_t(r)] = int(c.part(r));
    }
    counts_.push_back(std::move(counts));
    displs_.push_back(std::move(displs));
  }
  gathered_.assign(size_t(num_units()), false);
  arriving_.assign(size_t(num_units()), false);
  gather_ticket_.assign(size_t(num_units()), 0);
  collectives_ = std::make_unique<ShardCollectives>(comm_, chunks_.largest_chunk());
}

ParamShards::~ParamShards() {
  collectives_.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  if (!finalized && replicas_ != MPI_COMM_NULL) MPI_Comm_free(&replicas_);
}

double ParamShards::finish() {
  finish_scatter();
  if (replicas_ == MPI_COMM_NULL) return 0.0;
  const auto start = std::chrono::steady_clock::now();
  for (const comm::BufferRange& r : owned())
    KILTER_CHECK(MPI_Allreduce(MPI_IN_PLACE, grads_ + r.offset, int(r.count), MPI_FLOAT, MPI_SUM, replicas_) == MPI_SUCCESS,
                 "MPI_Allreduce of a gradient chunk across the shard groups failed");
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::vector<comm::BufferRange> ParamShards::owned() const {
  std::vector<comm::BufferRange> ranges;
  for (const model::ParamRange& r : chunks_.owned()) ranges.push_back({r.offset, r.count});
  return ranges;
}

void ParamShards::free_outside(float* buffer, int unit) {
  for (const model::ParamRange& r : chunks_.outside(unit)) backend::return_pages(buffer + r.offset, r.count);
}

void ParamShards::wait_collective(ShardCollectives::Ticket ticket, diag::Phase phase, int unit, const char* what) {
  const int64_t begin = diag::steady_now_ns();
  if (watchdog_) watchdog_->enter(what, step_);
  try {
    collectives_->wait(ticket);
  } catch (...) {
    if (watchdog_) watchdog_->leave();
    throw;
  }
  if (watchdog_) watchdog_->leave();
  if (diagnostics_) diagnostics_->unit_wait(phase, begin, diag::steady_now_ns(), unit);
}

void ParamShards::start_gather(int unit) {
  const comm::UnitChunk& u = chunks_.unit(unit);
  gather_ticket_[size_t(unit)] =
      collectives_->start_gather(params_ + u.offset, counts_[size_t(unit)], displs_[size_t(unit)], unit);
  gathered_[size_t(unit)] = true;
  arriving_[size_t(unit)] = true;
}

bool ParamShards::arrive(int unit) {
  if (!gathered_[size_t(unit)]) start_gather(unit);
  if (!arriving_[size_t(unit)]) return false;
  wait_collective(gather_ticket_[size_t(unit)], diag::kGatherWait, unit,
                  "parameter all-gather (train.shard = parameters)");
  arriving_[size_t(unit)] = false;
  return true;
}

bool ParamShards::need(int unit) {
  if (unit < 0 || unit >= num_units()) return false;
  // The forward needs the units upwards from the embeddings; the backward needs the final unit
  // again, then the blocks downwards.
  // (A tied head asks for the embeddings again between the two: from then on, downwards.)
  if (last_needed_ < 0)
    descending_ = false;
  else if (unit <= last_needed_)
    descending_ = true;
  last_needed_ = unit;
  // The previous micro-batch's last reduce-scatter reads the gradient this pass will write.
  if (scatter_unit_ == unit) finish_scatter();
  const bool arrived = arrive(unit);
  // The next unit's gather, while this one computes (the backward's prefetch stops at block 0:
  // the embeddings' backward reads none of them).
  const int next = descending_ ? unit - 1 : unit + 1;
  if (next >= 0 && next < num_units() && !gathered_[size_t(next)]) start_gather(next);
  return arrived;
}

void ParamShards::release_params(int unit) {
  if (unit < 0 || unit >= num_units() || !gathered_[size_t(unit)]) return;
  // A gather in flight writes the buffer: it lands before the pages go.
  if (arriving_[size_t(unit)]) {
    wait_collective(gather_ticket_[size_t(unit)], diag::kGatherWait, unit,
                    "parameter all-gather (train.shard = parameters)");
    arriving_[size_t(unit)] = false;
  }
  free_outside(params_, unit);
  gathered_[size_t(unit)] = false;
}

void ParamShards::forward_done(int unit) {
  // The final unit stays for the head and the backward. The embeddings go after the encoder (a
  // tied head gathers them again: need(0)); the last block too, so that the head's phase, the
  // peak with a tied head, holds none (the backward's prefetch brings it back behind the final
  // norm's backward).
  if (reshard_after_forward_ && unit < num_units() - 1) release_params(unit);
}

void ParamShards::head_done() {
  release_params(0);
  finish_scatter();
  start_scatter(0);
}

void ParamShards::finish_scatter() {
  if (scatter_unit_ < 0) return;
  const int unit = scatter_unit_;
  scatter_unit_ = -1;
  wait_collective(scatter_ticket_, diag::kScatterWait, unit, "gradient reduce-scatter (train.shard = parameters)");
  free_outside(grads_, unit);
}

void ParamShards::start_scatter(int unit) {
  const comm::UnitChunk& u = chunks_.unit(unit);
  // The chunk already holds the earlier micro-batches' reduced sum (plus this rank's new part):
  // the sum over ranks adds the new parts of the others to it, in place.
  scatter_ticket_ = collectives_->start_reduce_scatter(grads_ + u.offset, counts_[size_t(unit)], displs_[size_t(unit)],
                                                       unit);
  scatter_unit_ = unit;
}

void ParamShards::grads_final(int unit) {
  // One reduce-scatter in flight at a time (its unit's whole gradient): the previous one had this
  // unit's backward to finish in.
  finish_scatter();
  start_scatter(unit);
  // The backward kept the unit above (its norm may be read again); the embeddings end the pass.
  release_params(unit + 1);
  if (unit == 0) release_params(0);
}

void ParamShards::pass_done() {
  for (int u = 0; u < num_units(); ++u) release_params(u);
  last_needed_ = -1;
  descending_ = false;
}

void ParamShards::release_all() {
  finish_scatter();
  for (int u = 0; u < num_units(); ++u) {
    if (!arriving_[size_t(u)]) gathered_[size_t(u)] = true;  // frees the other chunks whatever they hold
    release_params(u);
    free_outside(grads_, u);
  }
}

}  // namespace kilter::train
