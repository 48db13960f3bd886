// RankDiagnostics (see diagnostics.h): per-step phase timers on the host steady clock, the
// arrival time at the gradient collective on the rank-0-aligned clock, the per-rank CSV and
// trace files, the per-step gather of every rank's record to rank 0, the live straggler watch
// and summary.json. Per phase only the clock is read (no syscalls); files are written once per
// step.
#include "lib/diag/diagnostics.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "io/base/error.h"
#include "io/base/mpi_check.h"
#include "lib/diag/clock_sync.h"
#include "lib/diag/metrics_csv.h"
#include "lib/diag/run_statistics.h"
#include "lib/diag/straggler_watch.h"
#include "lib/diag/tensorboard_writer.h"
#include "lib/diag/trace_writer.h"

namespace kilter::diag {

namespace {
constexpr const char* kPhaseNames[kNumPhases] = {"data_wait",    "h2d",          "forward",      "backward",
                                                 "kv_wait",      "gather_wait",  "scatter_wait", "comm_exposed",
                                                 "optimizer",    "step_total"};

void make_directory(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  // Another rank may have created it at the same moment; only a missing directory is an error.
  KILTER_CHECK(std::filesystem::is_directory(dir), "cannot create directory " << dir << ": " << ec.message());
}

// Current resident set from /proc/self/statm (one pread on a descriptor kept open).
uint64_t current_rss_bytes(int statm_fd) {
  if (statm_fd < 0) return 0;
  char buf[128];
  ssize_t n = pread(statm_fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return 0;
  buf[n] = '\0';
  unsigned long long size_pages = 0, resident_pages = 0;
  if (std::sscanf(buf, "%llu %llu", &size_pages, &resident_pages) != 2) return 0;
  return uint64_t(resident_pages) * uint64_t(sysconf(_SC_PAGESIZE));
}
}  // namespace

const char* phase_name(int phase) {
  return phase >= 0 && phase < kNumPhases ? kPhaseNames[phase] : "unknown";
}

int phase_from_name(const std::string& name) {
  for (int p = 0; p < kNumPhases; ++p)
    if (name == kPhaseNames[p]) return p;
  return -1;
}

InjectDelay parse_inject_delay(const std::string& text) {
  InjectDelay d;
  if (text.empty()) return d;
  const char* expected = "expected RANK:SECONDS[:PHASE] or RANK:SHARE%[:PHASE], e.g. 2:0.05:forward or 5:15%";
  std::vector<std::string> parts;
  size_t begin = 0;
  while (true) {
    size_t colon = text.find(':', begin);
    parts.push_back(text.substr(begin, colon == std::string::npos ? std::string::npos : colon - begin));
    if (colon == std::string::npos) break;
    begin = colon + 1;
  }
  KILTER_CHECK(parts.size() == 2 || parts.size() == 3,
               "config key train.inject_delay = '" << text << "': " << expected);
  char* end = nullptr;
  long rank = std::strtol(parts[0].c_str(), &end, 10);
  KILTER_CHECK(!parts[0].empty() && *end == '\0' && rank >= 0 && rank < (1L << 30),
               "config key train.inject_delay = '" << text << "': RANK '" << parts[0]
                                                   << "' is not a rank number; " << expected);
  const bool proportional = !parts[1].empty() && parts[1].back() == '%';
  const std::string amount = proportional ? parts[1].substr(0, parts[1].size() - 1) : parts[1];
  double seconds = std::strtod(amount.c_str(), &end);
  if (proportional)
    KILTER_CHECK(!amount.empty() && *end == '\0' && std::isfinite(seconds) && seconds >= 0 && seconds <= 1000,
                 "config key train.inject_delay = '" << text << "': SHARE '" << parts[1]
                                                     << "' must be a percentage in [0%, 1000%]");
  else
    KILTER_CHECK(!amount.empty() && *end == '\0' && std::isfinite(seconds) && seconds >= 0 && seconds <= 3600,
                 "config key train.inject_delay = '" << text << "': SECONDS '" << parts[1]
                                                     << "' must be a number of seconds in [0, 3600]");
  Phase phase = kForward;
  if (parts.size() == 3) {
    int p = phase_from_name(parts[2]);
    KILTER_CHECK(p >= 0 && p != kCommExposed && p != kKvWait && p != kGatherWait && p != kScatterWait &&
                     p != kStepTotal,
                 "config key train.inject_delay = '" << text << "': PHASE '" << parts[2]
                     << "' must be one of data_wait | h2d | forward | backward | optimizer");
    phase = Phase(p);
  }
  d.active = true;
  d.rank = int(rank);
  d.seconds = proportional ? 0 : seconds;
  d.share = proportional ? seconds / 100 : 0;
  d.every_compute = proportional && parts.size() == 2;
  d.phase = phase;
  return d;
}

uint64_t RankDiagnostics::peak_rss_bytes() {
  struct rusage usage {};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return uint64_t(usage.ru_maxrss) * 1024;  // Linux reports kilobytes
}

struct RankDiagnostics::Impl {
  struct PhaseEvent {
    int phase;
    int64_t begin_ns;
    int64_t end_ns;
    int detail = -1;  // a nested wait: index into wait_details
  };

  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
  DiagOptions opts;
  InjectDelay delay;
  ClockAlignment clock;
  int64_t max_rtt_ns = 0;  // rank 0: the worst best-round-trip of the alignment
  std::unique_ptr<MetricsCsvWriter> csv;
  std::unique_ptr<TraceWriter> trace;
  // output.tensorboard: rank 0's step scalars (tensorboard/) and this rank's phases
  // (tensorboard/rank-NNNNN/). Each rank writes its own file, so the phases need no gather and
  // rank 0 no work per rank; rank 0's balance scalars come from the gather it already makes.
  std::unique_ptr<TensorBoardWriter> tb_run;   // rank 0
  std::unique_ptr<TensorBoardWriter> tb_rank;
  int statm_fd = -1;

