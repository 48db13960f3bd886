// Watchdog (see watchdog.h). Design, chosen to work with Open MPI 4.1 under MPI_THREAD_MULTIPLE
// and without any one-sided progress guarantees:
//  - enter()/leave() only touch a mutex-guarded record (section name, step, a per-rank sequence
//    number of sections entered, the time entered); no MPI call on the training thread.
//  - Each rank's watchdog thread polls its record a few times a second and, on a private
//    duplicate of the world communicator, answers "where are you?" queries from other ranks with
//    that record (a posted MPI_Irecv it tests; the thread's MPI_Test calls also drive progress).
//  - When this rank's section exceeds timeout_s, its thread asks every other rank, waits a few
//    seconds for answers, and calls a rank "not arrived" when its sequence number is behind ours
//    (it has not entered this collective yet) or it did not answer. Every rank calls the same
//    collectives in the same order, so sequence numbers line up. Then it prints
//    "rank R: <what> at step S has not completed after T s; ranks not arrived: ..." (with the
//    missing ranks grouped by host when the job spans several hosts: a lost node shows as all of
//    its ranks) and calls MPI_Abort(world, 1).
// Without MPI_THREAD_MULTIPLE the thread makes no MPI call but MPI_Abort, and says that it could
// not ask the other ranks.
#include "lib/train/watchdog.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "lib/comm/abort_hooks.h"

namespace kilter::train {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kQueryTag = 8101;
constexpr int kReplyTag = 8102;

// A rank's answer to "where are you?" (sent as bytes; every rank runs the same build).
struct Whereabouts {
  int64_t sections_entered = 0;  // sequence number of the last section entered
  int64_t inside = 0;            // 1 while inside that section
  int64_t step = -1;
  char what[48] = {0};
};

bool mpi_is_usable() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return !finalized;
}

}  // namespace

struct Watchdog::Impl {
  MPI_Comm world = MPI_COMM_NULL;
  MPI_Comm queries = MPI_COMM_NULL;  // private duplicate: our tags never meet the trainer's
  int rank = 0;
  int size = 1;
  double timeout_s = 0;
  bool can_ask = false;  // MPI_THREAD_MULTIPLE: the thread may use MPI

  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  Whereabouts here;            // guarded by mu
  Clock::time_point entered;   // guarded by mu
  std::shared_ptr<const std::atomic<bool>> done;  // guarded by mu: the section completed elsewhere
  std::thread thread;

  // Thread-only MPI state.
  int64_t incoming_query = 0;
  MPI_Request query_request = MPI_REQUEST_NULL;
  std::deque<std::pair<MPI_Request, Whereabouts>> replies_in_flight;
  // The asking side's buffers live here, not on the stack: requests still open when we give up
  // waiting stay valid until MPI_Abort.
  std::vector<int64_t> query_payload;
  std::vector<Whereabouts> answers;
  std::vector<MPI_Request> sends, receives;
  int thread_level = MPI_THREAD_SINGLE;
  std::vector<std::string> hosts;  // every rank's host (MPI_Get_processor_name), when can_ask

  // `here`, with a section that completed on another thread reported as left. mu held.
  Whereabouts current() const {
    Whereabouts w = here;
    if (w.inside && done && done->load(std::memory_order_acquire)) w.inside = 0;
    return w;
  }

  Whereabouts snapshot() {
    std::lock_guard<std::mutex> lock(mu);
    return current();
  }

  void post_query_receive() {
    MPI_Irecv(&incoming_query, 1, MPI_INT64_T, MPI_ANY_SOURCE, kQueryTag, queries, &query_request);
  }

  // Answers every query that has arrived; retires finished answers.
  void answer_queries() {
    for (;;) {
      int arrived = 0;
      MPI_Status status;
      MPI_Test(&query_request, &arrived, &status);
      if (!arrived) break;
      replies_in_flight.emplace_back(MPI_REQUEST_NULL, snapshot());
      auto& reply = replies_in_flight.back();
      MPI_Isend(&reply.second, sizeof(Whereabouts), MPI_BYTE, status.MPI_SOURCE, kReplyTag, queries, &reply.first);
      post_query_receive();
    }
    while (!replies_in_flight.empty()) {
      int done = 0;
      MPI_Test(&replies_in_flight.front().first, &done, MPI_STATUS_IGNORE);
      if (!done) break;
      replies_in_flight.pop_front();
    }
  }

