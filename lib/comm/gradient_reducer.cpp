// The gradient reducer: sums the flat gradient buffer over all ranks in buckets, flat (one
// allreduce per bucket) or hierarchically (node reduce-scatter -> cross-node allreduce of the
// 1/L shard -> node allgather), launching each bucket as soon as backward has finished it. Sharded
// (ZeRO-1), the reduction stops after the scatter stages and gather() later all-gathers the
// owned ranges of the updated parameters along the same bucket layout.
//
// Ordering is what keeps this correct across ranks: every stage has its own communicator (a dup
// of the world, node or cross communicator) and launches buckets strictly in bucket order
// (highest offset first), so each communicator sees the same sequence of collectives on every
// rank even though stages of different buckets interleave differently on different ranks.
//
// Progress: Open MPI advances nonblocking collectives only inside MPI calls, so overlap needs
// either MPI calls while backward computes (poll mode: ready() tests the requests in flight) or a
// communication thread that runs the bucket collectives itself (thread mode). finish() returns
// the seconds the caller blocked. Sharded, thread mode also runs the parameters' all-gather on
// that thread (start_gather), bucket by bucket from the lowest offset, while the next step's
// forward waits for each layer's range (wait_gather).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <iterator>
#include <malloc.h>

#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "io/base/error.h"
#include "io/base/mpi_check.h"
#include "lib/comm/communicator.h"

namespace kilter::comm {

OverlapMode parse_overlap_mode(const std::string& name) {
  if (name == "off") return OverlapMode::off;
  if (name == "poll") return OverlapMode::poll;
  if (name == "thread") return OverlapMode::thread;
  if (name == "auto") return OverlapMode::automatic;
  KILTER_FAIL("overlap mode '" << name << "': expected off | poll | thread | auto");
}

const char* overlap_mode_name(OverlapMode mode) {
  switch (mode) {
    case OverlapMode::off: return "off";
    case OverlapMode::poll: return "poll";
    case OverlapMode::thread: return "thread";
    case OverlapMode::automatic: return "auto";
  }
  return "?";
}

namespace {

// Returns the free memory of every malloc arena to the system. The communication thread's
// nonblocking collectives hold temporaries of a bucket's size each (MPI_Ireduce_scatter_block in
// place copies the bucket), many buckets at once while backward runs ahead, in that thread's own
// arena; once freed they stay resident there (glibc raises its mmap threshold past a bucket after
// the first large free, and an arena shrinks only from its top), under whatever the next phase
// allocates: the optimizer step, the checkpoint. Measured on 4 ranks of a 50 M-parameter model:
// ranks peaked 50-180 MiB above the run without the thread; trimmed, within 5% of it.
void return_freed_memory() { malloc_trim(0); }

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// world_allreduce reduces the whole bucket over its communicator (the world, or the only node);
// world_reduce_scatter scatters it over that communicator (sharded). cross_reduce_scatter
// scatters the node shard across nodes (sharded); cross_allgather / world_allgather are the
// gathers of the owned ranges that undo the scatters (sharded, parameters).
enum class StageOp {
  node_reduce_scatter,
  cross_allreduce,
  node_allgather,
  world_allreduce,
  cross_reduce_scatter,
  world_reduce_scatter,
  cross_allgather,
  world_allgather
};

struct Stage {
  StageOp op;
  std::unique_ptr<Communicator> comm;
};

struct Bucket {
  size_t offset = 0;
  size_t count = 0;                   // a multiple of the node size (of the world size, sharded)
  size_t owned_offset = 0;            // what this rank holds reduced after the stages
  size_t owned_count = 0;
  size_t missing = 0;                 // elements not yet reported ready this step
  size_t completed = 0;               // stages finished this step
  std::unique_ptr<Request> in_flight;  // the stage running now (poll mode)
};

// Everything a step touches; shared with the communication thread so that a thread stuck in a
// collective on the error path (another rank died) can be detached without dangling.
struct ReducerState {
  float* buf = nullptr;
  size_t padded_size = 0;
  size_t reported_size = 0;
  int local_rank = 0;
  int local_size = 1;
  std::vector<Stage> stages;
  std::vector<Stage> gather_stages;   // sharded: the all-gather of the owned ranges
  std::vector<MPI_Comm> owned_comms;  // dups made for the stages, freed with the state
  std::vector<Bucket> buckets;        // launch order: highest offset first

