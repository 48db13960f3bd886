// The set-up of a training run (see run_setup.h), in the order make_run() calls its parts.
#include "lib/train/run_setup.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>

#include "io/dataset.h"
#include "io/base/error.h"
#include "kilter/build_info.h"
#include "lib/balance/plan_config.h"
#include "lib/balance/plan_report.h"
#include "lib/comm/kv_schedule.h"
#include "lib/model/gemm.h"
#include "lib/train/guards.h"
#include "lib/train/hf_interop.h"
#include "lib/train/memory_plan.h"
#include "lib/train/param_shards.h"
#ifdef KILTER_WITH_NCCL
#include "lib/train/param_shards_nccl.h"
#endif
#include "lib/train/calibration_driver.h"
#include "lib/train/run_dir.h"
#include "lib/train/run_engine_probes.h"
#include "lib/train/signals.h"
#include "lib/train/staging.h"

namespace fs = std::filesystem;

namespace kilter::train {

ModelOutlivesCollective::~ModelOutlivesCollective() {
  if (std::uncaught_exceptions() > 0 && reducer && reducer->communicating()) (void)model.release();
}

double now_seconds() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

namespace {

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

// The topology, the checks that must agree across ranks, and the run directory: moved aside
// (--force), its checkpoint found (--resume), its folders made.
void open_run_dir(Run& run) {
  run.topo = comm::make_topology(run.world, run.cfg.comm.ranks_per_node);
  check_consistent_across_ranks(run.world, run.cfg.hash(), KILTER_VERSION, run.cfg.to_ini());
  model::set_gemm_threads(run.cfg.train.threads);  // oneDNN (OpenMP) threads of this rank

  run.run_dir = resolve_run_dir(run.cfg, run.opts);
  run.cfg.output.dir = run.run_dir;
  run.resuming = !run.opts.resume.empty();
  if (run.rank == 0 && !run.opts.note.empty()) std::fprintf(stderr, "kilter: %s\n", run.opts.note.c_str());
  if (run.rank == 0 && run.opts.move_aside) {  // --force: the old run is kept under a new name
    const std::string moved = move_run_aside(run.run_dir);
    std::fprintf(stderr, "kilter: --force: moved the run in %s to %s; starting over\n", run.run_dir.c_str(),
                 moved.c_str());
  }
  MPI_Barrier(run.world);
  if (run.resuming) run.resume_path = find_resume_checkpoint(run.world, run.run_dir, run.opts.resume);
  if (run.rank == 0) {
    fs::create_directories(fs::path(run.run_dir) / "metrics");
    fs::create_directories(fs::path(run.run_dir) / "trace");
    fs::create_directories(fs::path(run.run_dir) / "checkpoints");
  }
  MPI_Barrier(run.world);
}

// The data (one dataset or a mixture), staged where asked, split and planned.
void load_data(Run& run) {
  Config& cfg = run.cfg;
  run.data = load_training_data(cfg);  // data.dir, or data.sources merged into one index
  const io::DatasetIndex& index = run.data.index;
  if (cfg.model.vocab_size == 0) cfg.model.vocab_size = int(index.vocab_size);
  KILTER_CHECK(uint32_t(cfg.model.vocab_size) >= index.vocab_size,
               "config key model.vocab_size = " << cfg.model.vocab_size << " is smaller than the vocabulary of "
                                                << index.dir << " (" << index.vocab_size << ")");
  if (!run.resuming) check_new_run_dir(run.world, run.run_dir, cfg);  // with the config resolved as config.ini holds it
  run.data_dir = cfg.data.dir;
  if (!cfg.data.stage_dir.empty())
    run.data_dir = stage_dataset(index, cfg.data.stage_dir, run.topo.node, run.topo.local_rank);

  run.split = balance::split_documents(index.doc_lengths, cfg.data.eval_fraction, cfg.train.seed);
  run.plan_opts = balance::plan_options_from_config(cfg, index.vocab_size, run.world_size, run.topo.local_size);
  run.plans = make_plan_cache(run.data, run.split.train_docs, run.plan_opts, run.world_size);
}

// The model's description, its memory check and its construction, kept together: a run that
// cannot fit is refused here, before any rank allocates model memory.
std::unique_ptr<model::Model> make_run_model(Run& run, size_t pad_multiple) {
  const Config& cfg = run.cfg;
  check_memory_plan(run.world, cfg, run.topo.local_size, run.resuming, run.backend);
  const model::ModelSpec& gpt = cfg.model;
  model::BackendOptions backend_options;
  backend_options.precision = cfg.train.precision;
  backend_options.attention = cfg.train.attention;
  backend_options.cuda_graphs = cfg.train.cuda_graphs;
  backend_options.recompute = cfg.train.recompute;
  backend_options.bf16_storage = cfg.train.bf16_storage;
  // The NCCL shards own the device buffers (lib/train/param_shards_nccl.h), made just below.
  backend_options.params_held_elsewhere =
      run.backend == "cuda" && cfg.train.shard == "parameters" && run.world_size > 1;
  // The engines this run would trust untested run first in a child process, one per node; the
  // ranks agree on their verdicts (run_engine_probes.h), bf16 storage (auto) included.
  run.engine_choices = probe_engines(run.world, run.topo, run.run_dir, run.backend, gpt, backend_options);
  // Where nothing could be probed, bf16 storage (auto) takes its start-up self-check in-process;
  // every rank checks on its own device and the ranks agree, so that they all train on one datapath.
  if (backend_options.bf16_storage == "auto" && run.backend == "cuda" && backend_options.precision == "bf16" &&
      backend_options.attention != "cudnn") {  // what datapath_self_check checks
    const std::string why = model::datapath_self_check(run.backend, gpt, backend_options);
    int passed = why.empty() ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &passed, 1, MPI_INT, MPI_MIN, run.world);
    if (!why.empty())
      std::fprintf(stderr, "kilter: rank %d: the bf16-storage datapath disagreed with the CPU oracle (%s)\n", run.rank,
                   why.c_str());
    if (!passed && run.rank == 0)
      std::fprintf(stderr, "kilter: cuda backend: every rank trains with fp32 activations and bf16 GEMMs, as "
                   "train.bf16_storage = off does\n");
    backend_options.bf16_storage = passed ? "on" : "off";
    backend_options.bf16_storage_checked = true;
  }
  return model::make_model(run.backend, gpt, pad_multiple, backend_options);
}

// The gradient reducer over the model's flat buffer. It decides which ranges this rank owns; a
// sharded model keeps moments only for them, from before a resume loads any.
void make_reducer(Run& run) {
  const Config& cfg = run.cfg;
  run.comm_kind = run.backend == "cuda" ? "nccl" : "mpi";
  run.algo = cfg.comm.algo;
  if (run.algo == "hierarchical" && !run.topo.uniform) run.algo = "flat";  // make_topology has warned
  comm::ReducerOptions reducer_opts;
  reducer_opts.kind = run.comm_kind;
  reducer_opts.algo = run.algo;
  reducer_opts.bucket_bytes = size_t(cfg.comm.bucket_mb * 1024 * 1024);
  reducer_opts.overlap = cfg.comm.overlap ? comm::OverlapMode::automatic : comm::OverlapMode::off;
  reducer_opts.timeout_s = cfg.comm.timeout_s;
  reducer_opts.shard = run.shard_optimizer;
  reducer_opts.shard_within_node = run.shard_optimizer && run.shard_within_node;
  // The model reports every float of the padded buffer (the padding together with ln_f).
  reducer_opts.reported_size = run.model->layout().padded_size;
  if (run.cfg.train.shard == "parameters" && run.world_size > 1) {
    // Groups of G consecutive ranks; below the world, the ranks of one index across the groups
    // hold the same chunks (HSDP) and sum them at the step's end.
    MPI_Comm group = run.world, replicas = MPI_COMM_NULL;
    const bool hsdp = run.shard_group < run.world_size;
    if (hsdp) {
      KILTER_CHECK(MPI_Comm_split(run.world, run.rank / run.shard_group, run.rank, &group) == MPI_SUCCESS &&
                       MPI_Comm_split(run.world, run.rank % run.shard_group, run.rank, &replicas) == MPI_SUCCESS,
                   "MPI_Comm_split (parameter shard groups) failed");
    }
    std::unique_ptr<UnitShards> shards;
    try {
      if (run.backend == "cuda") {
#ifdef KILTER_WITH_NCCL
        shards = make_nccl_param_shards(group, replicas, run.model->layout(), cfg.train.reshard_after_forward,
                                        cfg.comm.timeout_s);
#else
        KILTER_USER_FAIL("config key train.shard = parameters: the cuda backend shards parameters over NCCL, "
                         "which this build lacks (kilter --version); use train.shard = optimizer");
#endif
      } else {
        shards = std::make_unique<ParamShards>(group, replicas, run.model->layout(), run.model->params(),
                                               run.model->grads(), cfg.train.reshard_after_forward);
      }
      // Training samples: rank 0's group feeds it the units (collective over that group).
      if (cfg.output.sample_every > 0 && run.rank < run.shard_group)
        run.sample_feed = std::make_unique<SampleFeed>(group, *run.model, *shards);
    } catch (...) {
      if (hsdp) MPI_Comm_free(&group), MPI_Comm_free(&replicas);
      throw;
    }
    if (hsdp) MPI_Comm_free(&group), MPI_Comm_free(&replicas);
    run.shard_norm_counts = run.rank < run.shard_group;
    run.param_shards = shards.get();
    run.reducer = std::move(shards);
    run.model->set_param_units(run.param_shards);
  } else if (reducer_opts.shard_within_node) {
    // HSDP: the shard groups play the nodes of the hierarchical reduction (scatter inside the
    // group, all-reduce across groups among the ranks of the same index). A group that is the
    // node uses the node's communicators; otherwise groups of G consecutive ranks. The reducer
    // dups what it uses, so a topology made here is freed at once.
    const bool node_groups = run.shard_group == run.topo.local_size && run.topo.uniform;
    comm::Topology groups = node_groups ? run.topo : comm::make_topology_from_node_ids(run.world, run.rank / run.shard_group);
    reducer_opts.algo = "hierarchical";
    run.shard_norm_counts = node_groups ? run.topo.node_index == 0 : run.rank < run.shard_group;
    try {
      run.reducer = comm::make_gradient_reducer(groups, run.model->grads(), run.model->layout().padded_size, reducer_opts);
    } catch (...) {
      if (!node_groups) comm::free_topology(groups);
      throw;
    }
    if (!node_groups) comm::free_topology(groups);
  } else {
    run.reducer = comm::make_gradient_reducer(run.topo, run.model->grads(), run.model->layout().padded_size, reducer_opts);
  }
  // After set_param_units: under parameters on the cuda backend with bf16 storage the model keeps
  // the fp32 master of the holder's chunks (the distributed optimizer), and the holder gathers the
  // bf16 working copy alone.
  if (run.shard_optimizer) {
    std::vector<model::ParamRange> owned;
    for (const comm::BufferRange& r : run.reducer->owned()) owned.push_back({r.offset, r.count});
    run.model->shard_optimizer(owned);
  }
}

// train.shard = parameters as built so far: the cpu backend (MPI) and the cuda backend (NCCL,
// without CUDA graphs: CudaModel::set_param_units). Pieces cut between ranks work as they are on
// both: a later part's K/V wait sits inside the same unit's gathers on every rank (the exchange is
// nonblocking and on its own communicator, and each rank has queued the gathers up to block l + 1
// before block l's attention), so no rank waits on a peer behind a gather it is in. Training
// samples gather unit by unit to the group's first rank on both (SampleFeed). Refused before
// anything is allocated, naming the key.
void check_parameter_sharding(const Run& run) {
  const Config& cfg = run.cfg;
  const std::string what = "config key train.shard = parameters: ";
  KILTER_USER_CHECK(run.backend == "cpu" || run.backend == "cuda",
                    what << "sharding the parameters is built on the cpu and cuda backends only; use "
                            "train.shard = optimizer on the " << run.backend << " backend");
  if (run.backend != "cuda") return;
  KILTER_USER_CHECK(!cfg.train.cuda_graphs,
                    what << "CUDA graphs are not built for it (each unit's gather and reduce-scatter runs between "
                            "the kernels); set train.cuda_graphs = false");
}

// The model, its reducer and its initial weights (a seed, or train.init_from in a new run).
void build_model(Run& run) {
  const Config& cfg = run.cfg;
  run.backend = cfg.train.backend;
  if (run.backend == "auto") run.backend = model::cuda_available() ? "cuda" : "cpu";
  // Node shards of the flat gradient buffer are contiguous and 64-float aligned; sharded (ZeRO-1),
  // so is every rank's share of each bucket.
  // train.shard_group is checked here, where the world size is known (it must divide it).
  const int group = shard_group_size(cfg.train, run.world_size, run.topo.local_size);
  if (cfg.train.shard == "parameters" && run.world_size > 1) check_parameter_sharding(run);
  // train.grad_dtype: bf16 accumulation is built where the gradients accumulate over a step's
  // micro-batches (none, optimizer; parameters reduce-scatters each micro-batch into fp32 shards),
  // on both backends (Model::round_grads_bf16). auto: bf16 under bf16 storage on the cpu backend,
  // else fp32 (a cuda run asks for bf16 explicitly).
  const bool sharded_parameters = cfg.train.shard == "parameters" && run.world_size > 1;
  const bool bf16_grads_built = !sharded_parameters;
  KILTER_USER_CHECK(cfg.train.grad_dtype != "bf16" || bf16_grads_built,
                    "config key train.grad_dtype = bf16: a bf16 gradient accumulation buffer is built under "
                    "train.shard = none or optimizer only (here: backend " << run.backend << ", train.shard = "
                    << cfg.train.shard << "); use train.grad_dtype = fp32 or auto");
  const bool cpu_bf16_storage = run.backend == "cpu" && cfg.train.precision == "bf16" && cfg.train.bf16_storage == "on";
  run.bf16_grads = bf16_grads_built && resolved_grad_dtype(cfg.train, cpu_bf16_storage) == "bf16";
  run.shard_optimizer = cfg.train.shard != "none" && run.world_size > 1;
  // A group smaller than the world is built as the node (HSDP): the node's ranks shard, nodes
  // replicate; it needs the hierarchical reduction over uniform nodes.
  run.shard_within_node = run.shard_optimizer && group < run.world_size;
  run.shard_group = run.shard_optimizer ? group : 1;
  // (train.shard = parameters makes its own groups in make_reducer, on either backend; under
  // optimizer the groups are the hierarchical reducer's nodes, over MPI or NCCL alike.)
  const size_t pad_multiple = size_t(run.shard_optimizer ? run.world_size : run.topo.local_size) * 64;
  run.model = make_run_model(run, pad_multiple);
  if (run.shard_optimizer && !run.model->supports_optimizer_shard()) {
    run.shard_optimizer = false;
    if (run.rank == 0)
      std::fprintf(stderr, "kilter: warning: train.shard_optimizer = true: the %s backend has no sharded optimizer "
                   "yet; every rank keeps the full optimizer state\n", run.model->backend_name().c_str());
  }
  make_reducer(run);
  run.model->init_params(cfg.train.seed);
  if (!run.resuming && !cfg.train.init_from.empty()) {  // a resumed run continues from its own checkpoint
    const std::string note = load_initial_weights(run.world, cfg, run.data.index, *run.model);
    if (run.rank == 0) std::fprintf(stderr, "kilter: %s\n", note.c_str());
  }
  if (run.param_shards) run.param_shards->release_all();  // the whole initialization leaves only this rank's chunks
  // A micro-batch holds at most max_tokens tokens in pieces of at most block_size.
  run.model->reserve(int(cfg.data.max_tokens), cfg.model.block_size);
}

// The training state: step 0, or a resume's checkpoint (and the cut charge it measured).
// config.ini is written only then: a refused run leaves the run directory's as it was.
void load_state(Run& run) {
  const Config& cfg = run.cfg;
  TrainState& state = run.state;
  state.seed = cfg.train.seed;
  state.config_hash = cfg.hash();
  state.world_size = run.world_size;
  if (run.resuming) {
    state = Checkpointer::load(run.world, run.resume_path, *run.model, cfg);
    if (run.rank == 0)
      std::fprintf(stderr, "kilter: resumed from %s at step %lld (epoch %llu, step %llu of the epoch)\n",
                   run.resume_path.c_str(), (long long)state.step, (unsigned long long)state.position.epoch,
                   (unsigned long long)state.position.step_in_epoch);
    state.world_size = run.world_size;
    if (cfg.data.cost_t >= 0) state.cut_cost_t = -1;  // a given data.cost_t is the charge
    // The models the in-run calibration put in force, with the cut-cost check's charge in them.
    restore_calibration(run);
    if (state.cut_cost_t >= 0 && run.calibration.models().empty()) {
      // The charge this run's cut-cost check measured before the checkpoint: the plans it made
      // since continue (nothing has been planned yet in this process).
      run.plans->replan(state.position, state.cut_cost_t);
      if (run.rank == 0)
        std::fprintf(stderr, "kilter: plan: cut pieces are charged t = %.3g per earlier token, as this run's cut-cost "
                     "check measured before the checkpoint (data.cost_t fixes another)\n", state.cut_cost_t);
    }
  }
  if (run.rank == 0) write_text_file(fs::path(run.run_dir) / "config.ini", cfg.to_ini());
}

// Diagnostics, checkpoints, samples, the watchdog, train.csv, and the reader fed by the cursor.
void start_services(Run& run) {
  const Config& cfg = run.cfg;
  const io::DatasetIndex& index = run.data.index;
  diag::DiagOptions dopts;
  dopts.run_dir = run.run_dir;
  dopts.trace_steps = cfg.output.trace_steps;
  dopts.stall_factor = cfg.output.stall_factor;
  dopts.inject_delay = cfg.train.inject_delay;
  dopts.resume = run.resuming;
  dopts.tensorboard = cfg.output.tensorboard;
  dopts.log_every = cfg.output.log_every;
  run.diagnostics = std::make_unique<diag::RankDiagnostics>(run.world, dopts);
  run.checkpointer = std::make_unique<Checkpointer>(run.world, run.run_dir, cfg.output.keep_checkpoints, cfg);
  run.checkpointer->set_tokenizer(index.tokenizer, index.tokenizer_data, index.eos_id);  // checkpoints decode on their own
  // The training documents' first tokens, which the model never predicts: what unprompted samples
  // start from (rank 0 writes checkpoints and prints samples).
  std::vector<std::pair<uint32_t, uint64_t>> document_starts;
  if (run.rank == 0) document_starts = count_document_starts(index, run.data_dir, run.split.train_docs);
  run.checkpointer->set_document_starts(document_starts);
  run.sampler = std::make_unique<TrainingSampler>(cfg, index, run.rank, to_document_starts(document_starts));
  // Under sharded parameters, rank 0's shard group (its first shard_group ranks) sends it the units.
  run.sampler->set_sample_feed(run.sample_feed.get());
  run.watchdog = std::make_unique<Watchdog>(run.world, cfg.comm.timeout_s);
  // metrics/train.csv: rank 0 writes what it already logs, so no rank waits for it.
  if (run.rank == 0)
    run.train_csv = std::make_unique<diag::CsvAppender>(diag::train_csv_path(run.run_dir), diag::train_csv_header(),
                                                        run.resuming);
  run.reader_opts.prefetch = cfg.data.prefetch;
  run.reader_opts.threads = cfg.data.reader_threads;
  run.reader = std::make_unique<io::PrefetchReader>(index, run.data_dir, run.reader_opts);
  run.total_steps = cfg.train.steps;
  run.cursor = std::make_unique<PrefetchCursor>(*run.plans, run.rank, run.state.position,
                                                std::max<int64_t>(0, run.total_steps - run.state.step));
}

// Evaluation: the first eval_batches steps of the held-out split's plan (world-size independent),
// and with a mixture every source's on its own held-out documents.
void make_eval_plans(Run& run) {
  const Config& cfg = run.cfg;
  // Evaluation runs forward only, without a K/V exchange: its plans keep every piece whole, in
  // micro-batches that hold a whole context where data.max_tokens is shorter (long contexts).
  balance::PlanOptions eval_opts = run.plan_opts;
  eval_opts.cut_pieces = false;
  eval_opts.max_tokens = std::max<uint64_t>(eval_opts.max_tokens, eval_opts.context);
  if (cfg.train.eval_every > 0) {
    KILTER_CHECK(!run.split.eval_docs.empty(), "train.eval_every = " << cfg.train.eval_every
                                               << " needs held-out documents: set data.eval_fraction > 0");
    run.eval_plans = std::make_unique<PlanCache>(run.data.index, run.split.eval_docs, eval_opts, run.world_size);
  }
  run.source_eval_plans.resize(run.data.sources.size());
  for (size_t k = 0; run.eval_plans && k < run.data.sources.size(); ++k) {
    std::vector<uint64_t> docs = run.data.docs_of(k, run.split.eval_docs);
    if (!docs.empty())
      run.source_eval_plans[k] = std::make_unique<PlanCache>(run.data.index, std::move(docs), eval_opts, run.world_size);
  }
}

// Rank 0: the run in two lines, the plan's cuts, and the warnings `kilter plan` gives for it.
void log_run_start(const Run& run, const balance::EpochPlan& plan) {
  const Config& cfg = run.cfg;
  const balance::PlanStats& st = plan.stats;
  std::fprintf(stderr,
               "kilter %s: %d ranks (%d nodes x %d), backend %s, comm %s/%s, model %d layers x %d "
               "(%zu params), %s\n"
               "kilter: plan %s: %llu steps/epoch, %.1f micro-batches/step, padding efficiency %.3f, "
               "cost imbalance p95 %.3f; run dir %s\n",
               KILTER_VERSION, run.world_size, run.topo.num_nodes, run.topo.local_size, run.backend.c_str(),
               run.comm_kind.c_str(), run.algo.c_str(), cfg.model.n_layer, cfg.model.n_embd,
               run.model->layout().num_params, run.data_dir.c_str(), cfg.data.sampler.c_str(),
               (unsigned long long)st.steps_per_epoch, st.micro_batches_per_step, st.padding_efficiency,
               st.cost_imbalance_p95, run.run_dir.c_str());
  if (run.backend != "cpu") std::fprintf(stderr, "kilter: model on %s\n", run.model->describe().c_str());
  if (st.cuts > 0)
    std::fprintf(stderr, "kilter: plan cuts pieces between ranks: %s\n", balance::describe_cuts(st).c_str());
  for (const std::string& warning : balance::plan_warnings(plan, run.plan_opts, cfg.comm.link_gbps))
    std::fprintf(stderr, "kilter: warning: %s\n", warning.c_str());
}

// data.cut_cost_check: once per run, where the plan cuts pieces, derives its transfer charge,
// and no earlier part of the run measured one; rank 0 collects the window's records and judges.
void start_cut_cost_watch(Run& run) {
  const Config& cfg = run.cfg;
  const bool check_cut_cost = cfg.data.cut_cost_check > 0 && cfg.data.cost_t < 0 && run.state.cut_cost_t < 0 &&
                              run.world_size > 1 && run.start_stats.cuts > 0;
  run.cut_watch = CutCostWatch(check_cut_cost ? cfg.data.cut_cost_check : 0, run.state.step);
  if (run.rank == 0 && run.cut_watch.active())
    run.diagnostics->on_step_records([&cut_watch = run.cut_watch](const diag::StepRecord* records, int ranks) {
      cut_watch.add_step(records, ranks);
    });
}

// What every step's stages use (train_step.h); the K/V exchange on a communicator of its own.
void make_step_context(Run& run) {
  StepContext& ctx = run.ctx;
  ctx.rank = run.rank;
  ctx.world = run.world;
  ctx.model = run.model.get();
  ctx.reader = run.reader.get();
  ctx.fill_prefetch = [&run]() {
    std::vector<io::PieceRequest> pieces;
    while (run.reader->queued() < size_t(run.cfg.data.prefetch) && run.cursor->next(pieces)) run.reader->enqueue(pieces);
  };
  ctx.reducer = run.reducer.get();
  ctx.shard_optimizer = run.shard_optimizer;
  ctx.bf16_grads = run.bf16_grads;
  ctx.shard_norm_counts = run.shard_norm_counts;
  ctx.param_shards = run.param_shards;
  if (run.param_shards) run.param_shards->set_watchdog(run.watchdog.get());
  ctx.diagnostics = run.diagnostics.get();
  ctx.watchdog = run.watchdog.get();
  KILTER_CHECK(MPI_Comm_dup(run.world, &run.kv_comm) == MPI_SUCCESS, "MPI_Comm_dup (K/V exchange) failed");
  ctx.kv_timeout_s = run.cfg.comm.timeout_s;
  ctx.make_kv_exchange = comm::kv_exchange_factory(run.comm_kind, run.kv_comm, run.cfg.comm.timeout_s);
}

}  // namespace

std::unique_ptr<Run> make_run(MPI_Comm world, const Config& cfg, const RunOptions& opts) {
  auto run = std::make_unique<Run>();
  run->world = world;
  run->cfg = cfg;
  run->opts = opts;
  MPI_Comm_rank(world, &run->rank);
  MPI_Comm_size(world, &run->world_size);
  set_error_rank(run->rank);
  install_stop_signal_handlers();
  run->t_start = now_seconds();

  open_run_dir(*run);
  load_data(*run);
  build_model(*run);
  load_state(*run);
  start_services(*run);
  make_eval_plans(*run);
  // The statistics of the epoch the run starts in: logged now and reported in the summary.
  const balance::EpochPlan& start_plan = run->plans->get(run->state.position.epoch);
  run->start_stats = start_plan.stats;
  if (run->rank == 0) log_run_start(*run, start_plan);
  make_step_context(*run);
  start_cut_cost_watch(*run);
  start_calibration(*run);
  return run;
}

void close_run(Run& run) {
  MPI_Comm_free(&run.kv_comm);
  comm::free_topology(run.topo);
}

}  // namespace kilter::train
