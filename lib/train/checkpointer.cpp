// Checkpoints of a training run (see checkpointer.h). Saving, unsharded: rank 0 copies the model
// state into host buffers at the step boundary (the only cost the step sees) and a writer thread
// turns them into RUN_DIR/checkpoints/step-NNNNNNNN.h5 while training goes on; the other ranks do
// nothing, since data-parallel ranks hold identical state. Saving with a sharded optimizer
// (train.shard_optimizer): no rank holds or copies the whole state; rank 0 creates the file, every
// rank writes the params and moments of its own ranges into it in bounded pieces, and rank 0's
// writer thread checksums, fsyncs and renames it while training goes on. Loading: rank 0 reads and
// checks the file and broadcasts the outcome first, so a bad file is the same clear error on every
// rank, never a hang.
#include "lib/train/checkpointer.h"
#include "lib/train/checkpoint_model.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "io/checkpoint.h"
#include "io/base/error.h"
#include "kilter/build_info.h"
#include "lib/train/guards.h"
#include "lib/train/root_broadcast.h"

namespace kilter::train {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// mkdir -p; returns "" or the problem.
std::string make_directories(const std::string& path) {
  std::string partial;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    partial = path.substr(0, pos);
    if (partial.empty()) continue;
    if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST)
      return "cannot create folder " + partial + ": " + std::strerror(errno);
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return path + " is not a folder";
  return "";
}

std::vector<io::CheckpointTensor> checkpoint_tensors(const model::ParamLayout& layout) {
  std::vector<io::CheckpointTensor> tensors;
  tensors.reserve(layout.tensors.size());
  for (const auto& t : layout.tensors) tensors.push_back({t.name, t.shape, t.offset, t.size});
  return tensors;
}

std::string checkpoints_dir(const std::string& run_dir) { return run_dir + "/checkpoints"; }

// The checks of a checkpoint's attributes against the run's config, before any tensor is read,
// so the message names the cause (another model, another config) rather than a tensor shape.
void check_info_against_config(const std::string& path, const io::CheckpointInfo& info, const Config& cfg,
                               const model::ModelSpec& gpt) {
  const model::ModelSpec held = spec_of(info);
  if (held != gpt) {
    KILTER_FAIL("checkpoint " << path << " holds a model with n_layer=" << info.n_layer << " n_head=" << info.n_head
                              << " n_embd=" << info.n_embd << " block_size=" << info.block_size
                              << " vocab_size=" << info.vocab_size << " (" << model::describe_spec(held)
                              << "), but the config asks for n_layer=" << gpt.n_layer << " n_head=" << gpt.n_head
                              << " n_embd=" << gpt.n_embd << " block_size=" << gpt.block_size
                              << " vocab_size=" << gpt.vocab_size << " (" << model::describe_spec(gpt)
                              << "); resume with the run's own config (config.ini in its run directory), or set "
                                 "output.dir to a new folder to start another run");
  }
  const uint64_t now_hash = cfg.hash();
  if (info.config_hash != now_hash) {
    std::vector<std::string> diffs = config_differences(info.config, cfg.to_ini(), true);
    std::string listed;
    for (const auto& d : diffs) listed += "\n    " + d;
    char hashes[96];
    std::snprintf(hashes, sizeof(hashes), "config hash %016llx, now %016llx",
                  (unsigned long long)info.config_hash, (unsigned long long)now_hash);
    KILTER_FAIL("checkpoint " << path << " was written with a different config ("
                              << (diffs.empty() ? std::string("no key differs, but the hash does")
                                                : std::to_string(diffs.size()) + " key(s) differ")
                              << "); resume with the run's own config (config.ini in its run directory), or set "
                                 "output.dir to a new folder to start another run"
                              << (diffs.empty() ? std::string("\n  was it written by kilter ") + info.kilter_version +
                                                      "? (this is " + KILTER_VERSION + ")"
                                                : std::string("\n  keys that differ (checkpoint vs now):") + listed)
                              << "\n  " << hashes
                              << "\n  Only train.steps, train.threads, output.*, data.dir/stage_dir/prefetch/"
                                 "reader_threads and comm.timeout_s may change on --resume.");
  }
}