  // Step state, guarded by `mutex` in thread mode.
  std::mutex mutex;
  std::condition_variable changed;
  bool active = false;        // between begin() and the end of finish()
  bool finishing = false;     // finish() called: everything is ready
  size_t started_early = 0;   // buckets whose first stage began before finish()
  size_t buckets_done = 0;
  std::vector<size_t> next_launch;  // per stage: the next bucket it launches (poll mode)
  std::vector<size_t> launched_now;  // per stage: its buckets in flight (poll mode)
  // Per stage: the most buckets it holds in flight (SIZE_MAX: no bound), see
  // kMpiBucketsInFlight.
  size_t max_in_flight = SIZE_MAX;
  size_t most_in_flight = 0;  // this step's most in flight in one stage
  std::map<size_t, size_t> reported;  // ranges reported this step: begin -> end
  bool stop = false;
  bool in_collective = false;
  std::exception_ptr failure;
  // The all-gather left to the communication thread (start_gather), guarded by `mutex`.
  void* gather_params = nullptr;  // null: none in flight
  DType gather_type = DType::f32;  // its elements: the parameters, or the bf16 working copy
  size_t gather_next = 0;          // buckets gathered, in ascending offsets
  size_t gather_end = 0;           // params [0, gather_end) have arrived
  std::chrono::steady_clock::time_point gather_moved;  // the gather's start or last bucket
  std::shared_ptr<std::atomic<bool>> gather_done;     // set once the gather in flight has arrived
  double timeout_s = 300.0;        // [comm] timeout_s: no bucket for that long = a rank is gone

  ~ReducerState() {
    stages.clear();  // communicators first, then the MPI communicators under them
    gather_stages.clear();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized)
      for (MPI_Comm& c : owned_comms) MPI_Comm_free(&c);
  }

  size_t shard(const Bucket& b) const { return b.count / size_t(local_size); }
  float* own_shard(float* base, const Bucket& b) const { return base + b.offset + size_t(local_rank) * shard(b); }

  std::unique_ptr<Request> launch(const Stage& s, const Bucket& b) {
    switch (s.op) {
      case StageOp::node_reduce_scatter:
        return s.comm->ireduce_scatter(buf + b.offset, own_shard(buf, b), shard(b), DType::f32);
      case StageOp::cross_allreduce: return s.comm->iallreduce(own_shard(buf, b), shard(b), DType::f32);
      case StageOp::node_allgather:
        return s.comm->iallgather(own_shard(buf, b), buf + b.offset, shard(b), DType::f32);
      case StageOp::world_allreduce: return s.comm->iallreduce(buf + b.offset, b.count, DType::f32);
      case StageOp::cross_reduce_scatter:
        return s.comm->ireduce_scatter(own_shard(buf, b), buf + b.owned_offset, b.owned_count, DType::f32);
      case StageOp::world_reduce_scatter:
        return s.comm->ireduce_scatter(buf + b.offset, buf + b.owned_offset, b.owned_count, DType::f32);
      case StageOp::cross_allgather:
      case StageOp::world_allgather: break;  // gathers run only through run_blocking
    }
    KILTER_FAIL("unknown reduction stage");
  }

