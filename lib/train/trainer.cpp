// The training loop of `kilter train` (see trainer.h). Every rank runs the same sequence of
// collectives every step whatever its data: the plan gives each rank the same number of steps,
// and a rank with no micro-batch in a step still joins the gradient reduction with zeros.
#include "lib/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include <cblas.h>

#include "io/dataset.h"
#include "io/error.h"
#include "io/reader.h"
#include "kilter/build_info.h"
#include "lib/balance/plan.h"
#include "lib/balance/plan_config.h"
#include "lib/comm/communicator.h"
#include "lib/diag/diagnostics.h"
#include "lib/model/model.h"
#include "lib/optim/schedule.h"
#include "lib/train/checkpointer.h"
#include "lib/train/sampling.h"
#include "lib/train/guards.h"
#include "lib/train/signals.h"
#include "lib/train/staging.h"
#include "lib/train/watchdog.h"

namespace fs = std::filesystem;

namespace kilter::train {

namespace {

double now_seconds() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

std::string format_duration(double s) {
  char buf[64];
  if (s < 0 || !std::isfinite(s)) return "?";
  long t = long(s + 0.5);
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t / 60) % 60);
  else if (t >= 60)
    std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%lds", t);
  return buf;
}

// The plan of each epoch, built on demand (identically on every rank) and dropped once passed.
class PlanCache {
 public:
  PlanCache(const io::DatasetIndex& index, std::vector<uint64_t> docs, balance::PlanOptions opts,
            int world_size)
      : index_(index), docs_(std::move(docs)), opts_(std::move(opts)), world_size_(world_size) {}

  const balance::EpochPlan& get(uint64_t epoch) {
    auto it = plans_.find(epoch);
    if (it != plans_.end()) return it->second;
    balance::EpochPlan plan =
        balance::build_epoch_plan(index_.doc_lengths, docs_, opts_, world_size_, epoch);
    KILTER_CHECK(!plan.steps.empty(),
                 "dataset " << index_.dir << ": the plan of epoch " << epoch
                            << " has no step: the split holds too few tokens for train.tokens_per_step = "
                            << opts_.tokens_per_step << " (" << docs_.size() << " documents)");
    return plans_.emplace(epoch, std::move(plan)).first->second;
  }
  void drop_before(uint64_t epoch) {
    while (!plans_.empty() && plans_.begin()->first < epoch) plans_.erase(plans_.begin());
  }

 private:
  const io::DatasetIndex& index_;
  std::vector<uint64_t> docs_;
  balance::PlanOptions opts_;
  int world_size_;
  std::map<uint64_t, balance::EpochPlan> plans_;
};

// Walks this rank's micro-batches in the order training consumes them, across steps and epochs,
// so the reader can be fed ahead of the trainer.
class PrefetchCursor {
 public:
  PrefetchCursor(PlanCache& plans, int rank, balance::PlanPosition start, int64_t steps_left)
      : plans_(plans), rank_(rank), pos_(start), steps_left_(steps_left) {}

  // Next micro-batch's pieces, or false when the run's steps are all queued.
  bool next(std::vector<io::PieceRequest>& out) {
    while (steps_left_ > 0) {
      const balance::EpochPlan& plan = plans_.get(pos_.epoch);
      if (pos_.step_in_epoch >= plan.steps.size()) {
        ++pos_.epoch;
        pos_.step_in_epoch = 0;
        mb_ = 0;
        continue;
      }
      const balance::Step& step = plan.steps[pos_.step_in_epoch];
      const auto& mine = step.rank_batches[rank_];
      if (mb_ >= mine.size()) {
        ++pos_.step_in_epoch;
        mb_ = 0;
        --steps_left_;
        continue;
      }
      const balance::MicroBatch& mb = step.micro_batches[mine[mb_++]];
      out.clear();
      for (const auto& p : mb.pieces) out.push_back({p.doc, p.start, p.len});
      return true;
    }
    return false;
  }

 private:
  PlanCache& plans_;
  int rank_;
  balance::PlanPosition pos_;
  int64_t steps_left_;
  size_t mb_ = 0;
};