// `text` put at the end of the first line of `message`, an advice ("; ...") or a second line
// ("\n  ..."): the headline stays first, the details last.
std::string after_first_line(const std::string& message, const std::string& text) {
  const size_t newline = std::min(message.find('\n'), message.size());
  return message.substr(0, newline) + text + message.substr(newline);
}

// "the latest checkpoint stays F" / "no checkpoint of this run exists yet".
std::string latest_checkpoint_text(const std::string& dir) {
  auto found = io::list_checkpoints(dir);
  return found.empty() ? std::string("no checkpoint of this run exists yet")
                       : "the latest checkpoint stays " + found.back().second;
}

// Whether `model` holds the moments of only some ranges (the same answer on every rank: a
// sharded model on P > 1 ranks never owns the whole buffer).
bool optimizer_sharded(const model::Model& model) {
  const std::vector<model::ParamRange> ranges = model.optimizer_ranges();
  return !(ranges.size() == 1 && ranges[0].offset == 0 && ranges[0].count >= model.layout().num_params);
}

// Floats a rank writes or reads per piece in a sharded checkpoint (16 MiB):
// lib/train/memory_plan.cpp counts two pieces per rank, and one more for rank 0's read-back.
constexpr size_t kShardPiece = size_t(1) << 22;

// Writes this rank's ranges (model.optimizer_ranges()) of params and both moments into the temp
// file `writer` opened, in pieces of kShardPiece floats: no whole shard is copied. `delay_s` > 0
// (the test hook, rank 0) sleeps once halfway through.
void write_own_slice(const model::Model& model, io::CheckpointSliceWriter& writer, double delay_s) {
  // The CPU backend's params() is host memory and is only read; a device backend's params come to
  // the host piece by piece too (copy_params_to_host).
  KILTER_CHECK(model.supports_optimizer_shard(),
               "checkpoint: the " << model.backend_name() << " backend holds a sharded optimizer it does not support");
  model::Model& source = const_cast<model::Model&>(model);
  const float* host_params = model.params_in_host_memory() ? source.params() : nullptr;
  const std::vector<model::ParamRange> ranges = model.optimizer_ranges();
  size_t total = 0;
  for (const model::ParamRange& r : ranges) total += r.count;
  // With the test hook, pieces of at most half the slice, so that the sleep comes between two.
  const size_t piece = delay_s > 0 ? std::clamp<size_t>((total + 1) / 2, 1, kShardPiece) : kShardPiece;
  std::vector<float> piece_m(std::min(total, piece)), piece_v(piece_m.size());
  std::vector<float> piece_p(host_params != nullptr ? 0 : piece_m.size());
  bool delayed = delay_s <= 0;
  size_t first = 0;  // of the shard's sequence, range after range (get_optimizer_shard's count)
  for (const model::ParamRange& r : ranges) {
    for (size_t done = 0; done < r.count;) {
      const size_t n = std::min(piece, r.count - done);
      model.get_optimizer_shard(piece_m.data(), piece_v.data(), first + done, n);
      const size_t at = r.offset + done;
      if (host_params == nullptr) source.copy_params_to_host(piece_p.data(), at, n);
      writer.write(0, at, host_params != nullptr ? host_params + at : piece_p.data(), n);
      writer.write(1, at, piece_m.data(), n);
      writer.write(2, at, piece_v.data(), n);
      done += n;
      if (!delayed && 2 * (first + done) >= total) {
        delayed = true;
        std::this_thread::sleep_for(std::chrono::duration<double>(delay_s));
      }
    }
    first += r.count;
  }
  writer.close();
}

}  // namespace