  // Asks every other rank where it is; describes those behind `mine` or silent.
  std::string ranks_not_arrived(const Whereabouts& mine) {
    if (size == 1) return "none (this is the only rank)";
    if (!can_ask) return "unknown (MPI was not initialized with MPI_THREAD_MULTIPLE, so the watchdog cannot ask)";
    query_payload.assign(size_t(size), mine.sections_entered);
    answers.assign(size_t(size), Whereabouts{});
    sends.assign(size_t(size), MPI_REQUEST_NULL);
    receives.assign(size_t(size), MPI_REQUEST_NULL);
    std::vector<int> answered(size_t(size), 0);
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      MPI_Irecv(&answers[size_t(r)], sizeof(Whereabouts), MPI_BYTE, r, kReplyTag, queries, &receives[size_t(r)]);
      MPI_Isend(&query_payload[size_t(r)], 1, MPI_INT64_T, r, kQueryTag, queries, &sends[size_t(r)]);
    }
    const auto deadline = Clock::now() + std::chrono::duration<double>(std::clamp(timeout_s, 1.0, 5.0));
    int pending = size - 1;
    while (pending > 0 && Clock::now() < deadline) {
      answer_queries();  // other ranks' watchdogs may be asking us at the same time
      for (int r = 0; r < size; ++r) {
        if (r == rank || answered[size_t(r)]) continue;
        MPI_Test(&receives[size_t(r)], &answered[size_t(r)], MPI_STATUS_IGNORE);
        if (answered[size_t(r)]) --pending;
      }
      if (pending > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    // Requests still open are abandoned: MPI_Abort follows.
    std::vector<std::string> behind;
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      const Whereabouts& w = answers[size_t(r)];
      std::string item = std::to_string(r);
      if (!answered[size_t(r)]) {
        behind.push_back(item + " (no answer)");
      } else if (w.sections_entered < mine.sections_entered) {
        if (w.inside)
          item += " (still in '" + std::string(w.what) + "' at step " + std::to_string(w.step) + ")";
        else if (w.sections_entered == 0)
          item += " (has not reached its first collective)";
        else
          item += " (working since '" + std::string(w.what) + "' at step " + std::to_string(w.step) + ")";
        behind.push_back(item);
      }
    }
    if (behind.empty()) return "none found (every rank has entered it: a communication-layer hang?)";
    std::string text;
    for (const auto& b : behind) text += (text.empty() ? "" : ", ") + b;
    // On several hosts, say where the missing ranks are: a whole node missing is a lost node.
    std::map<std::string, std::string> missing_by_host;
    for (int r = 0; r < size && size_t(size) == hosts.size(); ++r) {
      if (r == rank) continue;
      if (answered[size_t(r)] && answers[size_t(r)].sections_entered >= mine.sections_entered) continue;
      std::string& ranks = missing_by_host[hosts[size_t(r)]];
      ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
    }
    const bool several_hosts = std::any_of(hosts.begin(), hosts.end(), [&](const std::string& h) { return h != hosts[0]; });
    if (several_hosts && !missing_by_host.empty()) {
      text += " [by host:";
      for (const auto& [host, ranks] : missing_by_host) text += " " + host + ": " + ranks + ";";
      text.back() = ']';
    }
    return text;
  }