  // `base`: the buffer the stage works on (the gradients; the parameters for the gathers).
  void run_blocking(const Stage& s, const Bucket& b, float* base) {
    switch (s.op) {
      case StageOp::node_reduce_scatter:
        s.comm->reduce_scatter(base + b.offset, own_shard(base, b), shard(b), DType::f32);
        return;
      case StageOp::cross_allreduce: s.comm->allreduce(own_shard(base, b), shard(b), DType::f32); return;
      case StageOp::node_allgather:
        s.comm->allgather(own_shard(base, b), base + b.offset, shard(b), DType::f32);
        return;
      case StageOp::world_allreduce: s.comm->allreduce(base + b.offset, b.count, DType::f32); return;
      case StageOp::cross_reduce_scatter:
        s.comm->reduce_scatter(own_shard(base, b), base + b.owned_offset, b.owned_count, DType::f32);
        return;
      case StageOp::world_reduce_scatter:
        s.comm->reduce_scatter(base + b.offset, base + b.owned_offset, b.owned_count, DType::f32);
        return;
      case StageOp::cross_allgather:
      case StageOp::world_allgather: run_gather_stage(s, b, base, DType::f32); return;
    }
  }
  // A gather stage over a buffer of `t` elements laid out as the gradients (the parameters, or
  // the distributed optimizer's bf16 working copy).
  void run_gather_stage(const Stage& s, const Bucket& b, void* base, DType t) {
    const size_t size = dtype_size(t);
    char* bytes = static_cast<char*>(base);
    auto at = [&](size_t element) { return bytes + element * size; };
    const size_t own = b.offset + size_t(local_rank) * shard(b);
    switch (s.op) {
      case StageOp::node_allgather: s.comm->allgather(at(own), at(b.offset), shard(b), t); return;
      case StageOp::cross_allgather: s.comm->allgather(at(b.owned_offset), at(own), b.owned_count, t); return;
      case StageOp::world_allgather: s.comm->allgather(at(b.owned_offset), at(b.offset), b.owned_count, t); return;
      default: KILTER_FAIL("gradient reducer: stage " << int(s.op) << " is no gather");
    }
  }
  void run_blocking(const Stage& s, const Bucket& b) { run_blocking(s, b, buf); }

  // The gather's i-th bucket in ascending offsets (buckets are kept highest offset first).
  const Bucket& gather_bucket(size_t i) const { return buckets[buckets.size() - 1 - i]; }
  void run_gather_bucket(size_t i, void* params, DType t) {
    for (const Stage& stage : gather_stages) run_gather_stage(stage, gather_bucket(i), params, t);
  }

  // Communication thread, `lock` held, a gather in flight: runs its next bucket (the lock
  // released meanwhile). False when it failed (the failure is recorded and announced).
  bool gather_one_bucket(std::unique_lock<std::mutex>& lock) {
    const size_t i = gather_next;
    void* params = gather_params;
    const DType type = gather_type;
    in_collective = true;
    lock.unlock();
    std::exception_ptr failed;
    try {
      run_gather_bucket(i, params, type);
    } catch (...) {
      failed = std::current_exception();
    }
    lock.lock();
    in_collective = false;
    if (failed) {
      failure = failed;
      changed.notify_all();
      return false;
    }
    gather_end = gather_bucket(i).offset + gather_bucket(i).count;
    gather_moved = std::chrono::steady_clock::now();
    if (++gather_next == buckets.size()) {
      gather_params = nullptr;
      if (gather_done) gather_done->store(true, std::memory_order_release);
      return_freed_memory();  // the gather's temporaries, before the forward's activations
    }
    changed.notify_all();
    return true;
  }

  void run_bucket_blocking(Bucket& b) {
    for (const Stage& s : stages) run_blocking(s, b);
    b.completed = stages.size();
  }

  // Marks [offset, offset+count) ready; ranges beyond reported_size (padding) were ready already.
  void mark_ready(size_t offset, size_t count) {
    const size_t end = std::min(offset + count, reported_size);
    if (offset >= end) return;
    // A range reported twice would let its bucket launch while another range is still missing.
    auto next = reported.lower_bound(offset);
    const bool overlaps_next = next != reported.end() && next->first < end;
    const bool overlaps_prev = next != reported.begin() && std::prev(next)->second > offset;
    KILTER_CHECK(!overlaps_next && !overlaps_prev,
                 "gradient range [" << offset << ", " << end << ") reported twice in one step (it overlaps ["
                                    << (overlaps_next ? next->first : std::prev(next)->first) << ", "
                                    << (overlaps_next ? next->second : std::prev(next)->second) << "))");
    reported.emplace_hint(next, offset, end);
    for (Bucket& b : buckets) {
      const size_t lo = std::max(offset, b.offset), hi = std::min(end, b.offset + b.count);
      if (lo < hi) b.missing -= hi - lo;
    }
  }