struct Checkpointer::Impl {
  MPI_Comm world = MPI_COMM_NULL;
  MPI_Comm shards = MPI_COMM_NULL;  // a dup of world for the optimizer shards' messages
  int rank = 0;
  int world_size = 1;
  std::string run_dir;
  std::string dir;  // run_dir/checkpoints
  int keep = 3;
  std::string config_text;
  std::string tokenizer, tokenizer_data;
  int64_t eos_id = -1;
  std::vector<std::pair<uint32_t, uint64_t>> document_starts;
  io::CheckpointWriteOptions write_opts;

  // The writer thread (rank 0 only) and what it shares with save()/wait().
  std::mutex mu;
  std::condition_variable cv;
  bool job_pending = false;   // a snapshot waits for / is being written
  bool job_final = false;     // ... and the run ends after it (its failure fails the run)
  bool shutting_down = false;
  std::exception_ptr error;   // the last failed write, rethrown by wait()
  io::CheckpointContents contents;  // reused between saves: no page faults on every snapshot
  std::string job_path;
  // Sharded: the job finishes the file the ranks wrote by slices (checksums, fsync, rename).
  bool job_sliced = false;
  io::CheckpointFileOffsets job_offsets;
  SaveStats stats;
  std::thread writer;

  void writer_loop() {
    // Best effort: the writer yields the CPU to the training threads (per-thread nice on Linux),
    // so on a node without spare cores the write stretches out instead of slowing rank 0's steps.
    ::setpriority(PRIO_PROCESS, pid_t(::syscall(SYS_gettid)), 10);
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      cv.wait(lock, [&] { return job_pending || shutting_down; });
      if (!job_pending) return;
      const std::string path = job_path;
      const bool final_checkpoint = job_final;
      const bool sliced = job_sliced;
      lock.unlock();
      auto t0 = std::chrono::steady_clock::now();
      std::exception_ptr failure;
      try {
        if (sliced)
          io::finish_checkpoint_file(path, contents.tensors, job_offsets);
        else
          io::write_checkpoint_file(path, contents, write_opts);
        io::prune_checkpoints(dir, keep);
      } catch (...) {
        failure = std::current_exception();
      }
      const double seconds = seconds_since(t0);
      failure = warn_if_periodic(failure, path, final_checkpoint);
      lock.lock();
      if (failure) error = failure;
      stats.write_seconds = seconds;
      stats.path = path;
      job_pending = false;
      cv.notify_all();
    }
  }

  // A periodic checkpoint that fails (full disk, quota, ...) costs only that checkpoint: the
  // previous one stays, and the next interval tries again. Said now (rank 0), and nullptr
  // returned; the failure of a final checkpoint is returned for wait() to fail the run with.
  std::exception_ptr warn_if_periodic(std::exception_ptr failure, const std::string& path, bool final_checkpoint) {
    if (!failure || final_checkpoint) return failure;
    std::string message;
    try {
      std::rethrow_exception(failure);
    } catch (const Error& e) {
      message = e.message();
    } catch (const std::exception& e) {
      message = "checkpoint " + path + " not written: " + e.what();
    }
    std::fprintf(stderr, "kilter: warning: %s\n",
                 after_first_line(message, "\n  " + latest_checkpoint_text(dir) +
                                               "; training goes on and tries again at the next checkpoint")
                     .c_str());
    return nullptr;
  }

  // The root attributes of the checkpoint of `state`.
  void fill_info(io::CheckpointInfo& info, const model::Model& model, const TrainState& state) const {
    const model::ModelSpec& gpt = model.config();
    info.format_version = io::kCheckpointFormatVersion;
    info.kilter_version = KILTER_VERSION;
    info.step = state.step;
    info.epoch = int64_t(state.position.epoch);
    info.step_in_epoch = int64_t(state.position.step_in_epoch);
    info.seed = state.seed;
    info.config_hash = state.config_hash;
    info.tokens_seen = state.tokens_seen;
    info.world_size = world_size;
    info.cut_cost_t = state.cut_cost_t;
    info.cost_calibration = state.cost_calibration;
    info.config = config_text;
    set_model_keys(info, gpt);
    info.tokenizer = tokenizer;
    info.tokenizer_data = tokenizer_data;
    info.eos_id = eos_id;
    info.document_starts = document_starts;
  }

  void save_by_slices(const model::Model& model, const TrainState& state, bool final_checkpoint);

  void wait_for_writer(std::unique_lock<std::mutex>& lock) {
    cv.wait(lock, [&] { return !job_pending; });
  }

  // Waits for the writer and rethrows (once) the error of the write it finished last.
  void wait_for_writer_and_rethrow(std::unique_lock<std::mutex>& lock) {
    wait_for_writer(lock);
    if (error) {
      std::exception_ptr e = error;
      error = nullptr;
      std::rethrow_exception(e);
    }
  }
};

