// Training samples under fully sharded parameters (sample_feed.h).
#include "lib/train/sample_feed.h"

#include <sys/mman.h>

#include <algorithm>

#include "io/base/error.h"
#include "lib/backend/fresh_pages.h"
#include "lib/train/watchdog.h"

namespace kilter::train {

namespace {

int comm_rank(MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  return rank;
}

int comm_size(MPI_Comm comm) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  return size;
}

// A collective inside the watchdog's section `what`, named with the step.
template <typename Call>
int bounded(const UnitShards& shards, const char* what, Call call) {
  Watchdog* watchdog = shards.watchdog();
  if (watchdog) watchdog->enter(what, shards.step());
  const int err = call();
  if (watchdog) watchdog->leave();
  return err;
}

}  // namespace

SampleFeed::SampleFeed(MPI_Comm group, model::Model& model, const UnitShards& shards)
    : chunks_(comm::UnitChunks::of(model.layout(), comm_size(group), comm_rank(group))),
      model_(model),
      shards_(shards) {
  KILTER_CHECK(MPI_Comm_dup(group, &comm_) == MPI_SUCCESS, "MPI_Comm_dup (training sample feed) failed");
  held_.assign(size_t(chunks_.num_units()), false);
  size_t largest_part = 0;
  for (int u = 0; u < chunks_.num_units(); ++u) {
    const comm::UnitChunk& c = chunks_.unit(u);
    KILTER_CHECK(c.chunk <= size_t(INT32_MAX), "parameter unit " << u << ": a chunk of " << c.chunk
                                                                  << " floats is more than one MPI count can hold");
    largest_part = std::max(largest_part, c.part(chunks_.rank()));
  }
  part_.resize(largest_part);
  if (!root()) return;
  // Address space for the whole padded buffer, backed only where a unit is written (and returned
  // when it is let go): not counted against the system's commit limit.
  weights_bytes_ = model.layout().padded_size * sizeof(float);
  void* p = mmap(nullptr, weights_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  KILTER_CHECK(p != MAP_FAILED, "training samples (train.shard = parameters): no address space for the weights ("
                                    << weights_bytes_ << " bytes) on the shard group's first rank");
  weights_ = static_cast<float*>(p);
}

SampleFeed::~SampleFeed() {
  if (weights_ != nullptr) munmap(weights_, weights_bytes_);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void SampleFeed::announce(bool more) {
  int flag = more ? 1 : 0;
  const int err = bounded(shards_, "training sample: next feed (train.shard = parameters)",
                          [&] { return MPI_Bcast(&flag, 1, MPI_INT, 0, comm_); });
  KILTER_CHECK(err == MPI_SUCCESS, "MPI_Bcast of a training sample's next feed failed");
}

void SampleFeed::gather(int unit) {
  const comm::UnitChunk& c = chunks_.unit(unit);
  const int rank = chunks_.rank(), size = chunks_.group_size();
  const size_t part = c.part(rank);
  // The root reads its own part straight into place; the others through part_.
  float* own = root() ? weights_ + c.offset + c.lo(rank) : part_.data();
  if (part > 0) model_.copy_params_to_host(own, c.offset + c.lo(rank), part);
  std::vector<int> counts, displs;
  if (root()) {
    for (int r = 0; r < size; ++r) {
      counts.push_back(int(c.part(r)));
      displs.push_back(int(c.lo(r)));
    }
  }
  const int err = bounded(shards_, "training sample: parameter gather (train.shard = parameters)", [&] {
    return root() ? MPI_Gatherv(MPI_IN_PLACE, 0, MPI_FLOAT, weights_ + c.offset, counts.data(), displs.data(),
                                MPI_FLOAT, 0, comm_)
                  : MPI_Gatherv(part_.data(), int(part), MPI_FLOAT, nullptr, nullptr, nullptr, MPI_FLOAT, 0, comm_);
  });
  KILTER_CHECK(err == MPI_SUCCESS, "MPI_Gatherv of parameter unit " << unit << " for a training sample failed");
}

bool SampleFeed::need(int unit) {
  if (held_[size_t(unit)]) return false;
  if (unit == 0) announce(true);
  gather(unit);
  held_[size_t(unit)] = true;
  return true;
}

void SampleFeed::forward_done(int unit) {
  const comm::UnitChunk& c = chunks_.unit(unit);
  backend::return_pages(weights_ + c.offset, c.count);
  held_[size_t(unit)] = false;
}

void SampleFeed::pass_done() {
  for (int u = 0; u < chunks_.num_units(); ++u)
    if (held_[size_t(u)]) forward_done(u);
}

void SampleFeed::end() {
  pass_done();
  announce(false);
}

void SampleFeed::serve() {
  for (;;) {
    int flag = 0;
    const int err = bounded(shards_, "training sample: next feed (train.shard = parameters)",
                            [&] { return MPI_Bcast(&flag, 1, MPI_INT, 0, comm_); });
    KILTER_CHECK(err == MPI_SUCCESS, "MPI_Bcast of a training sample's next feed failed");
    if (!flag) return;
    for (int u = 0; u < chunks_.num_units(); ++u) gather(u);
  }
}

}  // namespace kilter::train