  void reset_step() {
    for (Bucket& b : buckets) {
      const size_t reported_end = std::min(b.offset + b.count, reported_size);
      b.missing = reported_end > b.offset ? reported_end - b.offset : 0;
      b.completed = 0;
      b.in_flight.reset();
    }
    buckets_done = stages.empty() ? buckets.size() : 0;
    next_launch.assign(stages.size(), 0);
    launched_now.assign(stages.size(), 0);
    most_in_flight = 0;
    reported.clear();
    started_early = 0;
    finishing = false;
  }

  size_t in_flight_count() const {
    size_t n = 0;
    for (const Bucket& b : buckets) n += b.in_flight != nullptr;
    return n;
  }

  // Poll mode: completes what MPI has finished and launches what has become launchable, stage by
  // stage in bucket order, at most max_in_flight buckets a stage. Returns whether anything
  // changed. The bound cannot deadlock: every rank launches a stage's buckets in the same order,
  // so the lowest bucket in flight anywhere has been launched by every rank of the stage that can
  // (its earlier stages done) and completes, freeing a place.
  bool progress() {
    bool any = false;
    for (Bucket& b : buckets) {
      if (b.in_flight && b.in_flight->test()) {
        b.in_flight.reset();
        --launched_now[b.completed];  // the stage that ran is the one completed next
        if (++b.completed == stages.size()) ++buckets_done;
        any = true;
      }
    }
    for (size_t s = 0; s < stages.size(); ++s) {
      while (next_launch[s] < buckets.size() && launched_now[s] < max_in_flight) {
        Bucket& b = buckets[next_launch[s]];
        const bool launchable = s == 0 ? b.missing == 0 : (b.completed == s && !b.in_flight);
        if (!launchable) break;
        b.in_flight = launch(stages[s], b);
        most_in_flight = std::max(most_in_flight, ++launched_now[s]);
        ++next_launch[s];
        if (s == 0 && !finishing) ++started_early;
        any = true;
      }
    }
    return any;
  }
};

class BucketGradientReducer final : public GradientReducer {
 public:
  BucketGradientReducer(std::shared_ptr<ReducerState> state, OverlapMode mode, bool blocking)
      : state_(std::move(state)), mode_(mode), blocking_(blocking) {
    if (mode_ == OverlapMode::thread) {
      if (blocking_)
        thread_ = std::thread([s = state_] { blocking_communication_thread(*s); });
      else
        thread_ = std::thread([s = state_] { polling_communication_thread(*s); });
    }
  }

  ~BucketGradientReducer() override {
    if (!thread_.joinable()) return;
    bool stuck = false;
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      state_->stop = true;
      // A thread inside a collective that other ranks never joined (we are unwinding an error)
      // would block join() forever; the job is about to be aborted, so let it go. It holds its
      // own reference to the state.
      stuck = state_->in_collective;
    }
    state_->changed.notify_all();
    if (stuck)
      thread_.detach();
    else
      thread_.join();
  }