Checkpointer::Checkpointer(MPI_Comm world, const std::string& run_dir, int keep, const Config& cfg)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.world = world;
  MPI_Comm_rank(world, &s.rank);
  MPI_Comm_size(world, &s.world_size);
  MPI_Comm_dup(world, &s.shards);
  s.run_dir = run_dir;
  s.dir = checkpoints_dir(run_dir);
  s.keep = keep;
  s.config_text = cfg.to_ini();
  std::string problem;
  if (s.rank == 0) {
    if (const char* delay = std::getenv("KILTER_TEST_CHECKPOINT_DELAY_S")) s.write_opts.delay_midway_s = std::atof(delay);
    problem = make_directories(s.dir);
    if (problem.empty()) {
      for (const auto& removed : io::remove_stale_temp_files(s.dir))
        std::fprintf(stderr, "kilter: removed %s, left by a checkpoint write that did not finish\n", removed.c_str());
    }
  }
  share_outcome(world, 0, problem.empty() ? "" : "checkpoint folder: " + problem, "preparing the checkpoint folder");
  if (s.rank == 0) s.writer = std::thread([&s] { s.writer_loop(); });
}

Checkpointer::~Checkpointer() {
  Impl& s = *impl_;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && s.shards != MPI_COMM_NULL) MPI_Comm_free(&s.shards);
  if (!s.writer.joinable()) return;
  {
    std::unique_lock<std::mutex> lock(s.mu);
    s.wait_for_writer(lock);
    if (s.error) {
      try {
        std::rethrow_exception(s.error);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "kilter: checkpoint write failed: %s\n", e.what());
      }
    }
    s.shutting_down = true;
    s.cv.notify_all();
  }
  s.writer.join();
}

void Checkpointer::save(const model::Model& model, const TrainState& state, bool final_checkpoint) {
  Impl& s = *impl_;
  if (optimizer_sharded(model)) {
    s.save_by_slices(model, state, final_checkpoint);
    return;
  }
  if (s.rank != 0) return;
  auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(s.mu);
  s.wait_for_writer_and_rethrow(lock);
  const double waited = seconds_since(t0);

  io::CheckpointContents& c = s.contents;
  const model::ParamLayout& layout = model.layout();
  if (c.tensors.empty()) c.tensors = checkpoint_tensors(layout);
  c.params.resize(layout.num_params);
  c.adam_m.resize(layout.num_params);
  c.adam_v.resize(layout.num_params);
  model.get_params(c.params.data());
  model.get_optimizer_state(c.adam_m.data(), c.adam_v.data());
  s.fill_info(c.info, model, state);

  s.job_path = s.dir + "/" + io::checkpoint_file_name(state.step);
  s.job_pending = true;
  s.job_final = final_checkpoint;
  s.job_sliced = false;
  s.stats.waited_seconds = waited;
  s.stats.snapshot_seconds = seconds_since(t0) - waited;
  s.stats.bytes = 3 * layout.num_params * sizeof(float);
  s.cv.notify_all();
}

