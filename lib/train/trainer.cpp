// The training job of `kilter train` (see trainer.h): set-up, the step loop and the summary.
// A step reads plan -> read -> forward/backward -> reduce -> update (the stages are in
// train_step.h). Every rank runs the same sequence of collectives every step whatever its data:
// the plan gives each rank the same number of steps, and a rank with no micro-batch in a step
// still joins the gradient reduction with zeros.
#include "lib/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "io/dataset.h"
#include "io/error.h"
#include "io/reader.h"
#include "kilter/build_info.h"
#include "lib/balance/plan.h"
#include "lib/balance/plan_config.h"
#include "lib/comm/communicator.h"
#include "lib/comm/kv_schedule.h"
#include "lib/diag/diagnostics.h"
#include "lib/diag/metrics_csv.h"
#include "lib/model/gemm.h"
#include "lib/model/model.h"
#include "lib/train/checkpointer.h"
#include "lib/train/cut_cost_watch.h"
#include "lib/train/hf_interop.h"
#include "lib/train/training_data.h"
#include "lib/train/evaluation.h"
#include "lib/train/guards.h"
#include "lib/train/memory_plan.h"
#include "lib/train/micro_batch.h"
#include "lib/train/plan_cursor.h"
#include "lib/train/run_dir.h"
#include "lib/train/sampling.h"
#include "lib/train/signals.h"
#include "lib/train/staging.h"
#include "lib/train/train_step.h"
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
  model::set_gemm_threads(cfg.train.threads);  // oneDNN (OpenMP) threads of this rank

  const std::string run_dir = resolve_run_dir(cfg, opts);
  cfg.output.dir = run_dir;
  const bool resuming = !opts.resume.empty();
  if (rank == 0 && !opts.note.empty()) std::fprintf(stderr, "kilter: %s\n", opts.note.c_str());
  if (rank == 0 && opts.move_aside) {  // --force: the old run is kept under a new name
    const std::string moved = move_run_aside(run_dir);
    std::fprintf(stderr, "kilter: --force: moved the run in %s to %s; starting over\n", run_dir.c_str(), moved.c_str());
  }
  MPI_Barrier(world);
  std::string resume_path;
  if (resuming) resume_path = find_resume_checkpoint(world, run_dir, opts.resume);
  if (rank == 0) {
    fs::create_directories(fs::path(run_dir) / "metrics");
    fs::create_directories(fs::path(run_dir) / "trace");
    fs::create_directories(fs::path(run_dir) / "checkpoints");
  }
  MPI_Barrier(world);

  // ---- data --------------------------------------------------------------------------------
  TrainingData data = load_training_data(cfg);  // data.dir, or data.sources merged into one index
  io::DatasetIndex& index = data.index;
  if (cfg.model.vocab_size == 0) cfg.model.vocab_size = int(index.vocab_size);
  KILTER_CHECK(uint32_t(cfg.model.vocab_size) >= index.vocab_size,
               "config key model.vocab_size = " << cfg.model.vocab_size << " is smaller than the vocabulary of "
                                                << index.dir << " (" << index.vocab_size << ")");
  if (!resuming) check_new_run_dir(world, run_dir, cfg);  // with the config resolved as config.ini holds it
  std::string data_dir = cfg.data.dir;
  if (!cfg.data.stage_dir.empty()) data_dir = stage_dataset(index, cfg.data.stage_dir, topo.node, topo.local_rank);

  balance::Split split = balance::split_documents(index.doc_lengths, cfg.data.eval_fraction, cfg.train.seed);
  const balance::PlanOptions plan_opts = balance::plan_options_from_config(cfg, index.vocab_size);
  std::unique_ptr<PlanCache> train_plans = make_plan_cache(data, split.train_docs, plan_opts, world_size);
  PlanCache& plans = *train_plans;

  // ---- model, reduction, diagnostics, checkpoints --------------------------------------------
  std::string backend = cfg.train.backend;
  if (backend == "auto") backend = model::cuda_available() ? "cuda" : "cpu";
  // A run that cannot fit is refused here, before any rank allocates model memory.
  check_memory_plan(world, cfg, topo.local_size, resuming, backend);
  const model::ModelSpec& gpt = cfg.model;
  // Node shards of the flat gradient buffer are contiguous and 64-float aligned; sharded (ZeRO-1),
  // so is every rank's share of each bucket.
  bool shard_optimizer = cfg.train.shard_optimizer && world_size > 1;
  const size_t pad_multiple = size_t(shard_optimizer ? world_size : topo.local_size) * 64;
  model::BackendOptions backend_options;
  backend_options.precision = cfg.train.precision;
  backend_options.attention = cfg.train.attention;
  backend_options.cuda_graphs = cfg.train.cuda_graphs;
  backend_options.recompute = cfg.train.recompute;
  backend_options.bf16_storage = cfg.train.bf16_storage;
  std::unique_ptr<model::Model> model = model::make_model(backend, gpt, pad_multiple, backend_options);
  if (shard_optimizer && !model->supports_optimizer_shard()) {
    shard_optimizer = false;
    if (rank == 0)
      std::fprintf(stderr, "kilter: warning: train.shard_optimizer = true: the %s backend has no sharded optimizer "
                   "yet; every rank keeps the full optimizer state\n", model->backend_name().c_str());
  }
  // The reducer decides which ranges this rank owns; the model keeps moments only for them,
  // from before a resume loads any.
  const std::string comm_kind = backend == "cuda" ? "nccl" : "mpi";
  std::string algo = cfg.comm.algo;
  if (algo == "hierarchical" && !topo.uniform) algo = "flat";  // make_topology has warned
  comm::ReducerOptions reducer_opts;
  reducer_opts.kind = comm_kind;
  reducer_opts.algo = algo;
  reducer_opts.bucket_bytes = size_t(cfg.comm.bucket_mb * 1024 * 1024);
  reducer_opts.overlap = cfg.comm.overlap ? comm::OverlapMode::automatic : comm::OverlapMode::off;
  reducer_opts.timeout_s = cfg.comm.timeout_s;
  reducer_opts.shard = shard_optimizer;
  // The model reports every float of the padded buffer (the padding together with ln_f).
  reducer_opts.reported_size = model->layout().padded_size;
  auto reducer = comm::make_gradient_reducer(topo, model->grads(), model->layout().padded_size, reducer_opts);
  // A rank that unwinds an error while its reducer is mid-collective (a step's reduction, or the
  // parameters' gather on the communication thread): the reducer lets its thread go, since the
  // job is about to be aborted, and that collective still reads and writes the model's buffers.
  // The model is then let go too, not freed under it.
  struct ModelOutlivesCollective {
    std::unique_ptr<model::Model>& model;
    const comm::GradientReducer& reducer;
    ~ModelOutlivesCollective() {
      if (std::uncaught_exceptions() > 0 && reducer.communicating()) (void)model.release();
    }
  } model_outlives_collective{model, *reducer};
  if (shard_optimizer) {
    std::vector<model::ParamRange> owned;
    for (const comm::BufferRange& r : reducer->owned()) owned.push_back({r.offset, r.count});
    model->shard_optimizer(owned);
  }
  model->init_params(cfg.train.seed);
  if (!resuming && !cfg.train.init_from.empty()) {  // a resumed run continues from its own checkpoint
    const std::string note = load_initial_weights(world, cfg, index, *model);
    if (rank == 0) std::fprintf(stderr, "kilter: %s\n", note.c_str());
  }
  // A micro-batch holds at most max_tokens tokens in pieces of at most block_size.
  model->reserve(int(cfg.data.max_tokens), cfg.model.block_size);

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
    if (cfg.data.cost_t >= 0) {
      state.cut_cost_t = -1;  // a given data.cost_t is the charge
    } else if (state.cut_cost_t >= 0) {
      // The charge this run's cut-cost check measured before the checkpoint: the plans it made
      // since continue (nothing has been planned yet in this process).
      plans.replan(state.position, state.cut_cost_t);
      if (rank == 0)
        std::fprintf(stderr, "kilter: plan: cut pieces are charged t = %.3g per earlier token, as this run's cut-cost "
                     "check measured before the checkpoint (data.cost_t fixes another)\n", state.cut_cost_t);
    }
  }
  // Only now, once a resume has loaded (or a new run was allowed into run_dir): a refused run
  // leaves the run directory's config.ini as it was.
  if (rank == 0) write_text_file(fs::path(run_dir) / "config.ini", cfg.to_ini());

  diag::DiagOptions dopts;
  dopts.run_dir = run_dir;
  dopts.trace_steps = cfg.output.trace_steps;
  dopts.stall_factor = cfg.output.stall_factor;
  dopts.inject_delay = cfg.train.inject_delay;
  dopts.resume = resuming;
  diag::RankDiagnostics diagnostics(world, dopts);
  Checkpointer checkpointer(world, run_dir, cfg.output.keep_checkpoints, cfg);
  checkpointer.set_tokenizer(index.tokenizer, index.tokenizer_data, index.eos_id);  // checkpoints decode on their own
  // The training documents' first tokens, which the model never predicts: what unprompted samples
  // start from (rank 0 writes checkpoints and prints samples).
  std::vector<std::pair<uint32_t, uint64_t>> document_starts;
  if (rank == 0) document_starts = count_document_starts(index, data_dir, split.train_docs);
  checkpointer.set_document_starts(document_starts);
  TrainingSampler sampler(cfg, index, rank, to_document_starts(document_starts));  // output.sample_every
  Watchdog watchdog(world, cfg.comm.timeout_s);
  // metrics/train.csv: rank 0 writes what it already logs, so no rank waits for it.
  std::unique_ptr<diag::CsvAppender> train_csv;
  if (rank == 0) train_csv = std::make_unique<diag::CsvAppender>(diag::train_csv_path(run_dir), diag::train_csv_header(), resuming);

  io::ReaderOptions ropts;
  ropts.prefetch = cfg.data.prefetch;
  ropts.threads = cfg.data.reader_threads;
  io::PrefetchReader reader(index, data_dir, ropts);
  const int64_t total_steps = cfg.train.steps;
  PrefetchCursor cursor(plans, rank, state.position, std::max<int64_t>(0, total_steps - state.step));

  // Evaluation: the first eval_batches steps of the held-out split's plan (world-size independent).
  std::unique_ptr<PlanCache> eval_plans;
  // Evaluation runs forward only, without a K/V exchange: its plans keep every piece whole, in
  // micro-batches that hold a whole context where data.max_tokens is shorter (long contexts).
  balance::PlanOptions eval_opts = plan_opts;
  eval_opts.cut_pieces = false;
  eval_opts.max_tokens = std::max<uint64_t>(eval_opts.max_tokens, eval_opts.context);
  if (cfg.train.eval_every > 0) {
    KILTER_CHECK(!split.eval_docs.empty(), "train.eval_every = " << cfg.train.eval_every
                                           << " needs held-out documents: set data.eval_fraction > 0");
    eval_plans = std::make_unique<PlanCache>(index, split.eval_docs, eval_opts, world_size);
  }
  // A mixture also evaluates every source on its own held-out documents.
  std::vector<std::unique_ptr<PlanCache>> source_eval_plans(data.sources.size());
  nlohmann::json eval_loss_per_source;
  for (size_t k = 0; eval_plans && k < data.sources.size(); ++k) {
    std::vector<uint64_t> docs = data.docs_of(k, split.eval_docs);
    if (!docs.empty()) source_eval_plans[k] = std::make_unique<PlanCache>(index, std::move(docs), eval_opts, world_size);
  }
  std::vector<uint64_t> tokens_per_source(data.sources.size(), 0);

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
    if (st.cuts > 0) {
      const std::string chains = st.long_pieces > 0 ? "; pieces longer than data.max_tokens span up to " +
                                                           std::to_string(st.long_piece_ranks_max) + " ranks"
                                                     : "";
      std::fprintf(stderr,
                   "kilter: plan cuts pieces between ranks: %.0f cuts per step (p50, max %.0f), K/V %.3g B per step "
                   "(p50); cost imbalance p95 %.3f with cuts, %.3f whole pieces only (bound %.3f)%s\n",
                   st.cuts_per_step_p50, st.cuts_per_step_max, st.kv_bytes_per_step_p50, st.cost_imbalance_p95,
                   st.cost_imbalance_uncut_p95, st.cost_imbalance_bound_p95, chains.c_str());
    }
    // The same warnings as `kilter plan`: a step too small for the world size, and idle ranks.
    const std::string too_small = balance::idle_rank_warning(plan_opts, world_size);
    if (!too_small.empty()) std::fprintf(stderr, "kilter: warning: %s\n", too_small.c_str());
    if (st.steps_with_idle_ranks > 0)
      std::fprintf(stderr,
                   "kilter: warning: %llu of %llu steps of this epoch leave ranks idle (at most %llu in one step); "
                   "idle ranks still join every collective; raise train.tokens_per_step to >= %lld (world size x "
                   "model.block_size)\n",
                   (unsigned long long)st.steps_with_idle_ranks, (unsigned long long)st.steps_per_epoch,
                   (unsigned long long)st.idle_ranks_max, (long long)world_size * cfg.model.block_size);
  }

  auto fill_prefetch = [&]() {
    std::vector<io::PieceRequest> pieces;
    while (reader.queued() < size_t(cfg.data.prefetch) && cursor.next(pieces)) reader.enqueue(pieces);
  };

  // ---- the loop ------------------------------------------------------------------------------
  StepContext ctx;
  ctx.rank = rank;
  ctx.world = world;
  ctx.model = model.get();
  ctx.reader = &reader;
  ctx.fill_prefetch = fill_prefetch;
  ctx.reducer = reducer.get();
  ctx.shard_optimizer = shard_optimizer;
  ctx.diagnostics = &diagnostics;
  ctx.watchdog = &watchdog;
  // The K/V exchange of cut pieces gets its own communicator: its messages never meet the
  // trainer's or the reducer's (freed at the end of the run; an error ends the job instead).
  MPI_Comm kv_comm = MPI_COMM_NULL;
  KILTER_CHECK(MPI_Comm_dup(world, &kv_comm) == MPI_SUCCESS, "MPI_Comm_dup (K/V exchange) failed");
  ctx.kv_timeout_s = cfg.comm.timeout_s;
  ctx.make_kv_exchange = comm::kv_exchange_factory(comm_kind, kv_comm, cfg.comm.timeout_s);
  double last_loss = NAN, eval_loss = NAN;
  double tokens_this_run = 0;
  const int64_t first_step = state.step;
  const double t_loop = now_seconds();
  double t_last_log = t_loop;
  double tokens_since_log = 0;
  int exit_code = 0;
  bool stop_requested = false;
  int64_t nonfinite_skipped = 0;
  // output.checkpoint_minutes: rank 0's clock decides, and the step's reduction tells every rank.
  double t_last_checkpoint = t_loop;
  // data.cut_cost_check: once per run, where the plan cuts pieces, derives its transfer charge,
  // and no earlier part of the run measured one; rank 0 collects the window's records and judges.
  const bool check_cut_cost = cfg.data.cut_cost_check > 0 && cfg.data.cost_t < 0 && state.cut_cost_t < 0 &&
                              world_size > 1 && st.cuts > 0;
  CutCostWatch cut_watch(check_cut_cost ? cfg.data.cut_cost_check : 0, first_step);
  if (rank == 0 && cut_watch.active())
    diagnostics.on_step_records([&cut_watch](const diag::StepRecord* records, int ranks) {
      cut_watch.add_step(records, ranks);
    });
  nlohmann::json cut_cost_summary;  // rank 0: the check's verdict
  balance::CutCostCheck cut_check;

  while (state.step < total_steps) {
    // plan
    const balance::EpochPlan& plan = plans.get(state.position.epoch);
    const balance::StepView step = plans.step(state.position);
    maybe_fail_for_test(rank, state.step);
    diagnostics.begin_step(state.step);
    model->zero_grads();
    ctx.step_index = state.step;
    ctx.checkpoint_due = rank == 0 && cfg.output.checkpoint_minutes > 0 &&
                         now_seconds() - t_last_checkpoint >= cfg.output.checkpoint_minutes * 60;
    ctx.replan_t = 0;
    if (rank == 0 && cut_watch.ready()) {
      cut_check = cut_watch.decide(plans.cost(state.position));
      if (cut_check.replan && cfg.data.cut_cost_replan)
        ctx.replan_t = cut_check.measured_t;
      else if (cut_check.measured)
        std::fprintf(stderr, "kilter: %s%s\n", cut_check.replan ? "warning: " : "",
                     describe_cut_cost_check(cut_check, cut_watch.window_begin(), cut_watch.window_end(), -1).c_str());
      cut_cost_summary = {{"window", {cut_watch.window_begin(), cut_watch.window_end()}},
                          {"measured", cut_check.measured},
                          {"measured_t", cut_check.measured ? nlohmann::json(cut_check.measured_t) : nlohmann::json(nullptr)},
                          {"planned_t", cut_check.planned_t},
                          {"excess_share", cut_check.excess_share},
                          {"rows", cut_check.rows},
                          {"charge_held", !cut_check.replan},
                          {"replanned_from_step", nullptr}};
    }
    // read -> forward/backward (the reduction starts inside the last backward)
    StepWork work;
    const double local_loss_sum = compute_gradients(ctx, step, work);
    // reduce
    const ReducedStep reduced = reduce(ctx, step, local_loss_sum, state.step);
    const double loss = reduced.loss;
    stop_requested = reduced.stop_requested;
    // update
    const UpdateResult updated = update(ctx, cfg.train, reduced, state.step, total_steps);
    nonfinite_skipped += updated.skipped;
    const double lr = updated.lr, grad_norm = updated.grad_norm;

    diagnostics.set_step_work(work.tokens_computed, work.attn_work, work.micro_batches, work.kv_tokens,
                              work.kv_bytes);
    const double step_tokens = double(step.target_tokens());
    if (data.mixture()) {
      if (rank == 0 && (state.position.step_in_epoch == 0 || state.step == first_step))
        for (const std::string& line : wrap_messages(data, plans.wraps(state.position.epoch)))
          std::fprintf(stderr, "kilter: mixture epoch %llu: %s\n", (unsigned long long)state.position.epoch + 1, line.c_str());
      const std::vector<uint64_t> by_source = balance::tokens_by_source(step, data.doc_begin);
      for (size_t k = 0; k < by_source.size(); ++k) tokens_per_source[k] += by_source[k];
    }
    diagnostics.end_step(state.step, int64_t(step.target_tokens()), loss);
    last_loss = loss;
    tokens_this_run += step_tokens;
    tokens_since_log += step_tokens;
    ++state.step;
    state.tokens_seen += step_tokens;
    // `plan` and `step` are not used past this point: a finished epoch's plan can go.
    state.position = balance::next_position(state.position, plan.steps.size());
    if (state.position.step_in_epoch == 0) plans.drop_before(state.position.epoch);
    if (reduced.replan_t > 0) {
      // The cut-cost check's verdict reached every rank in this step's reduction. The new plan
      // starts after the furthest step any rank's reader has been fed from.
      watchdog.enter("cut-cost re-plan", long(state.step));
      long long fed = (long long)(total_steps - cursor.steps_left());
      MPI_Allreduce(MPI_IN_PLACE, &fed, 1, MPI_LONG_LONG, MPI_MAX, world);
      watchdog.leave();
      const int64_t from_step = int64_t(fed) + 1;
      if (from_step < total_steps) {
        balance::PlanPosition from = state.position;
        for (int64_t i = state.step; i < from_step; ++i)
          from = balance::next_position(from, plans.get(from.epoch).steps.size());
        plans.replan(from, reduced.replan_t);
        state.cut_cost_t = reduced.replan_t;
      }
      if (rank == 0) {
        const int64_t shown = from_step < total_steps ? from_step : kRunEnds;
        std::fprintf(stderr, "kilter: %s\n", describe_cut_cost_check(cut_check, cut_watch.window_begin(),
                                                                     cut_watch.window_end(), shown).c_str());
        if (shown >= 0) cut_cost_summary["replanned_from_step"] = shown;
      }
    }

    const bool eval_now = cfg.train.eval_every > 0 && state.step % cfg.train.eval_every == 0;
    double step_eval_loss = NAN;
    if (eval_now) {
      // The step's parameter gather may still run on the reducer's thread: it ends before this
      // thread makes blocking MPI calls of its own (Open MPI's waits of two threads take each
      // other's locks; TSan reports the order), and before the parameters are read.
      model->finish_arriving_params();
      step_eval_loss = eval_loss = evaluate(ctx, *eval_plans, index, data_dir, ropts, cfg.train.eval_batches, state.step);
      for (size_t k = 0; k < source_eval_plans.size(); ++k) {
        if (!source_eval_plans[k]) continue;
        const double loss_k = evaluate(ctx, *source_eval_plans[k], index, data_dir, ropts, cfg.train.eval_batches, state.step);
        eval_loss_per_source[data.sources[k]] = loss_k;
        if (rank == 0) std::fprintf(stderr, "kilter: step %lld eval loss %.4f on %s\n", (long long)state.step, loss_k,
                                    data.sources[k].c_str());
      }
    }
    const bool log_now = state.step % cfg.output.log_every == 0 || state.step == total_steps || state.step == first_step + 1;
    if (rank == 0 && (log_now || eval_now)) {
      const double t = now_seconds();
      const double rate = tokens_since_log / std::max(1e-9, t - t_last_log);
      const double per_step = (t - t_loop) / double(state.step - first_step);
      // The progress line and the eval line share stdout; train.csv gets both as one row.
      if (log_now)
        std::printf("step %6lld/%lld | loss %.4f | lr %.2e | grad norm %.3f | %8.0f tok/s | eta %s\n",
                    (long long)state.step, (long long)total_steps, loss, lr, grad_norm, rate,
                    format_duration(per_step * double(total_steps - state.step)).c_str());
      if (eval_now)
        std::printf("step %6lld/%lld | eval loss %.4f | perplexity %.2f\n", (long long)state.step,
                    (long long)total_steps, step_eval_loss, std::exp(step_eval_loss));
      std::fflush(stdout);
      diag::TrainRow row;
      row.step = state.step;
      row.tokens = state.tokens_seen;
      row.loss = loss;
      row.lr = lr;
      row.grad_norm = grad_norm;
      row.tokens_per_second = rate;
      row.eval_loss = step_eval_loss;
      row.elapsed_seconds = t - t_loop;
      train_csv->append_line(diag::train_csv_row(row));
      t_last_log = t;
      tokens_since_log = 0;
    }
    sampler.maybe_sample(*model, state.step);
    const bool periodic = (cfg.output.checkpoint_every > 0 && state.step % cfg.output.checkpoint_every == 0) ||
                          reduced.checkpoint_due;
    if (stop_requested || periodic || state.step == total_steps) {
      t_last_checkpoint = now_seconds();
      model->finish_arriving_params();  // as before evaluating
      // The run ends after a final one: its failure fails the run (Checkpointer::wait), while a
      // periodic one that fails is a warning and the next interval tries again.
      checkpointer.save(*model, state, /*final_checkpoint=*/stop_requested || state.step == total_steps);
    }
    if (stop_requested) {
      exit_code = kExitPreempted;
      break;
    }
  }
  model->finish_arriving_params();  // the last step's gather, where nothing has read the parameters since
  checkpointer.wait();
  if (rank == 0) {  // what the last checkpoint cost (bench/checkpoint_write.sh reads this line)
    const Checkpointer::SaveStats saved = checkpointer.last_save();
    if (!saved.path.empty())
      std::fprintf(stderr, "kilter: checkpoint %s: %.3f GiB of tensors; the step waited %.2f s, the writer took %.2f s\n",
                   saved.path.c_str(), double(saved.bytes) / double(1ull << 30),
                   saved.waited_seconds + saved.snapshot_seconds, saved.write_seconds);
  }
  if (exit_code == kExitPreempted && rank == 0)
    std::fprintf(stderr, "kilter: stop signal received: checkpoint of step %lld written, exiting with code %d\n",
                 (long long)state.step, kExitPreempted);
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
  extra["cost_wait_fraction"] = st.cost_wait_fraction;
  // Cut pieces (issue 23), named as in `kilter plan --json`: what the plan cut, what it exchanges,
  // and the imbalance without the cuts and the whole-piece bound beside it, so the gain shows.
  extra["cost_imbalance_bound_p50"] = st.cost_imbalance_bound_p50;
  extra["cost_imbalance_bound_p95"] = st.cost_imbalance_bound_p95;
  extra["cost_imbalance_uncut_p50"] = st.cost_imbalance_uncut_p50;
  extra["cost_imbalance_uncut_p95"] = st.cost_imbalance_uncut_p95;
  extra["cost_imbalance_uncut_max"] = st.cost_imbalance_uncut_max;
  // The cost model the plan divided the last steps with: t, the charge per earlier token it cut
  // with, which `kilter report` compares with what the run's kv_wait measured in the units a, b
  // and c define.
  const balance::CostModel& plan_cost = plans.cost(state.position);
  extra["plan_cost_a"] = plan_cost.a;
  extra["plan_cost_b"] = plan_cost.b;
  extra["plan_cost_c"] = plan_cost.c;
  extra["plan_cost_t"] = plan_cost.t;
  // The cut-cost check (data.cut_cost_check): its window, what it measured, and where the plan
  // changed (null: it did not); absent where the check did not run in this process.
  if (!cut_cost_summary.is_null()) extra["cut_cost_check"] = cut_cost_summary;
  extra["cuts_per_step_p50"] = st.cuts_per_step_p50;
  extra["cuts_per_step_max"] = st.cuts_per_step_max;
  extra["cut_pieces"] = st.cut_pieces;
  extra["cut_piece_ranks_max"] = st.cut_piece_ranks_max;
  extra["plan_kv_bytes_per_step_p50"] = st.kv_bytes_per_step_p50;
  extra["plan_kv_bytes_per_step_max"] = st.kv_bytes_per_step_max;
  extra["plan_kv_bytes_per_rank_max"] = st.kv_bytes_per_rank_max;
  extra["long_pieces"] = st.long_pieces;
  extra["long_piece_ranks_max"] = st.long_piece_ranks_max;
  extra["steps_per_epoch"] = st.steps_per_epoch;
  extra["micro_batches_per_step"] = st.micro_batches_per_step;
  extra["sampler"] = cfg.data.sampler;
  extra["backend"] = backend;
  extra["backend_detail"] = model->describe();
  extra["comm_algo"] = algo;
  extra["shard_optimizer"] = shard_optimizer;
  extra["num_nodes"] = topo.num_nodes;
  extra["ranks_per_node"] = topo.local_size;
  extra["num_params"] = model->layout().num_params;
  extra["nonfinite_steps_skipped"] = nonfinite_skipped;
  extra["elapsed_seconds"] = elapsed;
  extra["startup_seconds"] = t_loop - t_start;
  extra["preempted"] = exit_code == kExitPreempted;
  extra["resumed_from_step"] = first_step;
  if (data.mixture()) {  // this run's steps (not those before a resume)
    for (size_t k = 0; k < data.sources.size(); ++k) {
      extra["tokens_per_source"][data.sources[k]] = tokens_per_source[k];
      extra["source_weights"][data.sources[k]] = data.weights[k];
    }
    extra["eval_loss_per_source"] = eval_loss_per_source;
  }
  nlohmann::json summary = diagnostics.finish(extra);
  if (rank == 0) {
    std::fprintf(stderr, "kilter: done: %lld steps, final loss %.4f, %.0f tokens/s, summary in %s\n",
                 (long long)state.step, last_loss, elapsed > 0 ? tokens_this_run / elapsed : 0.0,
                 (fs::path(run_dir) / "summary.json").string().c_str());
    if (opts.json) std::printf("%s\n", summary.dump(2).c_str());
  }
  MPI_Comm_free(&kv_comm);
  comm::free_topology(topo);
  return exit_code;
}

}  // namespace kilter::train