  StepRecord current;
  int64_t step_begin_ns = 0;
  int64_t phase_begin_ns[kNumPhases] = {};
  int64_t arrival_ns = -1;
  int64_t previous_end_ns = 0;
  bool delay_done = false;
  bool in_step = false;
  uint64_t device_peak = 0;
  std::vector<PhaseEvent> events;
  std::vector<std::string> wait_details;  // trace args of this step's nested wait spans
  // The waits (kv_wait, gather_wait, scatter_wait) nest in forward and backward: the running
  // total of the step's waits and its value when each phase began, so phase_end takes the waits
  // inside it out.
  int64_t nested_wait_ns = 0;
  int64_t nested_wait_at_begin[kNumPhases] = {};
  std::vector<std::pair<int, double>> kv_wait_by_peer;  // this step: (rank, seconds waited for it)
  int64_t steps_done = 0;
  int64_t tokens_total = 0;
  double last_loss = 0;
  int64_t first_begin_ns = -1;

  StepRecord gather_send;
  std::vector<StepRecord> gather_recv;
  MPI_Request gather_request = MPI_REQUEST_NULL;
  std::unique_ptr<RunStatistics> stats;   // rank 0
  std::unique_ptr<StragglerWatch> watch;  // rank 0
  bool finished = false;

  double aligned_seconds(int64_t local_ns) const {
    return double(local_ns + clock.offset_ns - clock.run_start_ns) * 1e-9;
  }
  double aligned_us(int64_t local_ns) const {
    return double(local_ns + clock.offset_ns - clock.run_start_ns) * 1e-3;
  }