// Rows padded to the micro-batch's longest piece; targets -1 on padding. Token ids were checked
// against the dataset's vocabulary by the reader (and model.vocab_size >= it at start-up).
void assemble_batch(const io::ReadyGroup& group, uint32_t padded_len, model::Batch& batch) {
  const int B = int(group.pieces.size());
  const int T = int(padded_len);
  batch.B = B;
  batch.T = T;
  batch.inputs.assign(size_t(B) * T, 0);
  batch.targets.assign(size_t(B) * T, -1);
  batch.lengths.assign(B, 0);
  batch.num_targets = 0;
  for (int b = 0; b < B; ++b) {
    const uint32_t len = group.pieces[b].len;
    KILTER_CHECK(len <= padded_len, "piece of document " << group.pieces[b].doc << " is longer ("
                                                         << len << ") than its micro-batch row (" << T << ")");
    const int32_t* tok = group.tokens + group.offsets[b];
    int32_t* in = &batch.inputs[size_t(b) * T];
    int32_t* tg = &batch.targets[size_t(b) * T];
    std::copy(tok, tok + len, in);
    std::copy(tok + 1, tok + len + 1, tg);
    batch.lengths[b] = int32_t(len);
    batch.num_targets += len;
  }
}

void write_text_file(const fs::path& path, const std::string& text) {
  fs::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream os(tmp);
    KILTER_CHECK(os, "cannot write " << tmp.string());
    os << text;
    KILTER_CHECK(os.good(), "cannot write " << tmp.string());
  }
  fs::rename(tmp, path);
}

// Resolves --resume: "latest" means the configured run directory.
std::string resolve_run_dir(const Config& cfg, const RunOptions& opts) {
  if (opts.resume.empty() || opts.resume == "latest") return cfg.output.dir;
  return opts.resume;
}

}  // namespace