  bool communicating() const override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->active || state_->in_collective || state_->gather_params != nullptr;
  }

  size_t num_buckets() const override { return state_->buckets.size(); }

  std::vector<BufferRange> owned() const override {
    std::vector<BufferRange> ranges;
    for (const Bucket& b : state_->buckets) ranges.push_back({b.owned_offset, b.owned_count});
    return ranges;
  }

  void gather(float* params) override { gather_buffer(params, DType::f32); }
  void gather_bf16(uint16_t* working) override { gather_buffer(working, DType::bf16); }
  bool gathers_in_background() const override { return mode_ == OverlapMode::thread && !state_->gather_stages.empty(); }
  void start_gather(float* params) override { start_gather_buffer(params, DType::f32); }
  void start_gather_bf16(uint16_t* working) override { start_gather_buffer(working, DType::bf16); }
  void gather_buffer(void* params, DType t) {
    ReducerState& s = *state_;
    if (s.gather_stages.empty()) return;
    wait_gather(s.padded_size);
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      KILTER_CHECK(!s.active, "gradient reducer: gather() called between begin() and finish()");
    }
    for (size_t i = 0; i < s.buckets.size(); ++i) s.run_gather_bucket(i, params, t);
  }
  void start_gather_buffer(void* params, DType t) {
    if (!gathers_in_background()) {
      gather_buffer(params, t);
      return;
    }
    wait_gather(state_->padded_size);
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      KILTER_CHECK(!state_->active, "gradient reducer: start_gather() called between begin() and finish()");
      state_->gather_params = params;
      state_->gather_type = t;
      state_->gather_next = 0;
      state_->gather_end = 0;
      state_->gather_moved = std::chrono::steady_clock::now();
      state_->gather_done = std::make_shared<std::atomic<bool>>(false);
    }
    state_->changed.notify_all();
  }
  std::shared_ptr<const std::atomic<bool>> gather_arrival() const override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->gather_done;
  }
  // The ranks started the gather together (after the step's norm allreduce), so a bucket that
  // does not arrive within twice [comm] timeout_s means a rank stopped taking part: the caller gets
  // an error (and the job ends) instead of waiting on a collective that MPI never ends. The
  // trainer's watchdog brackets the gather too and fires first, after timeout_s, naming the ranks
  // that did not arrive; this bound is for callers without one.
  void wait_gather(size_t end) override {
    ReducerState& s = *state_;
    std::unique_lock<std::mutex> lock(s.mutex);
    end = std::min(end, s.padded_size);
    const auto arrived = [&] { return s.gather_params == nullptr || s.gather_end >= end || s.failure; };
    if (s.timeout_s <= 0) {
      s.changed.wait(lock, arrived);
    } else {
      const auto limit = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(2 * s.timeout_s));
      while (!arrived()) {
        s.changed.wait_until(lock, s.gather_moved + limit);
        KILTER_CHECK(arrived() || std::chrono::steady_clock::now() - s.gather_moved < limit,
                     "the parameter all-gather (sharded optimizer) made no progress for "
                         << 2 * s.timeout_s << " s: bucket " << s.gather_next + 1 << " of " << s.buckets.size()
                         << " never arrived, so a rank stopped taking part (see the other ranks' messages; "
                            "comm.timeout_s bounds this wait)");
      }
    }
    if (s.failure) std::rethrow_exception(s.failure);
  }
  size_t buckets_started_early() const override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->started_early;
  }
  size_t most_buckets_in_flight() const override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->most_in_flight;
  }

  void begin() override {
    std::unique_lock<std::mutex> lock(state_->mutex);
    KILTER_CHECK(!state_->active, "gradient reducer: begin() called again before finish()");
    state_->reset_step();
    state_->active = true;
    if (mode_ == OverlapMode::poll) state_->progress();  // buckets made only of padding
    lock.unlock();
    if (mode_ == OverlapMode::thread) state_->changed.notify_all();
  }

  void ready(size_t offset, size_t count) override {
    std::unique_lock<std::mutex> lock(state_->mutex);
    if (!state_->active) return;  // earlier micro-batches of the step only accumulate
    state_->mark_ready(offset, count);
    if (mode_ == OverlapMode::poll) {
      while (state_->progress()) {
      }
    }
    lock.unlock();
    if (mode_ == OverlapMode::thread) state_->changed.notify_all();
  }

  double finish() override {
    const double t0 = seconds_now();
    ReducerState& s = *state_;
    std::unique_lock<std::mutex> lock(s.mutex);
    KILTER_CHECK(s.active, "gradient reducer: finish() called without begin()");
    // Backward is over: whatever was not reported is final too.
    for (Bucket& b : s.buckets) b.missing = 0;
    s.finishing = true;
    try {
      switch (mode_) {
        case OverlapMode::off:
          if (blocking_) {
            for (Bucket& b : s.buckets) s.run_bucket_blocking(b);
            s.buckets_done = s.buckets.size();
          } else {
            drive_to_completion(s);
          }
          break;
        case OverlapMode::poll:
          drive_to_completion(s);
          break;
        case OverlapMode::thread:
          s.changed.notify_all();
          s.changed.wait(lock, [&] { return s.buckets_done == s.buckets.size() || s.failure; });
          if (s.failure) std::rethrow_exception(s.failure);
          return_freed_memory();  // the buckets' temporaries, before the optimizer step
          break;
        case OverlapMode::automatic: KILTER_FAIL("gradient reducer: overlap mode was not resolved");
      }
    } catch (...) {
      s.active = false;
      throw;
    }
    s.active = false;
    return seconds_now() - t0;
  }

 private:
  // Tests and launches until every bucket is done. Yielding when nothing moved lets the peer
  // ranks run on a node with more ranks than free cores (it costs nothing on an idle core).
  static void drive_to_completion(ReducerState& s) {
    while (s.buckets_done < s.buckets.size())
      if (!s.progress()) std::this_thread::yield();
  }

  // Runs each bucket, in order, once it is fully reported, with blocking collectives.
  static void blocking_communication_thread(ReducerState& s) {
    std::unique_lock<std::mutex> lock(s.mutex);
    for (;;) {
      s.changed.wait(lock, [&] {
        return s.stop || s.gather_params != nullptr ||
               (s.active && s.buckets_done < s.buckets.size() && s.buckets[s.buckets_done].missing == 0);
      });
      if (s.stop) return;
      if (s.gather_params != nullptr) {  // the parameters' all-gather, before the next step's buckets
        if (!s.gather_one_bucket(lock)) return;
        continue;
      }
      Bucket& b = s.buckets[s.buckets_done];
      if (!s.finishing) ++s.started_early;
      s.in_collective = true;
      lock.unlock();
      std::exception_ptr failure;
      try {
        s.run_bucket_blocking(b);
      } catch (...) {
        failure = std::current_exception();
      }
      lock.lock();
      s.in_collective = false;
      if (failure) {
        s.failure = failure;
        s.changed.notify_all();
        return;
      }
      ++s.buckets_done;
      if (s.buckets_done == s.buckets.size()) s.changed.notify_all();
    }
  }

  // Drives the nonblocking stage pipeline (as poll mode does from ready()), testing the requests
  // in flight every kPollInterval: timely progress without a core spent spinning in MPI.
  static void polling_communication_thread(ReducerState& s) {
    constexpr auto kPollInterval = std::chrono::microseconds(50);
    std::unique_lock<std::mutex> lock(s.mutex);
    for (;;) {
      if (s.stop) return;
      if (s.gather_params != nullptr) {  // the parameters' all-gather, with blocking collectives
        if (!s.gather_one_bucket(lock)) return;
        continue;
      }
      if (!s.active || s.buckets_done == s.buckets.size()) {
        s.changed.wait(lock);
        continue;
      }
      bool any = false;
      try {
        while (s.progress()) any = true;
      } catch (...) {
        s.failure = std::current_exception();
        s.changed.notify_all();
        return;
      }
      if (s.buckets_done == s.buckets.size()) {
        s.changed.notify_all();
        continue;
      }
      if (!any && s.in_flight_count() == 0) {
        s.changed.wait(lock);  // waiting for backward to report the next bucket
        continue;
      }
      lock.unlock();
      std::this_thread::sleep_for(kPollInterval);
      lock.lock();
    }
  }

  std::shared_ptr<ReducerState> state_;
  OverlapMode mode_;
  bool blocking_;
  std::thread thread_;
};