  std::function<void(const StepRecord*, int)> records_hook;  // on_step_records (rank 0)
  // Completes the gather of the previous step (posted one step earlier, so nobody waits for
  // it now) and, on rank 0, feeds it to the statistics, the records hook and the live watch.
  void complete_gather() {
    if (gather_request == MPI_REQUEST_NULL) return;
    KILTER_MPI_CHECK(MPI_Wait(&gather_request, MPI_STATUS_IGNORE),
                     "diagnostics: MPI_Wait (step record gather)");
    if (rank != 0) return;
    stats->add_step(gather_recv.data());
    if (records_hook) records_hook(gather_recv.data(), size);
    const int64_t completed = gather_recv[0].step + 1;  // steps completed, as train.csv counts them
    if (tb_run && completed % opts.log_every == 0) {
      tb_run->add_scalars(completed, {{"balance/step_time_imbalance", stats->last_step_imbalance()},
                                      {"balance/sync_wait_share", stats->last_step_sync_wait_share()}});
      tb_run->flush();
    }
    std::string warning = watch->add_step(gather_recv.data());
    if (!warning.empty()) std::fprintf(stderr, "%s\n", warning.c_str());
  }
};

RankDiagnostics::RankDiagnostics(MPI_Comm world, const DiagOptions& opts) : impl_(new Impl) {
  Impl& d = *impl_;
  d.opts = opts;
  KILTER_MPI_CHECK(MPI_Comm_dup(world, &d.comm), "diagnostics: MPI_Comm_dup");
  KILTER_MPI_CHECK(MPI_Comm_rank(d.comm, &d.rank), "diagnostics: MPI_Comm_rank");
  KILTER_MPI_CHECK(MPI_Comm_size(d.comm, &d.size), "diagnostics: MPI_Comm_size");
  d.delay = parse_inject_delay(opts.inject_delay);
  KILTER_CHECK(!d.delay.active || d.delay.rank < d.size,
               "config key train.inject_delay = '" << opts.inject_delay << "': rank " << d.delay.rank
                                                   << " does not exist (world size " << d.size << ")");
  KILTER_CHECK(!opts.run_dir.empty(), "diagnostics: output.dir is empty");
  KILTER_CHECK(opts.stall_factor > 1, "config key output.stall_factor = " << opts.stall_factor
                                                                          << ": must be > 1");

  d.clock = align_clocks(d.comm);
  int64_t rtt = d.clock.best_rtt_ns;
  KILTER_MPI_CHECK(MPI_Reduce(&rtt, &d.max_rtt_ns, 1, MPI_INT64_T, MPI_MAX, 0, d.comm), "diagnostics: MPI_Reduce");

  make_directory(opts.run_dir + "/metrics");
  d.csv = std::make_unique<MetricsCsvWriter>(metrics_path(opts.run_dir, d.rank), opts.resume);
  if (opts.trace_steps > 0) {
    make_directory(opts.run_dir + "/trace");
    d.trace = std::make_unique<TraceWriter>(trace_path(opts.run_dir, d.rank), d.rank);
  }
  if (opts.tensorboard) {
    KILTER_CHECK(opts.log_every >= 1, "config key output.log_every = " << opts.log_every << ": must be >= 1");
    char folder[32];
    std::snprintf(folder, sizeof folder, "rank-%05d", d.rank);
    if (d.rank == 0) d.tb_run = std::make_unique<TensorBoardWriter>(opts.run_dir + "/tensorboard", opts.resume);
    d.tb_rank = std::make_unique<TensorBoardWriter>(opts.run_dir + "/tensorboard/" + folder, opts.resume);
  }
  d.statm_fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  d.events.reserve(64);
  if (d.rank == 0) {
    d.gather_recv.resize(d.size);
    d.stats = std::make_unique<RunStatistics>(d.size, opts.stall_factor);
    d.watch = std::make_unique<StragglerWatch>(d.size, opts.warn_window);
  }
  d.previous_end_ns = steady_now_ns();
}

RankDiagnostics::~RankDiagnostics() {
  Impl& d = *impl_;
  if (d.statm_fd >= 0) close(d.statm_fd);
  int finalized = 0;
  MPI_Finalized(&finalized);
  // A pending gather (a run that ended by an error) cannot be cancelled; the communicator is
  // then left to MPI_Finalize or the abort.
  if (!finalized && d.comm != MPI_COMM_NULL && d.gather_request == MPI_REQUEST_NULL) MPI_Comm_free(&d.comm);
}

void RankDiagnostics::begin_step(int64_t step) {
  Impl& d = *impl_;
  int64_t now = steady_now_ns();
  d.current = StepRecord{};
  d.current.step = step;
  d.current.rank = d.rank;
  d.current.start = d.aligned_seconds(now);
  d.current.outside = double(now - d.previous_end_ns) * 1e-9;
  d.current.device_peak_bytes = d.device_peak;
  d.step_begin_ns = now;
  if (d.first_begin_ns < 0) d.first_begin_ns = now;
  d.arrival_ns = -1;
  d.delay_done = false;
  d.in_step = true;
  d.events.clear();
  d.wait_details.clear();
  d.nested_wait_ns = 0;
  d.kv_wait_by_peer.clear();
}

void RankDiagnostics::phase_begin(Phase p) {
  impl_->phase_begin_ns[p] = steady_now_ns();
  impl_->nested_wait_at_begin[p] = impl_->nested_wait_ns;
}

void RankDiagnostics::phase_end(Phase p) {
  Impl& d = *impl_;
  if (d.delay.active && d.rank == d.delay.rank && d.delay.share > 0 &&
      (d.delay.every_compute ? p == kForward || p == kBackward : p == d.delay.phase)) {
    // The proportional drill: a share of the phase's own time (its waits for K/V and for sharded
    // units left out), every time, so the rank is that much slower on whatever work it gets.
    const int64_t spent =
        steady_now_ns() - d.phase_begin_ns[p] - (d.nested_wait_ns - d.nested_wait_at_begin[p]);
    std::this_thread::sleep_for(std::chrono::duration<double>(d.delay.share * double(std::max<int64_t>(spent, 0)) * 1e-9));
  } else if (d.delay.active && !d.delay_done && p == d.delay.phase && d.rank == d.delay.rank) {
    // The drill: once per step, inside the phase, so the trainer cannot tell it from real work.
    std::this_thread::sleep_for(std::chrono::duration<double>(d.delay.seconds));
    d.delay_done = true;
  }
  int64_t now = steady_now_ns();
  const int64_t nested_wait = d.nested_wait_ns - d.nested_wait_at_begin[p];
  d.current.phase[p] += double(now - d.phase_begin_ns[p] - nested_wait) * 1e-9;
  if (d.trace && d.steps_done < d.opts.trace_steps) d.events.push_back({p, d.phase_begin_ns[p], now});
}

void RankDiagnostics::kv_wait(const KvWait& wait) {
  Impl& d = *impl_;
  const int64_t ns = std::max<int64_t>(0, wait.end_ns - wait.begin_ns);
  d.nested_wait_ns += ns;
  d.current.phase[kKvWait] += double(ns) * 1e-9;
  if (wait.peer >= 0) {
    auto it = std::find_if(d.kv_wait_by_peer.begin(), d.kv_wait_by_peer.end(),
                           [&](const std::pair<int, double>& e) { return e.first == wait.peer; });
    if (it == d.kv_wait_by_peer.end()) it = d.kv_wait_by_peer.insert(it, {wait.peer, 0.0});
    it->second += double(ns) * 1e-9;
  }
  if (d.trace && d.steps_done < d.opts.trace_steps) {
    nlohmann::json args = {{"layer", wait.layer},
                           {"direction", wait.backward ? "backward" : "forward"},
                           {"waited_for_rank", wait.peer},
                           {"piece", wait.piece}};
    d.events.push_back({kKvWait, wait.begin_ns, wait.end_ns, int(d.wait_details.size())});
    d.wait_details.push_back(args.dump());
  }
}

void RankDiagnostics::unit_wait(Phase wait, int64_t begin_ns, int64_t end_ns, int unit) {
  Impl& d = *impl_;
  KILTER_CHECK(wait == kGatherWait || wait == kScatterWait,
               "diagnostics: unit_wait takes gather_wait or scatter_wait, not " << phase_name(wait));
  if (!d.in_step) return;
  const int64_t ns = std::max<int64_t>(0, end_ns - begin_ns);
  d.nested_wait_ns += ns;
  d.current.phase[wait] += double(ns) * 1e-9;
  if (d.trace && d.steps_done < d.opts.trace_steps) {
    d.events.push_back({wait, begin_ns, end_ns, int(d.wait_details.size())});
    d.wait_details.push_back(nlohmann::json{{"unit", unit}}.dump());
  }
}

void RankDiagnostics::add_phase_seconds(Phase p, double seconds) {
  Impl& d = *impl_;
  d.current.phase[p] += seconds;
  if (d.trace && d.steps_done < d.opts.trace_steps) {
    // Measured elsewhere; placed as ending now, which is where the trainer reports it.
    int64_t now = steady_now_ns();
    d.events.push_back({p, now - int64_t(seconds * 1e9), now});
  }
}

void RankDiagnostics::on_step_records(std::function<void(const StepRecord*, int)> fn) {
  impl_->records_hook = std::move(fn);
}

void RankDiagnostics::log_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars) {
  if (!impl_->tb_run) return;
  impl_->tb_run->add_scalars(step, scalars);
  impl_->tb_run->flush();
}

void RankDiagnostics::mark_arrival() { impl_->arrival_ns = steady_now_ns(); }

void RankDiagnostics::set_step_work(int64_t tokens_computed, double attn_work, int32_t micro_batches,
                                    int64_t kv_tokens, int64_t kv_bytes) {
  impl_->current.kv_tokens = kv_tokens;
  impl_->current.kv_bytes = kv_bytes;
  impl_->current.tokens_computed = tokens_computed;
  impl_->current.micro_batches = micro_batches;
  impl_->current.attn_work = attn_work;
}

void RankDiagnostics::set_device_peak_bytes(uint64_t bytes) {
  impl_->device_peak = bytes;
  impl_->current.device_peak_bytes = bytes;
}

void RankDiagnostics::end_step(int64_t step, int64_t tokens, double loss) {
  Impl& d = *impl_;
  KILTER_CHECK(d.in_step, "diagnostics: end_step(" << step << ") without begin_step");
  int64_t now = steady_now_ns();
  d.in_step = false;
  StepRecord& r = d.current;
  r.step = step;
  r.tokens = tokens;
  r.loss = loss;
  r.phase[kStepTotal] = double(now - d.step_begin_ns) * 1e-9;
  // Without mark_arrival, the best estimate is the step's end minus the exposed wait.
  int64_t arrival = d.arrival_ns >= 0 ? d.arrival_ns : now - int64_t(r.phase[kCommExposed] * 1e9);
  r.arrival = d.aligned_seconds(arrival);
  r.rss_bytes = current_rss_bytes(d.statm_fd);
  // getrusage and statm count slightly differently; the peak is never below a sample.
  r.peak_rss_bytes = std::max(peak_rss_bytes(), r.rss_bytes);
  r.kv_wait_peer = -1;
  double longest = 0;
  for (const auto& [peer, seconds] : d.kv_wait_by_peer)
    if (r.kv_wait_peer < 0 || seconds > longest) {
      r.kv_wait_peer = peer;
      longest = seconds;
    }
  d.csv->append(r);
  if (d.tb_rank && (step + 1) % d.opts.log_every == 0) {
    const std::string prefix = "rank/" + std::to_string(d.rank) + "/";
    std::vector<std::pair<std::string, double>> phases;
    for (int p = 0; p < kNumPhases; ++p) phases.emplace_back(prefix + kPhaseNames[p], r.phase[p]);
    d.tb_rank->add_scalars(step + 1, phases);
    d.tb_rank->flush();
  }
  d.tokens_total += tokens;
  d.last_loss = loss;

  if (d.trace && d.steps_done < d.opts.trace_steps) {
    d.trace->add_complete("step " + std::to_string(step), d.aligned_us(d.step_begin_ns),
                          double(now - d.step_begin_ns) * 1e-3, step);
    for (const auto& e : d.events)
      d.trace->add_complete(phase_name(e.phase), d.aligned_us(e.begin_ns), double(e.end_ns - e.begin_ns) * 1e-3, step,
                            e.detail >= 0 ? d.wait_details[size_t(e.detail)] : std::string());
    d.trace->add_instant("arrival", d.aligned_us(arrival), step);
    d.trace->flush();
  }
  d.steps_done += 1;

  d.complete_gather();
  d.gather_send = r;
  KILTER_MPI_CHECK(MPI_Igather(&d.gather_send, sizeof(StepRecord), MPI_BYTE,
                               d.rank == 0 ? static_cast<void*>(d.gather_recv.data()) : nullptr,
                               sizeof(StepRecord), MPI_BYTE, 0, d.comm, &d.gather_request),
                   "diagnostics: MPI_Igather (step record)");
  d.previous_end_ns = steady_now_ns();
}

nlohmann::json RankDiagnostics::finish(const nlohmann::json& extra) {
  Impl& d = *impl_;
  KILTER_CHECK(!d.finished, "diagnostics: finish() called twice");
  d.finished = true;
  d.complete_gather();
  if (d.trace) d.trace->flush();
  if (d.rank != 0) return nlohmann::json();

  nlohmann::json summary = extra.is_object() ? extra : nlohmann::json::object();
  summary["world_size"] = d.size;
  if (!summary.contains("steps")) summary["steps"] = d.stats->steps();
  if (!summary.contains("final_loss") && d.steps_done > 0) summary["final_loss"] = d.last_loss;
  if (!summary.contains("tokens_per_second") && d.first_begin_ns >= 0) {
    double seconds = double(d.previous_end_ns - d.first_begin_ns) * 1e-9;
    summary["tokens_per_second"] = seconds > 0 ? double(d.tokens_total) / seconds : 0.0;
  }
  const nlohmann::json statistics = d.stats->to_json();
  for (const auto& item : statistics.items()) summary[item.key()] = item.value();
  summary["clock_alignment_max_rtt_us"] = double(d.max_rtt_ns) * 1e-3;
  if (d.delay.active && d.delay.share > 0)
    summary["inject_delay"] = {{"rank", d.delay.rank}, {"share", d.delay.share},
                               {"phase", d.delay.every_compute ? "forward+backward" : phase_name(d.delay.phase)}};
  else if (d.delay.active)
    summary["inject_delay"] = {{"rank", d.delay.rank}, {"seconds", d.delay.seconds},
                               {"phase", phase_name(d.delay.phase)}};

  // Written atomically: a reader never sees half a summary.
  std::string path = d.opts.run_dir + "/summary.json";
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    KILTER_CHECK(out, "cannot create " << tmp);
    out << summary.dump(2) << "\n";
    out.close();
    KILTER_CHECK(out, "cannot write " << tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  KILTER_CHECK(!ec, "cannot rename " << tmp << " to " << path << ": " << ec.message());
  return summary;
}

}  // namespace kilter::diag
