// The sharded parameters' collectives in flight (param_shards_comm.h).
#include "lib/train/param_shards_comm.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <condition_variable>
#include <deque>
#include <mutex>

#include "io/base/error.h"
#include "io/base/mpi_check.h"

namespace kilter::train {

namespace {

enum Kind { kGather = 0, kReduceScatter = 1 };

const char* kind_name(int kind) {
  return kind == kGather ? "MPI_Iallgatherv of parameter unit" : "MPI_Reduce_scatter of gradient unit";
}

// How often the thread tests the collectives in flight: timely progress (a collective of a unit
// takes milliseconds) without a core spent spinning in MPI.
constexpr auto kPollInterval = std::chrono::microseconds(50);

}  // namespace

struct ShardCollectives::State {
  struct Op {
    int kind = kGather;
    int unit = 0;
    float* buf = nullptr;  // the gather's buffer; the reduce-scatter's input and result
    const int* counts = nullptr;
    const int* displs = nullptr;
    MPI_Request request = MPI_REQUEST_NULL;
    bool issued = false;
    bool complete = false;
    int error = MPI_SUCCESS;
  };

  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 1;
  std::vector<float> pack;  // a reduce-scatter's piece of every rank's chunk, in rank order
  std::vector<int> piece_counts;
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<Op> ops;  // in start order; completed ones leave from the front
  Ticket first = 0;    // the ticket of ops.front()
  bool stop = false;

  Op* find(Ticket t) { return t >= first && t < first + ops.size() ? &ops[size_t(t - first)] : nullptr; }

  // The reduce-scatter of `op`, piece by piece (one at a time: only the running thread uses pack).
  int reduce_scatter(const Op& op) {
    const size_t piece = pack.size() / size_t(size);
    const size_t own = size_t(op.counts[rank]);
    float* chunk = op.buf + op.displs[rank];
    int error = MPI_SUCCESS;
    for (size_t first = 0; first < size_t(op.counts[0]) && error == MPI_SUCCESS; first += piece) {
      size_t packed = 0;
      for (int r = 0; r < size; ++r) {
        const size_t count = size_t(op.counts[r]);
        const size_t take = count > first ? std::min(piece, count - first) : 0;
        std::memcpy(pack.data() + packed, op.buf + op.displs[r] + first, take * sizeof(float));
        piece_counts[size_t(r)] = int(take);
        packed += take;
      }
      // This rank's part of the piece was packed: its sum goes straight into the chunk.
      error = MPI_Reduce_scatter(pack.data(), chunk + std::min(first, own), piece_counts.data(), MPI_FLOAT, MPI_SUM,
                                 comm);
    }
    return error;
  }

  // A gather is issued nonblocking. A reduce-scatter runs blocking, to its end (the lock is
  // released meanwhile, `lock` null: no thread): MPI_Ireduce_scatter sums in another order than
  // MPI_Reduce_scatter in Open MPI (measured on 3 and 4 ranks), and a run's sums must not depend
  // on its timing.
  void issue(Op& op, std::unique_lock<std::mutex>* lock) {
    op.issued = true;
    if (op.kind == kGather) {
      op.error = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, op.buf, op.counts, op.displs, MPI_FLOAT, comm,
                                 &op.request);
      if (op.error != MPI_SUCCESS) op.complete = true;
      return;
    }
    const Op copy = op;  // start() may append meanwhile: the deque's element may move
    if (lock) lock->unlock();
    const int error = reduce_scatter(copy);
    if (lock) lock->lock();
    op.error = error;
    op.complete = true;
  }

  // Completed collectives that succeeded leave the queue (a failed one stays for wait() to report).
  void drop_completed() {
    while (!ops.empty() && ops.front().complete && ops.front().error == MPI_SUCCESS) {
      ops.pop_front();
      ++first;
    }
  }
};