MPI_Comm dup_comm(MPI_Comm comm, const char* what) {
  MPI_Comm dup = MPI_COMM_NULL;
  KILTER_MPI_CHECK(MPI_Comm_dup(comm, &dup), "MPI_Comm_dup(" << what << ")");
  return dup;
}

OverlapMode resolve_overlap(OverlapMode requested, const std::string& kind, int world_rank) {
  int thread_level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&thread_level);
  if (requested == OverlapMode::automatic) {
    if (kind != "mpi") return OverlapMode::poll;
    return thread_level == MPI_THREAD_MULTIPLE ? OverlapMode::thread : OverlapMode::poll;
  }
  if (requested == OverlapMode::thread && thread_level != MPI_THREAD_MULTIPLE) {
    if (world_rank == 0)
      std::fprintf(stderr,
                   "kilter: warning: overlap mode 'thread' needs MPI_THREAD_MULTIPLE, which this MPI did not "
                   "provide; polling from backward instead\n");
    return OverlapMode::poll;
  }
  return requested;
}

}  // namespace

std::unique_ptr<GradientReducer> make_gradient_reducer(const Topology& topo, float* buf, size_t padded_size,
                                                       const ReducerOptions& opts) {
  KILTER_CHECK(opts.algo == "flat" || opts.algo == "hierarchical",
               "config key comm.algo = '" << opts.algo << "': expected flat | hierarchical");
  KILTER_CHECK(topo.world != MPI_COMM_NULL, "gradient reducer: topology has no world communicator");
  KILTER_CHECK(topo.local_size >= 1 && padded_size % size_t(topo.local_size) == 0,
               "gradient buffer of " << padded_size << " floats is not a multiple of the " << topo.local_size
                                     << " ranks per node (pad it so node shards are contiguous)");
  KILTER_CHECK(opts.reported_size <= padded_size,
               "gradient reducer: reported_size " << opts.reported_size << " exceeds the buffer (" << padded_size << ")");
  KILTER_CHECK(buf != nullptr || padded_size == 0, "gradient reducer: null gradient buffer");
  KILTER_CHECK(!opts.shard || padded_size % size_t(topo.size) == 0,
               "gradient buffer of " << padded_size << " floats is not a multiple of the " << topo.size
                                     << " ranks (pad it so a sharded reduction gives every rank the same share)");

  bool hierarchical = opts.algo == "hierarchical";
  if (hierarchical && !topo.uniform) hierarchical = false;  // make_topology has warned on rank 0
  KILTER_CHECK(!opts.shard_within_node || (hierarchical && opts.shard),
               "gradient reducer: sharding inside the node (HSDP) needs a sharded, hierarchical reduction over "
               "uniform nodes");

  auto state = std::make_shared<ReducerState>();
  state->buf = buf;
  state->timeout_s = opts.timeout_s;
  if (opts.kind == "mpi") state->max_in_flight = kMpiBucketsInFlight;
  state->padded_size = padded_size;
  state->reported_size = opts.reported_size ? opts.reported_size : padded_size;
  state->local_rank = hierarchical ? topo.local_rank : 0;
  state->local_size = hierarchical ? topo.local_size : 1;

  // Stages a rank would run alone are skipped: one rank per node needs no node steps; a world
  // of one rank needs nothing.
  auto add_stage_to = [&](std::vector<Stage>& stages, StageOp op, MPI_Comm base, const char* what) {
    MPI_Comm dup = dup_comm(base, what);
    state->owned_comms.push_back(dup);
    stages.push_back(Stage{op, make_communicator(opts.kind, dup, opts.timeout_s)});
  };
  auto add_stage = [&](StageOp op, MPI_Comm base, const char* what) { add_stage_to(state->stages, op, base, what); };
  auto add_gather = [&](StageOp op, MPI_Comm base, const char* what) {
    add_stage_to(state->gather_stages, op, base, what);
  };
  if (opts.shard) {
    // The scatter stages, and the gathers that undo them in reverse order.
    if (hierarchical && topo.num_nodes == 1) {
      if (topo.size > 1) {
        add_stage(StageOp::world_reduce_scatter, topo.node, "node");
        add_gather(StageOp::world_allgather, topo.node, "node");
      }
    } else if (hierarchical && opts.shard_within_node) {
      // HSDP: the node shard is reduced across nodes whole and stays replicated there.
      if (topo.local_size > 1) add_stage(StageOp::node_reduce_scatter, topo.node, "node");
      add_stage(StageOp::cross_allreduce, topo.cross, "cross");
      if (topo.local_size > 1) add_gather(StageOp::node_allgather, topo.node, "node");
    } else if (hierarchical) {
      if (topo.local_size > 1) add_stage(StageOp::node_reduce_scatter, topo.node, "node");
      add_stage(StageOp::cross_reduce_scatter, topo.cross, "cross");
      add_gather(StageOp::cross_allgather, topo.cross, "cross");
      if (topo.local_size > 1) add_gather(StageOp::node_allgather, topo.node, "node");
    } else if (topo.size > 1) {
      add_stage(StageOp::world_reduce_scatter, topo.world, "world");
      add_gather(StageOp::world_allgather, topo.world, "world");
    }
  } else if (hierarchical && topo.num_nodes == 1) {
    // One node: reduce-scatter + allgather inside it is an allreduce done in two calls; one
    // call lets MPI pick its best single-node algorithm.
    if (topo.size > 1) add_stage(StageOp::world_allreduce, topo.node, "node");
  } else if (hierarchical) {
    if (topo.local_size > 1) add_stage(StageOp::node_reduce_scatter, topo.node, "node");
    add_stage(StageOp::cross_allreduce, topo.cross, "cross");
    if (topo.local_size > 1) add_stage(StageOp::node_allgather, topo.node, "node");
  } else if (topo.size > 1) {
    add_stage(StageOp::world_allreduce, topo.world, "world");
  }

  // Buckets of whole node shards; 64-element shards keep every shard 256-byte aligned when the
  // buffer itself is (the trainer pads to local_size * 64).
  const size_t unit = opts.shard ? size_t(topo.size) : size_t(state->local_size);
  size_t bucket_elems = std::max<size_t>(opts.bucket_bytes / sizeof(float), 1);
  const size_t aligned_unit = unit * 64;
  bucket_elems = bucket_elems >= aligned_unit ? bucket_elems / aligned_unit * aligned_unit
                                              : std::max(unit, bucket_elems / unit * unit);
  for (size_t end = padded_size; end > 0;) {
    const size_t begin = end > bucket_elems ? end - bucket_elems : 0;
    Bucket b;
    b.offset = begin;
    b.count = end - begin;
    // What this rank holds reduced once the stages ran: each scatter keeps this rank's block of
    // what the previous one left it.
    b.owned_offset = b.offset;
    b.owned_count = b.count;
    for (const Stage& stage : state->stages) {
      if (stage.op == StageOp::node_reduce_scatter) {
        b.owned_count /= size_t(state->local_size);
        b.owned_offset += size_t(state->local_rank) * b.owned_count;
      } else if (stage.op == StageOp::cross_reduce_scatter || stage.op == StageOp::world_reduce_scatter) {
        b.owned_count /= size_t(stage.comm->size());
        b.owned_offset += size_t(stage.comm->rank()) * b.owned_count;
      }
    }
    state->buckets.push_back(std::move(b));
    end = begin;
  }
  state->reset_step();

  const OverlapMode mode = resolve_overlap(opts.overlap, opts.kind, topo.rank);
  // Automatic overlap runs nonblocking collectives from the thread: blocking ones spin on the
  // core backward needs, and on a busy or oversubscribed node a spinning rank also starves its
  // peers (docs/comm.md has the measurements).
  const bool blocking = opts.overlap == OverlapMode::automatic ? false : opts.blocking_collectives;
  return std::make_unique<BucketGradientReducer>(std::move(state), mode, blocking);
}