// Sharded (collective over `shards`): rank 0 waits for its previous write and creates the temp
// file; every rank writes its own ranges into it; rank 0's writer thread finishes it. A failure
// on any rank (full disk, ...) reaches rank 0, which removes the temp file and warns or, for a
// final checkpoint, leaves the error for wait().
void Checkpointer::Impl::save_by_slices(const model::Model& model, const TrainState& state, bool final_checkpoint) {
  auto t0 = std::chrono::steady_clock::now();
  const std::string path = dir + "/" + io::checkpoint_file_name(state.step);
  std::unique_lock<std::mutex> lock(mu, std::defer_lock);
  double waited = 0;
  // 1. Rank 0 creates the file (its writer thread is idle from here until step 3).
  std::string problem;
  if (rank == 0) {
    lock.lock();
    wait_for_writer(lock);  // a failed final write's error stays for wait()
    waited = seconds_since(t0);
    if (contents.tensors.empty()) contents.tensors = checkpoint_tensors(model.layout());
    contents.params.clear();  // the snapshot buffers of an unsharded save are not used
    contents.adam_m.clear();
    contents.adam_v.clear();
    fill_info(contents.info, model, state);
    try {
      job_offsets = io::create_checkpoint_file(path, contents.info, contents.tensors);
    } catch (const Error& e) {
      problem = e.message();
    } catch (const std::exception& e) {
      problem = "checkpoint " + path + " not written: " + e.what();
    }
  }
  unsigned long long n_offsets = problem.empty() ? job_offsets.size() : 0;
  MPI_Bcast(&n_offsets, 1, MPI_UNSIGNED_LONG_LONG, 0, shards);
  if (n_offsets > 0) {
    std::vector<unsigned long long> offsets(job_offsets.begin(), job_offsets.end());
    offsets.resize(n_offsets);
    MPI_Bcast(offsets.data(), int(n_offsets), MPI_UNSIGNED_LONG_LONG, 0, shards);
    // 2. Every rank writes its slice.
    if (rank != 0) {
      contents.tensors = checkpoint_tensors(model.layout());
      job_offsets.assign(offsets.begin(), offsets.end());
    }
    try {
      io::CheckpointSliceWriter writer(path, contents.tensors, job_offsets);
      write_own_slice(model, writer, rank == 0 ? write_opts.delay_midway_s : 0);
    } catch (const Error& e) {
      problem = e.message();
    } catch (const std::exception& e) {
      problem = "checkpoint " + path + " not written: " + e.what();
    }
    // The first rank that failed says why, to rank 0.
    int failed = problem.empty() ? world_size : rank, first_failed = world_size;
    MPI_Allreduce(&failed, &first_failed, 1, MPI_INT, MPI_MIN, shards);
    if (first_failed < world_size) {
      broadcast_string(shards, problem, first_failed);
      if (rank == 0 && first_failed != 0) problem = "rank " + std::to_string(first_failed) + ": " + problem;
    }
  }
  if (rank != 0) return;
  if (!problem.empty()) {
    io::abandon_checkpoint_file(path);
    if (auto failure = warn_if_periodic(std::make_exception_ptr(Error(problem, __FILE__, __LINE__)), path,
                                        final_checkpoint))
      error = failure;
    return;
  }
  // 3. Rank 0's writer thread finishes the file while training goes on.
  job_path = path;
  job_pending = true;
  job_final = final_checkpoint;
  job_sliced = true;
  stats.waited_seconds = waited;
  stats.snapshot_seconds = seconds_since(t0) - waited;  // here: every rank writing its slice
  stats.bytes = 3 * model.layout().num_params * sizeof(float);
  cv.notify_all();
}

void Checkpointer::set_tokenizer(const std::string& kind, const std::string& file_bytes, int64_t eos_id) {
  Impl& s = *impl_;
  std::lock_guard<std::mutex> lock(s.mu);  // the writer thread reads them from `contents`, not here
  s.tokenizer = kind;
  s.tokenizer_data = file_bytes;
  s.eos_id = eos_id;
}

void Checkpointer::set_document_starts(std::vector<std::pair<uint32_t, uint64_t>> starts) {
  Impl& s = *impl_;
  std::lock_guard<std::mutex> lock(s.mu);
  s.document_starts = std::move(starts);
}