ShardCollectives::ShardCollectives(MPI_Comm comm, size_t largest_chunk) : state_(std::make_shared<State>()) {
  State& s = *state_;
  s.comm = comm;
  MPI_Comm_rank(comm, &s.rank);
  MPI_Comm_size(comm, &s.size);
  // The pieces: at most kPackFloats in all, whole 64-float groups a rank.
  // (KILTER_TEST_REDUCE_SCATTER_PIECE: the test hook that sets a piece's floats per rank.)
  constexpr size_t kPackFloats = size_t(4) << 20;
  size_t piece = std::max<size_t>(64, std::min(largest_chunk, kPackFloats / size_t(s.size)) / 64 * 64);
  if (const char* forced = std::getenv("KILTER_TEST_REDUCE_SCATTER_PIECE"))
    piece = std::max<size_t>(64, size_t(std::strtoull(forced, nullptr, 10)) / 64 * 64);
  s.pack.resize(piece * size_t(s.size));
  s.piece_counts.resize(size_t(s.size));
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  threaded_ = level == MPI_THREAD_MULTIPLE;
  if (threaded_) thread_ = std::thread([s = state_] { communication_thread(*s); });
}

ShardCollectives::~ShardCollectives() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stop = true;
  }
  state_->changed.notify_all();
  thread_.join();
}

ShardCollectives::Ticket ShardCollectives::start(int kind, float* buf, const std::vector<int>& counts,
                                                 const std::vector<int>& displs, int unit) {
  State& s = *state_;
  State::Op op;
  op.kind = kind;
  op.unit = unit;
  op.buf = buf;
  op.counts = counts.data();
  op.displs = displs.data();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.ops.push_back(op);
  if (threaded_) s.changed.notify_all();
  return s.first + s.ops.size() - 1;
}

ShardCollectives::Ticket ShardCollectives::start_gather(float* buf, const std::vector<int>& counts,
                                                        const std::vector<int>& displs, int unit) {
  return start(kGather, buf, counts, displs, unit);
}

ShardCollectives::Ticket ShardCollectives::start_reduce_scatter(float* buf, const std::vector<int>& counts,
                                                                const std::vector<int>& displs, int unit) {
  return start(kReduceScatter, buf, counts, displs, unit);
}

bool ShardCollectives::done(Ticket ticket) const {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  const State::Op* op = s.find(ticket);
  return op == nullptr || op->complete;
}

void ShardCollectives::wait(Ticket ticket) {
  State& s = *state_;
  std::unique_lock<std::mutex> lock(s.mutex);
  KILTER_CHECK(ticket < s.first + s.ops.size(),
               "sharded parameters: waiting for collective " << ticket << " that was never started");
  if (threaded_) {
    s.changed.wait(lock, [&] {
      const State::Op* op = s.find(ticket);
      return op == nullptr || op->complete;
    });
  } else {
    // No thread: every collective started up to this one, in start order (the order every rank
    // issues them in), issued and completed here.
    for (Ticket t = s.first; t <= ticket; ++t) {
      State::Op& op = *s.find(t);
      if (!op.issued) s.issue(op, nullptr);
      if (!op.complete) {
        op.error = MPI_Wait(&op.request, MPI_STATUS_IGNORE);
        op.complete = true;
      }
    }
  }
  const State::Op* op = s.find(ticket);
  if (op == nullptr) return;
  KILTER_CHECK(op->error == MPI_SUCCESS, kind_name(op->kind) << " " << op->unit
                                                             << " (train.shard = parameters) failed: "
                                                             << mpi_error_string(op->error));
  if (!threaded_) s.drop_completed();
}

void ShardCollectives::communication_thread(State& s) {
  std::unique_lock<std::mutex> lock(s.mutex);
  for (;;) {
    if (s.stop) return;
    bool in_flight = false, completed = false;
    // By index: a reduce-scatter releases the lock, and start() may append meanwhile (the front
    // leaves only here, below).
    for (size_t i = 0; i < s.ops.size() && !s.stop; ++i) {
      if (s.ops[i].complete) continue;
      if (!s.ops[i].issued) {
        s.issue(s.ops[i], &lock);
        if (s.ops[i].complete) {
          completed = true;
          continue;
        }
      }
      State::Op& op = s.ops[i];
      int flag = 0;
      op.error = MPI_Test(&op.request, &flag, MPI_STATUS_IGNORE);
      if (flag || op.error != MPI_SUCCESS) {
        op.complete = true;
        completed = true;
      } else {
        in_flight = true;
      }
    }
    if (completed) {
      s.drop_completed();
      s.changed.notify_all();
    }
    if (s.stop) return;
    if (!in_flight) {
      s.changed.wait(lock, [&] {
        if (s.stop) return true;
        for (const State::Op& op : s.ops)
          if (!op.issued) return true;
        return false;
      });
      continue;
    }
    lock.unlock();
    std::this_thread::sleep_for(kPollInterval);
    lock.lock();
  }
}

}  // namespace kilter::train