std::unique_ptr<GradientReducer> make_gradient_reducer(const Topology& topo, const std::string& kind,
                                                       const std::string& algo, float* buf, size_t padded_size,
                                                       size_t bucket_bytes, bool overlap) {
  ReducerOptions opts;
  opts.kind = kind;
  opts.algo = algo;
  opts.bucket_bytes = bucket_bytes;
  opts.overlap = overlap ? OverlapMode::automatic : OverlapMode::off;
  return make_gradient_reducer(topo, buf, padded_size, opts);
}

ReduceScatterScratch mpi_reduce_scatter_scratch(uint64_t bucket_bytes, int group_size) {
  // Rank r receives in round k (from rank r + 2^(k-1)) while r is a multiple of 2^k and that
  // peer exists; a rank's first send ends its rounds (nbc_ireduce_scatter_block.c).
  auto halves_written = [group_size](int r) {
    uint64_t receives = 0;
    for (int step = 1; step < group_size && r % (2 * step) == 0; step *= 2)
      receives += r + step < group_size ? 1 : 0;
    return std::min<uint64_t>(receives, 2);
  };
  ReduceScatterScratch scratch;
  const uint64_t per_half = kMpiBucketsInFlight * bucket_bytes;
  scratch.rank0 = halves_written(0) * per_half;
  for (int r = 1; r < group_size; ++r) scratch.other = std::max(scratch.other, halves_written(r) * per_half);
  return scratch;
}

void GradientReducer::throw_no_bf16_gather() {
  KILTER_FAIL("gradient reducer: this reducer gathers no bf16 working copy (only train.shard = optimizer's does)");
}

}  // namespace kilter::comm