int run_training(MPI_Comm world, const Config& cfg_in, const RunOptions& opts) {
  Config cfg = cfg_in;
  int rank = 0, world_size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &world_size);
  set_error_rank(rank);
  install_stop_signal_handlers();
  const double t_start = now_seconds();

  // ---- topology and the checks that must agree across ranks ---------------------------------
  comm::Topology topo = comm::make_topology(world, cfg.comm.ranks_per_node);
  check_consistent_across_ranks(world, cfg.hash(), KILTER_VERSION, cfg.to_ini());
  openblas_set_num_threads(cfg.train.threads);

  const std::string run_dir = resolve_run_dir(cfg, opts);
  cfg.output.dir = run_dir;
  const bool resuming = !opts.resume.empty();
  std::string resume_path;
  if (resuming) {
    resume_path = Checkpointer::latest(run_dir);
    KILTER_CHECK(!resume_path.empty(), "--resume " << opts.resume << ": no checkpoint in "
                                                   << (fs::path(run_dir) / "checkpoints").string());
  }
  if (rank == 0) {
    fs::create_directories(fs::path(run_dir) / "metrics");
    fs::create_directories(fs::path(run_dir) / "trace");
    fs::create_directories(fs::path(run_dir) / "checkpoints");
    write_text_file(fs::path(run_dir) / "config.ini", cfg.to_ini());
  }
  MPI_Barrier(world);

  // ---- data --------------------------------------------------------------------------------
  KILTER_CHECK(!cfg.data.dir.empty(), "config key data.dir is empty: name a dataset directory "
                                      "(kilter prep ... --out DIR)");
  io::DatasetIndex index = io::load_index(cfg.data.dir);
  if (cfg.model.vocab_size == 0) cfg.model.vocab_size = int(index.vocab_size);
  KILTER_CHECK(uint32_t(cfg.model.vocab_size) >= index.vocab_size,
               "config key model.vocab_size = " << cfg.model.vocab_size << " is smaller than the vocabulary of "
                                                << cfg.data.dir << " (" << index.vocab_size << ")");
  std::string data_dir = cfg.data.dir;
  if (!cfg.data.stage_dir.empty()) data_dir = stage_dataset(index, cfg.data.stage_dir, topo.node, topo.local_rank);

  balance::Split split = balance::split_documents(index.doc_lengths, cfg.data.eval_fraction, cfg.train.seed);
  const balance::PlanOptions plan_opts = balance::plan_options_from_config(cfg, index.vocab_size);
  PlanCache plans(index, split.train_docs, plan_opts, world_size);

  // ---- model, reduction, diagnostics, checkpoints --------------------------------------------
  std::string backend = cfg.train.backend;
  if (backend == "auto") backend = model::cuda_available() ? "cuda" : "cpu";
  model::GPTConfig gpt{cfg.model.n_layer, cfg.model.n_head, cfg.model.n_embd, cfg.model.block_size,
                       cfg.model.vocab_size};
  // Node shards of the flat gradient buffer are contiguous and 64-float aligned.
  const size_t pad_multiple = size_t(topo.local_size) * 64;
  model::BackendOptions backend_options;
  backend_options.precision = cfg.train.precision;
  backend_options.attention = cfg.train.attention;
  backend_options.cuda_graphs = cfg.train.cuda_graphs;
  std::unique_ptr<model::Model> model = model::make_model(backend, gpt, pad_multiple, backend_options);
  model->init_params(cfg.train.seed);
  // A micro-batch holds at most max_tokens padded tokens, so B*T <= max_tokens and the attention
  // scores B*T*T <= max_tokens*block_size: one (max_tokens/block_size, block_size) batch bounds both.
  model->reserve(int(std::max<int64_t>(1, cfg.data.max_tokens / cfg.model.block_size)), cfg.model.block_size);

  TrainState state;
  state.seed = cfg.train.seed;
  state.config_hash = cfg.hash();
  state.world_size = world_size;
  if (resuming) {
    state = Checkpointer::load(world, resume_path, *model, cfg);
    if (rank == 0)
      std::fprintf(stderr, "kilter: resumed from %s at step %lld (epoch %llu, step %llu of the epoch)\n",
                   resume_path.c_str(), (long long)state.step, (unsigned long long)state.position.epoch,
                   (unsigned long long)state.position.step_in_epoch);
    state.world_size = world_size;
  }

  const std::string comm_kind = backend == "cuda" ? "nccl" : "mpi";
  std::string algo = cfg.comm.algo;
  if (algo == "hierarchical" && !topo.uniform) algo = "flat";  // make_topology has warned
  comm::ReducerOptions reducer_opts;
  reducer_opts.kind = comm_kind;
  reducer_opts.algo = algo;
  reducer_opts.bucket_bytes = size_t(cfg.comm.bucket_mb * 1024 * 1024);
  reducer_opts.overlap = cfg.comm.overlap ? comm::OverlapMode::automatic : comm::OverlapMode::off;
  reducer_opts.timeout_s = cfg.comm.timeout_s;
  // The model reports every float of the padded buffer (the padding together with ln_f).
  reducer_opts.reported_size = model->layout().padded_size;
  auto reducer = comm::make_gradient_reducer(topo, model->grads(), model->layout().padded_size, reducer_opts);

  diag::DiagOptions dopts;
  dopts.run_dir = run_dir;
  dopts.trace_steps = cfg.output.trace_steps;
  dopts.stall_factor = cfg.output.stall_factor;
  dopts.inject_delay = cfg.train.inject_delay;
  dopts.resume = resuming;
  diag::RankDiagnostics diagnostics(world, dopts);
  Checkpointer checkpointer(world, run_dir, cfg.output.keep_checkpoints, cfg);
  checkpointer.set_tokenizer(index.tokenizer, index.tokenizer_data, index.eos_id);  // checkpoints decode on their own
  TrainingSampler sampler(cfg, index, rank);  // output.sample_every
  Watchdog watchdog(world, cfg.comm.timeout_s);

  io::ReaderOptions ropts;
  ropts.prefetch = cfg.data.prefetch;
  ropts.threads = cfg.data.reader_threads;
  io::PrefetchReader reader(index, data_dir, ropts);
  const int64_t total_steps = cfg.train.steps;
  PrefetchCursor cursor(plans, rank, state.position, std::max<int64_t>(0, total_steps - state.step));

  // Evaluation: the first eval_batches steps of the held-out split's plan (world-size independent).
  std::unique_ptr<PlanCache> eval_plans;
  if (cfg.train.eval_every > 0) {
    KILTER_CHECK(!split.eval_docs.empty(), "train.eval_every = " << cfg.train.eval_every
                                           << " needs held-out documents: set data.eval_fraction > 0");
    eval_plans = std::make_unique<PlanCache>(index, split.eval_docs, plan_opts, world_size);
  }

  // The statistics of the epoch the run starts in: logged now and reported in the summary (a
  // copy, since the plan itself is dropped once its epoch is done).
  const balance::PlanStats st = plans.get(state.position.epoch).stats;
  if (rank == 0) {
    std::fprintf(stderr,
                 "kilter %s: %d ranks (%d nodes x %d), backend %s, comm %s/%s, model %d layers x %d "
                 "(%zu params), %s\n"
                 "kilter: plan %s: %llu steps/epoch, %.1f micro-batches/step, padding efficiency %.3f, "
                 "cost imbalance p95 %.3f; run dir %s\n",
                 KILTER_VERSION, world_size, topo.num_nodes, topo.local_size, backend.c_str(),
                 comm_kind.c_str(), algo.c_str(), gpt.n_layer, gpt.n_embd, model->layout().num_params,
                 data_dir.c_str(), cfg.data.sampler.c_str(), (unsigned long long)st.steps_per_epoch,
                 st.micro_batches_per_step, st.padding_efficiency, st.cost_imbalance_p95, run_dir.c_str());
    if (backend != "cpu") std::fprintf(stderr, "kilter: model on %s\n", model->describe().c_str());
  }

  auto fill_prefetch = [&]() {
    std::vector<io::PieceRequest> pieces;
    while (reader.queued() < size_t(cfg.data.prefetch) && cursor.next(pieces)) reader.enqueue(pieces);
  };

  auto evaluate = [&]() -> double {
    const balance::EpochPlan& eplan = eval_plans->get(0);
    io::ReaderOptions eopts = ropts;
    eopts.prefetch = 2;
    io::PrefetchReader ereader(index, data_dir, eopts);
    model::Batch batch;
    double sums[2] = {0, 0};  // loss sum, targets
    const size_t n_steps = std::min<size_t>(eplan.steps.size(), size_t(cfg.train.eval_batches));
    for (size_t s = 0; s < n_steps; ++s) {
      const balance::Step& st = eplan.steps[s];
      for (uint32_t id : st.rank_batches[rank]) {
        const balance::MicroBatch& mb = st.micro_batches[id];
        std::vector<io::PieceRequest> pieces;
        for (const auto& p : mb.pieces) pieces.push_back({p.doc, p.start, p.len});
        ereader.enqueue(std::move(pieces));
        const io::ReadyGroup& g = ereader.next();
        assemble_batch(g, mb.padded_len, batch);
        sums[0] += model->forward_loss(batch);
        sums[1] += double(batch.num_targets);
      }
    }
    watchdog.enter("evaluation allreduce", long(state.step));
    MPI_Allreduce(MPI_IN_PLACE, sums, 2, MPI_DOUBLE, MPI_SUM, world);
    watchdog.leave();
    return sums[1] > 0 ? sums[0] / sums[1] : NAN;
  };

  // ---- the loop ------------------------------------------------------------------------------
  model::Batch batch;
  double last_loss = NAN, eval_loss = NAN;
  double tokens_this_run = 0;
  const int64_t first_step = state.step;
  const double t_loop = now_seconds();
  double t_last_log = t_loop;
  double tokens_since_log = 0;
  int exit_code = 0;
  bool stop_requested = false;
  int64_t nonfinite_skipped = 0;

  while (state.step < total_steps) {
    const balance::EpochPlan& plan = plans.get(state.position.epoch);
    const balance::Step& step = plan.steps[state.position.step_in_epoch];
    const auto& mine = step.rank_batches[rank];
    const float loss_scale = 1.0f / float(step.target_tokens);
    maybe_fail_for_test(rank, state.step);

    diagnostics.begin_step(state.step);
    model->zero_grads();
    double loss_sum = 0;
    uint64_t tokens_computed = 0;
    double attn_work = 0;
    if (mine.empty()) {
      // No micro-batch for this rank in this step: contribute zeros to the reduction.
      reducer->begin();
      diagnostics.mark_arrival();
      reducer->ready(0, model->layout().padded_size);
    }
    for (size_t i = 0; i < mine.size(); ++i) {
      const balance::MicroBatch& mb = step.micro_batches[mine[i]];
      const bool last = i + 1 == mine.size();
      fill_prefetch();
      diagnostics.phase_begin(diag::kDataWait);
      const io::ReadyGroup& group = reader.next();
      diagnostics.phase_end(diag::kDataWait);
      diagnostics.phase_begin(diag::kH2D);
      assemble_batch(group, mb.padded_len, batch);
      diagnostics.phase_end(diag::kH2D);
      fill_prefetch();
      tokens_computed += mb.tokens_computed();
      for (const auto& p : mb.pieces) attn_work += double(p.len) * double(p.len);

      // forward_backward runs both passes; the model's backward-start hook (or, failing that,
      // the first finished gradient range) splits the forward and backward phases.
      diagnostics.phase_begin(diag::kForward);
      model::GradReadyFn on_ready;
      bool backward_started = false;
      auto note_backward = [&]() {
        if (!backward_started) {
          backward_started = true;
          diagnostics.phase_end(diag::kForward);
          diagnostics.phase_begin(diag::kBackward);
        }
      };
      model->set_backward_start_hook(note_backward);
      if (last) {
        reducer->begin();
        on_ready = [&](size_t offset, size_t count) {
          note_backward();
          reducer->ready(offset, count);
        };
      } else {
        on_ready = [&](size_t, size_t) { note_backward(); };
      }
      loss_sum += model->forward_backward(batch, loss_scale, on_ready);
      note_backward();
      diagnostics.phase_end(diag::kBackward);
      if (last) diagnostics.mark_arrival();
    }
    watchdog.enter("gradient reduction", long(state.step));
    const double exposed = reducer->finish();
    diagnostics.add_phase_seconds(diag::kCommExposed, exposed);

    // Loss of the global step and the stop flag in one small collective.
    double scalars[2] = {loss_sum, double(stop_signal_received() != 0)};
    MPI_Allreduce(MPI_IN_PLACE, scalars, 2, MPI_DOUBLE, MPI_SUM, world);
    watchdog.leave();
    const double loss = scalars[0] / double(step.target_tokens);
    stop_requested = scalars[1] > 0;

    diagnostics.phase_begin(diag::kOptimizer);
    const double grad_norm = std::sqrt(model->grad_norm_squared());
    bool skip_update = false;
    if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
      KILTER_CHECK(cfg.train.on_nonfinite == "skip",
                   "step " << state.step << ": non-finite " << (std::isfinite(loss) ? "gradient norm" : "loss")
                           << " (loss " << loss << ", grad norm " << grad_norm
                           << "); lower train.lr or set train.on_nonfinite = skip");
      skip_update = true;
      ++nonfinite_skipped;
      if (rank == 0)
        std::fprintf(stderr, "kilter: step %lld: non-finite loss or gradient norm, update skipped\n",
                     (long long)state.step);
    }
    const double lr = optim::learning_rate(state.step, cfg.train.warmup, total_steps, cfg.train.lr,
                                           cfg.train.min_lr_ratio);
    if (!skip_update) {
      model::AdamWParams ap;
      ap.lr = float(lr);
      ap.beta1 = float(cfg.train.beta1);
      ap.beta2 = float(cfg.train.beta2);
      ap.eps = float(cfg.train.eps);
      ap.weight_decay = float(cfg.train.weight_decay);
      ap.grad_scale = cfg.train.grad_clip > 0 ? optim::clip_scale(grad_norm, cfg.train.grad_clip) : 1.0f;
      ap.t = state.step + 1;
      model->adamw_step(ap);
    }
    model->synchronize();
    diagnostics.phase_end(diag::kOptimizer);

    diagnostics.set_step_work(tokens_computed, attn_work);
    diagnostics.end_step(state.step, int64_t(step.target_tokens), loss);
    last_loss = loss;
    tokens_this_run += double(step.target_tokens);
    tokens_since_log += double(step.target_tokens);
    ++state.step;
    state.tokens_seen += double(step.target_tokens);
    // `plan` and `step` are not used past this point: a finished epoch's plan can go.
    state.position = balance::next_position(state.position, plan.steps.size());
    if (state.position.step_in_epoch == 0) plans.drop_before(state.position.epoch);

    if (cfg.train.eval_every > 0 && state.step % cfg.train.eval_every == 0) {
      eval_loss = evaluate();
      if (rank == 0) std::fprintf(stderr, "kilter: step %lld eval loss %.4f\n", (long long)state.step, eval_loss);
    }
    if (rank == 0 && (state.step % cfg.output.log_every == 0 || state.step == total_steps || state.step == first_step + 1)) {
      const double t = now_seconds();
      const double rate = tokens_since_log / std::max(1e-9, t - t_last_log);
      const double per_step = (t - t_loop) / double(state.step - first_step);
      std::printf("step %6lld/%lld | loss %.4f | lr %.2e | grad norm %.3f | %8.0f tok/s | eta %s\n",
                  (long long)state.step, (long long)total_steps, loss, lr, grad_norm, rate,
                  format_duration(per_step * double(total_steps - state.step)).c_str());
      std::fflush(stdout);
      t_last_log = t;
      tokens_since_log = 0;
    }
    sampler.maybe_sample(*model, state.step);
    const bool periodic = cfg.output.checkpoint_every > 0 && state.step % cfg.output.checkpoint_every == 0;
    if (stop_requested || periodic || state.step == total_steps) {
      checkpointer.save(*model, state);
    }
    if (stop_requested) {
      if (rank == 0)
        std::fprintf(stderr, "kilter: stop signal received: checkpoint of step %lld written, exiting with code %d\n",
                     (long long)state.step, kExitPreempted);
      exit_code = kExitPreempted;
      break;
    }
  }
  checkpointer.wait();
  const double elapsed = now_seconds() - t_loop;

  // ---- summary -------------------------------------------------------------------------------
  nlohmann::json extra;
  extra["world_size"] = world_size;
  extra["steps"] = state.step;
  extra["steps_this_run"] = state.step - first_step;
  extra["tokens_per_second"] = elapsed > 0 ? tokens_this_run / elapsed : 0.0;
  extra["final_loss"] = last_loss;
  extra["eval_loss"] = std::isfinite(eval_loss) ? nlohmann::json(eval_loss) : nlohmann::json(nullptr);
  extra["padding_efficiency"] = st.padding_efficiency;
  extra["cost_imbalance_p50"] = st.cost_imbalance_p50;
  extra["cost_imbalance_p95"] = st.cost_imbalance_p95;
  extra["cost_imbalance_max"] = st.cost_imbalance_max;
  extra["steps_per_epoch"] = st.steps_per_epoch;
  extra["micro_batches_per_step"] = st.micro_batches_per_step;
  extra["sampler"] = cfg.data.sampler;
  extra["backend"] = backend;
  extra["backend_detail"] = model->describe();
  extra["comm_algo"] = algo;
  extra["num_nodes"] = topo.num_nodes;
  extra["ranks_per_node"] = topo.local_size;
  extra["num_params"] = model->layout().num_params;
  extra["nonfinite_steps_skipped"] = nonfinite_skipped;
  extra["elapsed_seconds"] = elapsed;
  extra["startup_seconds"] = t_loop - t_start;
  extra["preempted"] = exit_code == kExitPreempted;
  extra["resumed_from_step"] = first_step;
  nlohmann::json summary = diagnostics.finish(extra);
  if (rank == 0) {
    std::fprintf(stderr, "kilter: done: %lld steps, final loss %.4f, %.0f tokens/s, summary in %s\n",
                 (long long)state.step, last_loss, elapsed > 0 ? tokens_this_run / elapsed : 0.0,
                 (fs::path(run_dir) / "summary.json").string().c_str());
    if (opts.json) std::printf("%s\n", summary.dump(2).c_str());
  }
  comm::free_topology(topo);
  return exit_code;
}

}  // namespace kilter::train