void Checkpointer::wait() {
  Impl& s = *impl_;
  std::string problem;
  if (s.rank == 0) {
    std::unique_lock<std::mutex> lock(s.mu);
    try {
      s.wait_for_writer_and_rethrow(lock);
    } catch (const Error& e) {
      problem = e.message();
    } catch (const std::exception& e) {
      problem = std::string("checkpoint not written: ") + e.what();
    }
    if (!problem.empty())
      problem = after_first_line(problem, "\n  this was the run's last checkpoint, so the run fails; " +
                                              latest_checkpoint_text(s.dir) + ": resume from it with --resume " +
                                              s.run_dir + " once the cause is fixed");
  }
  // Every rank ends with the same error (and a non-zero exit), none waits for rank 0.
  share_outcome(s.world, 0, problem, "writing the last checkpoint");
}

Checkpointer::SaveStats Checkpointer::last_save() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

std::string Checkpointer::latest(const std::string& run_dir) {
  struct stat st;
  if (::stat(run_dir.c_str(), &st) == 0 && S_ISREG(st.st_mode)) return run_dir;  // a file named directly
  auto found = io::list_checkpoints(checkpoints_dir(run_dir));
  if (found.empty()) found = io::list_checkpoints(run_dir);  // the checkpoints folder itself
  return found.empty() ? std::string() : found.back().second;
}

TrainState Checkpointer::load(MPI_Comm world, const std::string& path, model::Model& model, const Config& cfg) {
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  const model::ParamLayout& layout = model.layout();
  io::CheckpointInfo info;
  std::vector<float> params(layout.num_params), adam_m(layout.num_params), adam_v(layout.num_params);
  std::string problem;
  if (rank == 0) {
    bool checking_config = false;
    try {
      info = io::read_checkpoint_info(path);
      checking_config = true;
      check_info_against_config(path, info, cfg, model.config());
      checking_config = false;
      io::read_checkpoint_tensors(path, checkpoint_tensors(layout), params.data(), adam_m.data(), adam_v.data());
    } catch (const Error& e) {
      problem = e.message();
      // A damaged file (not a config mismatch, whose message says what to do): the way out is
      // the checkpoint before it.
      if (!checking_config)
        problem = after_first_line(problem, "; move it aside to resume from the checkpoint before it "
                                             "(--resume takes the newest complete one)");
    }
  }
  // The file the user named (damaged, or of another config): its message says what to do.
  share_outcome(world, 0, problem, "loading checkpoint " + path, ErrorKind::user);

  long long scalars[6] = {info.step, info.epoch, info.step_in_epoch, (long long)info.seed,
                          (long long)info.config_hash, info.world_size};
  MPI_Bcast(scalars, 6, MPI_LONG_LONG, 0, world);
  double doubles[2] = {info.tokens_seen, info.cut_cost_t};
  MPI_Bcast(doubles, 2, MPI_DOUBLE, 0, world);
  info.tokens_seen = doubles[0];
  info.cut_cost_t = doubles[1];
  broadcast_string(world, info.kilter_version, 0);
  broadcast_string(world, info.cost_calibration, 0);
  broadcast_floats(world, params, 0);
  broadcast_floats(world, adam_m, 0);
  broadcast_floats(world, adam_v, 0);

  model.set_params(params.data());
  model.set_optimizer_state(adam_m.data(), adam_v.data());
  TrainState state;
  state.step = scalars[0];
  state.position.epoch = uint64_t(scalars[1]);
  state.position.step_in_epoch = uint64_t(scalars[2]);
  state.seed = uint64_t(scalars[3]);
  state.config_hash = uint64_t(scalars[4]);
  state.world_size = int(scalars[5]);
  state.tokens_seen = info.tokens_seen;
  state.cut_cost_t = info.cut_cost_t;
  state.cost_calibration = info.cost_calibration;
  return state;
}

}  // namespace kilter::train