  [[noreturn]] void fire(const Whereabouts& mine, double seconds) {
    const std::string missing = ranks_not_arrived(mine);
    std::fprintf(stderr,
                 "kilter: rank %d: %s at step %lld has not completed after %.0f s; ranks not arrived: %s "
                 "(comm.timeout_s = %g; aborting the job)\n",
                 rank, mine.what, (long long)mine.step, seconds, missing.c_str(), timeout_s);
    // NCCL communicators first: this rank leaves any collective its peers stalled in at once.
    const int aborted = comm::run_abort_hooks();
    if (aborted > 0) std::fprintf(stderr, "kilter: rank %d: %d NCCL communicator(s) aborted (ncclCommAbort)\n", rank, aborted);
    std::fflush(stderr);
    std::fflush(stdout);
    MPI_Abort(world, 1);
    std::_Exit(1);  // MPI_Abort does not return; this keeps [[noreturn]] honest
  }

  void run() {
    if (can_ask) post_query_receive();
    // Answers must come within the asker's wait (1-5 s); checks need not be finer than that.
    const auto poll = std::chrono::milliseconds(can_ask ? 100 : std::clamp(int(timeout_s * 250), 10, 1000));
    std::unique_lock<std::mutex> lock(mu);
    while (!stopping) {
      cv.wait_for(lock, poll);
      if (stopping) break;
      const Whereabouts mine = current();
      const double seconds = std::chrono::duration<double>(Clock::now() - entered).count();
      lock.unlock();
      if (can_ask) answer_queries();
      if (mine.inside && seconds > timeout_s) fire(mine, seconds);
      lock.lock();
    }
    lock.unlock();
    if (!can_ask || !mpi_is_usable()) return;
    MPI_Cancel(&query_request);
    MPI_Wait(&query_request, MPI_STATUS_IGNORE);
    // Answers not yet delivered: give them a moment, then let MPI finish them on its own.
    const auto deadline = Clock::now() + std::chrono::seconds(1);
    while (!replies_in_flight.empty() && Clock::now() < deadline) {
      int done = 0;
      MPI_Test(&replies_in_flight.front().first, &done, MPI_STATUS_IGNORE);
      if (done) replies_in_flight.pop_front();
      else std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    for (auto& r : replies_in_flight) MPI_Request_free(&r.first);
    replies_in_flight.clear();
  }
};

Watchdog::Watchdog(MPI_Comm world, double timeout_s) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.world = world;
  s.timeout_s = timeout_s;
  MPI_Comm_rank(world, &s.rank);
  MPI_Comm_size(world, &s.size);
  if (timeout_s <= 0) return;  // disabled
  MPI_Query_thread(&s.thread_level);
  s.can_ask = s.thread_level == MPI_THREAD_MULTIPLE && s.size > 1;
  // Collective; every rank makes the same choice (one MPI library, one MPI_Init_thread call).
  if (s.can_ask) {
    MPI_Comm_dup(world, &s.queries);
    char name[MPI_MAX_PROCESSOR_NAME] = {0};
    int length = 0;
    MPI_Get_processor_name(name, &length);
    std::vector<char> all(size_t(s.size) * MPI_MAX_PROCESSOR_NAME);
    MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, world);
    for (int r = 0; r < s.size; ++r) s.hosts.emplace_back(&all[size_t(r) * MPI_MAX_PROCESSOR_NAME]);
  }
  s.thread = std::thread([&s] { s.run(); });
}

Watchdog::~Watchdog() {
  Impl& s = *impl_;
  if (s.thread.joinable()) {
    {
      std::lock_guard<std::mutex> lock(s.mu);
      s.stopping = true;
    }
    s.cv.notify_all();
    s.thread.join();
  }
  if (s.queries != MPI_COMM_NULL && mpi_is_usable()) MPI_Comm_free(&s.queries);
}

void Watchdog::enter(const char* what, long step, std::shared_ptr<const std::atomic<bool>> done) {
  Impl& s = *impl_;
  std::lock_guard<std::mutex> lock(s.mu);
  ++s.here.sections_entered;
  s.here.inside = 1;
  s.here.step = step;
  std::snprintf(s.here.what, sizeof(s.here.what), "%s", what ? what : "?");
  s.entered = Clock::now();
  s.done = std::move(done);
}

void Watchdog::leave() {
  Impl& s = *impl_;
  std::lock_guard<std::mutex> lock(s.mu);
  s.here.inside = 0;
  s.done.reset();
}

}  // namespace kilter::train
