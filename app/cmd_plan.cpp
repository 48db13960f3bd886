// `kilter plan`: dry run of the batch plan. Loads the dataset index (or makes synthetic lengths),
// builds one epoch's plan for a world size and prints its statistics — one JSON object with
// --json, a short summary without. `kilter plan --calibrate RUN_DIR` fits the cost model to a
// run's measured step times instead.
#include <sys/resource.h>
#include <unistd.h>

#include <boost/program_options.hpp>
#include <chrono>
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "app/commands.h"
#include "io/dataset.h"
#include "io/progress.h"
#include "io/base/error.h"
#include "lib/balance/calibration_fit.h"
#include "lib/balance/plan.h"
#include "lib/balance/plan_config.h"
#include "lib/balance/plan_report.h"
#include "lib/balance/synthetic_lengths.h"
#include "lib/core/config.h"
#include "lib/model/model.h"
#include "lib/train/training_data.h"
#include "lib/train/memory_plan.h"

namespace po = boost::program_options;

namespace kilter::app {

namespace {

const char* kUsage =
    "usage: kilter plan --data DIR --world-size P [--ranks-per-node L] [--sampler balanced|naive] [--memory [--device-memory GIB]] [--json]\n"
    "       kilter plan --lengths lognormal:MU,SIGMA[,MAX]|uniform:MIN,MAX --docs N [--seed S] --world-size P ...\n"
    "       kilter plan --calibrate RUN_DIR [--skip-steps N] [--json]\n"
    "Builds one epoch of the batch plan without training and prints its statistics\n"
    "(padding_efficiency, cost_imbalance_p50|p95|max, steps_per_epoch, micro_batches_per_step, ...).\n"
    "Honors --config FILE and --section.key=value like `kilter train` (model.block_size, data.max_tokens,\n"
    "train.tokens_per_step, train.seed, data.sampler, data.tail, data.cost_a, data.cost_b, data.cost_c, data.cost_t,\n"
    "data.cut_pieces, comm.link_gbps, comm.device_tflops, ...).";

uint64_t current_rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size_pages = 0, resident_pages = 0;
  statm >> size_pages >> resident_pages;
  return resident_pages * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

uint64_t peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<uint64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

int run_calibration(const std::string& run_dir, int64_t skip_steps, bool json) {
  const std::vector<balance::CostSample> samples = balance::read_cost_samples(run_dir, skip_steps);
  const balance::CostFit fit = balance::fit_cost_model(samples);
  const balance::TransferFit transfer = balance::fit_transfer_cost(samples);
  const double b_over_a = fit.a > 0 ? std::max(0.0, fit.b_over_a()) : 0.0;
  const double c_over_a = fit.a > 0 ? std::max(0.0, fit.c_over_a()) : 0.0;
  if (json) {
    nlohmann::json out = {{"run_dir", run_dir},          {"samples", fit.samples},
                          {"skip_steps", skip_steps},    {"a_seconds_per_token", fit.a},
                          {"b_seconds_per_l2", fit.b},   {"c_seconds_per_micro_batch", fit.c},
                          {"intercept_seconds", fit.intercept}, {"c_from_intercept", fit.c_from_intercept},
                          {"r2", fit.r2},                {"cost_a", 1.0},
                          {"cost_b", b_over_a},          {"cost_c", c_over_a},
                          {"kv_samples", transfer.samples}, {"t_seconds_per_kv_token", transfer.seconds_per_token}};
    // cost_t only where kv_wait was measured; else null: keep the t derived from comm.link_gbps.
    out["cost_t"] = transfer.measured ? nlohmann::json(transfer.cost_t(fit.a)) : nlohmann::json(nullptr);
    std::cout << out.dump(2) << "\n";
  } else {
    std::printf("kilter plan --calibrate %s: %llu (rank, step) samples, steps < %lld skipped\n", run_dir.c_str(),
                static_cast<unsigned long long>(fit.samples), static_cast<long long>(skip_steps));
    std::printf("  forward+backward seconds = %.4g * tokens_computed + %.4g * sum(L^2) + %.4g * micro_batches + %.4g"
                "   (R^2 = %.4f)\n", fit.a, fit.b, fit.c, fit.intercept, fit.r2);
    if (fit.c_from_intercept)
      std::printf("  (micro_batches did not vary: c is the fixed time per rank-step divided by its micro-batches)\n");
    std::printf("config lines (only the ratios b/a and c/a matter to the plan):\n[data]\ncost_a = 1\ncost_b = %.6g\n"
                "cost_c = %.6g\n", b_over_a, c_over_a);
    if (transfer.measured)
      std::printf("cost_t = %.6g\n  (every kv_wait over the earlier tokens received: %.4g s per token; %llu (rank, step) rows "
                  "received K/V)\n",
                  transfer.cost_t(fit.a), transfer.seconds_per_token, static_cast<unsigned long long>(transfer.samples));
    else
      std::printf("# cost_t: not measured (no kv_wait/kv_tokens columns, or no cut piece in the run); the plan keeps t\n"
                  "# derived from the model shape, comm.link_gbps and comm.device_tflops\n");
  }
  if (fit.r2 < 0.5)
    std::fprintf(stderr, "kilter plan: warning: R^2 = %.3f: the measured times hardly follow the cost model (a shared or "
                         "noisy machine, or too little variation in lengths); do not use these values\n", fit.r2);
  if (fit.a <= 0) std::fprintf(stderr, "kilter plan: warning: the fitted per-token cost a = %g is not positive; "
                                       "the samples do not follow the cost model\n", fit.a);
  else if (fit.b < 0) std::fprintf(stderr, "kilter plan: warning: the fitted b = %g is negative; use cost_b = 0+ "
                                            "(attention is not measurable at these lengths)\n", fit.b);
  if (fit.a > 0 && fit.c < 0) std::fprintf(stderr, "kilter plan: warning: the fitted c = %g is negative; use cost_c = 0 "
                                                    "(no measurable fixed cost per micro-batch)\n", fit.c);
  return 0;
}

// --memory: the plan of `kilter train`'s start, for this world size (lib/train/memory_plan.h).
// On the cuda backend (train.backend = cuda, or auto where a device is present) the device
// figures are set against --device-memory GiB, else against this machine's device, else
// against nothing (printed as unknown).
train::MemoryPlan memory_plan(Config cfg, uint32_t dataset_vocab, int world_size, int ranks_per_node,
                              double device_memory_gib) {
  if (cfg.model.vocab_size == 0) cfg.model.vocab_size = int(dataset_vocab);
  KILTER_USER_CHECK(cfg.model.vocab_size > 0, "--memory needs the vocabulary: give --data DIR or --model.vocab_size");
  train::MemoryPlanInput in;
  in.cfg = cfg;
  in.world_size = world_size;
  in.ranks_per_node = ranks_per_node;
  in.backend = cfg.train.backend == "auto" ? (model::cuda_available() ? "cuda" : "cpu") : cfg.train.backend;
  if (in.backend == "cuda")
    in.device_bytes = device_memory_gib > 0 ? uint64_t(device_memory_gib * double(1ull << 30)) : train::device_memory_bytes();
  return train::plan_memory(in);
}


// The command line of `kilter plan`: its own flags, and the run config (--config, --section.key).
struct PlanArgs {
  Config cfg;
  std::string data_dir, sampler, lengths_spec, calibrate_dir;
  int world_size = 1, ranks_per_node = 0;
  double device_memory_gib = 0;
  uint64_t docs = 0, synth_seed = 0, epoch = 0;
  bool synth_seed_given = false;
  int64_t skip_steps = 2;
  bool json = false, memory = false;
};

// False where --help was asked (and printed).
bool parse_plan_args(int argc, char** argv, PlanArgs& a) {
  po::options_description extra("kilter plan");
  extra.add_options()
      ("data", po::value(&a.data_dir), "dataset directory (same as --data.dir)")
      ("world-size", po::value(&a.world_size)->default_value(1), "ranks to plan for")
      ("ranks-per-node", po::value(&a.ranks_per_node)->default_value(0), "ranks per node for the node figures (0: comm.ranks_per_node, else all on one node)")
      ("sampler", po::value(&a.sampler), "balanced | naive (same as --data.sampler)")
      ("epoch", po::value(&a.epoch)->default_value(0), "epoch to plan (the plan is deterministic from train.seed and the epoch)")
      ("json", "print one JSON object")
      ("memory", "also the memory plan: bytes per rank (parameters, gradients, optimizer state, activations, checkpoint, prefetch) and the node's total against this machine's memory")
      ("device-memory", po::value(&a.device_memory_gib), "with --memory on the cuda backend: GiB each rank's device offers (default: this machine's device, if any)")
      ("lengths", po::value(&a.lengths_spec), "synthetic lengths instead of --data: lognormal:MU,SIGMA[,MAX] | uniform:MIN,MAX")
      ("docs", po::value(&a.docs)->default_value(0), "synthetic documents (with --lengths)")
      ("seed", po::value(&a.synth_seed), "seed of the synthetic lengths (default: train.seed)")
      ("calibrate", po::value(&a.calibrate_dir), "fit cost_a, cost_b and cost_c to RUN_DIR/metrics/rank-*.csv and print them")
      ("skip-steps", po::value(&a.skip_steps)->default_value(2), "with --calibrate: warm-up steps left out of the fit");
  po::variables_map vm;
  if (!parse_command_line(argc, argv, kUsage, extra, vm, a.cfg)) return false;
  a.json = vm.count("json") > 0;
  a.memory = vm.count("memory") > 0;
  a.synth_seed_given = vm.count("seed") > 0;
  return true;
}

// The flags folded into the config and checked (not for --calibrate, which reads a run).
void resolve_plan_args(PlanArgs& a) {
  if (!a.sampler.empty()) a.cfg.data.sampler = a.sampler;
  if (!a.data_dir.empty()) a.cfg.data.dir = a.data_dir;
  a.cfg.validate();
  KILTER_USER_CHECK(a.world_size >= 1, "--world-size " << a.world_size << ": must be >= 1");
  if (a.ranks_per_node <= 0) a.ranks_per_node = a.cfg.comm.ranks_per_node > 0 ? a.cfg.comm.ranks_per_node : a.world_size;
  KILTER_USER_CHECK(a.ranks_per_node >= 1 && a.world_size % a.ranks_per_node == 0,
                    "--ranks-per-node " << a.ranks_per_node << ": must divide --world-size " << a.world_size);
  KILTER_USER_CHECK(a.lengths_spec.empty() != (a.cfg.data.dir.empty() && a.cfg.data.sources.empty()),
                    "give either --data DIR (or --data.dir, or a mixture --data.sources) or --lengths SPEC --docs N, "
                    "not both and not neither");
}

// What the plan is built over: the index's lengths (one dataset or a mixture), or synthetic ones.
struct Corpus {
  std::vector<uint32_t> doc_lengths;
  uint32_t dataset_vocab = 0;  // 0 for synthetic lengths
  std::string source;          // what the output names as the data
  train::TrainingData mixture;
  double load_seconds = 0;
};

Corpus load_corpus(const PlanArgs& a) {
  const auto load_start = std::chrono::steady_clock::now();
  Corpus c;
  if (!a.lengths_spec.empty()) {
    KILTER_USER_CHECK(a.docs >= 1, "--lengths needs --docs N >= 1");
    const balance::LengthSpec spec = balance::parse_length_spec(a.lengths_spec);
    c.doc_lengths = balance::synthetic_lengths(spec, a.docs, a.synth_seed_given ? a.synth_seed : a.cfg.train.seed);
    c.source = a.lengths_spec;
  } else {
    c.mixture = train::load_training_data(a.cfg);  // data.dir, or data.sources merged
    c.dataset_vocab = c.mixture.index.vocab_size;
    c.doc_lengths = c.mixture.index.doc_lengths;
    c.source = a.cfg.data.sources.empty() ? a.cfg.data.dir : a.cfg.data.sources;
  }
  c.load_seconds = io::seconds_since(load_start);
  return c;
}

// One epoch's plan and what building it cost.
struct PlannedEpoch {
  balance::PlanOptions opts;
  balance::Split split;
  balance::EpochPlan plan;
  nlohmann::json per_source;        // a mixture's weight, tokens and share per source
  std::vector<std::string> wraps;   // a mixture's sources that wrap in this epoch
  double plan_seconds = 0, plan_cpu_seconds = 0;
  uint64_t plan_bytes = 0, peak_rss = 0;
  double bytes_per_doc = 0, peak_extra_per_doc = 0;
};

// A mixture's target tokens per source over the epoch, beside the weights.
nlohmann::json source_shares(const train::TrainingData& mixture, const balance::EpochPlan& plan) {
  nlohmann::json per_source;
  std::vector<uint64_t> source_tokens(mixture.sources.size(), 0);
  for (uint64_t i = 0; mixture.mixture() && i < plan.steps.size(); ++i) {
    const std::vector<uint64_t> t = balance::tokens_by_source(plan.steps[i], mixture.doc_begin);
    for (size_t k = 0; k < t.size(); ++k) source_tokens[k] += t[k];
  }
  for (size_t k = 0; k < mixture.sources.size(); ++k)
    per_source[mixture.sources[k]] = {{"weight", mixture.weights[k]}, {"tokens", source_tokens[k]},
                                      {"share", double(source_tokens[k]) / double(std::max<uint64_t>(1, plan.stats.target_tokens))}};
  return per_source;
}

PlannedEpoch plan_epoch(const PlanArgs& a, const Corpus& c) {
  PlannedEpoch p;
  p.opts = balance::plan_options_from_config(a.cfg, c.dataset_vocab, a.world_size, a.ranks_per_node);
  const uint64_t rss_before = current_rss_bytes();
  const auto plan_start = std::chrono::steady_clock::now();
  const std::clock_t plan_cpu_start = std::clock();
  p.split = balance::split_documents(c.doc_lengths, a.cfg.data.eval_fraction, a.cfg.train.seed);
  std::unique_ptr<train::PlanCache> mixture_plans;  // data.sources: the mixture's draw
  if (c.mixture.mixture()) mixture_plans = train::make_plan_cache(c.mixture, p.split.train_docs, p.opts, a.world_size);
  p.plan = mixture_plans ? mixture_plans->get(a.epoch)
                         : balance::build_epoch_plan(c.doc_lengths, p.split.train_docs, p.opts, a.world_size, a.epoch);
  p.per_source = source_shares(c.mixture, p.plan);
  if (mixture_plans) p.wraps = train::wrap_messages(c.mixture, mixture_plans->wraps(a.epoch));
  p.plan_seconds = io::seconds_since(plan_start);
  // CPU seconds too: on a shared node the wall time says more about the neighbours.
  p.plan_cpu_seconds = double(std::clock() - plan_cpu_start) / CLOCKS_PER_SEC;
  p.peak_rss = peak_rss_bytes();
  p.plan_bytes = balance::plan_heap_bytes(p.plan);
  const double n_docs = double(std::max<size_t>(c.doc_lengths.size(), 1));
  // What a rank keeps per document: the lengths (4 B), its split's ids (8 B) and the plan.
  p.bytes_per_doc = double(p.plan_bytes + c.doc_lengths.size() * sizeof(uint32_t) +
                           (p.split.train_docs.size() + p.split.eval_docs.size()) * sizeof(uint64_t)) / n_docs;
  p.peak_extra_per_doc = double(p.peak_rss > rss_before ? p.peak_rss - rss_before : 0) / n_docs;
  return p;
}

// --json: the statistics (balance::plan_stats_json), the plan's inputs and what it cost.
nlohmann::json plan_json(const PlanArgs& a, const Corpus& c, const PlannedEpoch& p,
                         const std::vector<std::string>& warnings) {
  const balance::PlanOptions& opts = p.opts;
  char fingerprint[17];
  std::snprintf(fingerprint, sizeof fingerprint, "%016llx",
                static_cast<unsigned long long>(balance::plan_fingerprint(p.plan)));
  nlohmann::json out = balance::plan_stats_json(p.plan.stats);
  out.update({{"sampler", opts.sampler},
              {"world_size", a.world_size},
              {"ranks_per_node", a.ranks_per_node},
              {"node_cost_imbalance_p95", balance::node_cost_imbalance(p.plan, a.ranks_per_node, 0.95)},
              {"epoch", a.epoch},
              {"seed", opts.seed},
              {"source", c.source},
              {"context", opts.context},
              {"max_tokens", opts.max_tokens},
              {"tokens_per_step", opts.tokens_per_step},
              {"naive_batch_size", opts.naive_batch_size},
              {"tail", opts.tail},
              {"eval_docs", p.split.eval_docs.size()},
              {"cost_a", p.plan.cost.a},
              {"cost_b", p.plan.cost.b},
              {"cost_c", p.plan.cost.c},
              {"cost_t", p.plan.cost.t},
              {"device_tflops", balance::device_tflops(a.cfg)},
              {"device", balance::runs_on_cpu(a.cfg) ? "cpu" : "gpu"},
              {"cut_pieces_enabled", opts.cut_pieces},
              {"kv_bytes_per_token", opts.kv_bytes_per_token},
              {"index_load_seconds", c.load_seconds},
              {"plan_build_seconds", p.plan_seconds},
              {"plan_build_cpu_seconds", p.plan_cpu_seconds},
              {"plan_bytes", p.plan_bytes},
              {"bytes_per_doc", p.bytes_per_doc},
              {"peak_extra_bytes_per_doc", p.peak_extra_per_doc},
              {"peak_rss_bytes", p.peak_rss},
              {"fingerprint", fingerprint}});
  out["warnings"] = warnings;
  if (c.mixture.mixture()) {
    out["tokens_per_source"] = p.per_source;
    out["source_wraps"] = p.wraps;
  }
  return out;
}

// The cut pieces and the K/V they exchange (the first line is the one `kilter train` logs).
void print_plan_cuts(const balance::PlanStats& s, const balance::PlanOptions& opts, const balance::CostModel& cost) {
  std::printf("  cuts (data.cut_pieces = %s): %s\n", opts.cut_pieces ? "true" : "false",
              s.cuts > 0 ? balance::describe_cuts(s).c_str() : "none");
  std::printf("  %llu pieces cut, at most over %llu ranks; whole pieces only: imbalance p50 %.4f  p95 %.4f  max %.4f\n",
              static_cast<unsigned long long>(s.cut_pieces), static_cast<unsigned long long>(s.cut_piece_ranks_max),
              s.cost_imbalance_uncut_p50, s.cost_imbalance_uncut_p95, s.cost_imbalance_uncut_max);
  std::printf("  K/V exchanged (forward K/V + backward dK/dV): per step p50 %.3g B  max %.3g B; one rank at most %.3g B "
              "a step (%.0f B per token, transfer cost t=%.4g)\n",
              s.kv_bytes_per_step_p50, s.kv_bytes_per_step_max, s.kv_bytes_per_rank_max, opts.kv_bytes_per_token, cost.t);
  if (s.long_pieces > 0)
    std::printf("  context parallelism: %llu pieces longer than data.max_tokens = %llu, each cut over up to %llu ranks\n",
                static_cast<unsigned long long>(s.long_pieces), static_cast<unsigned long long>(opts.max_tokens),
                static_cast<unsigned long long>(s.long_piece_ranks_max));
}

// Without --json: the plan for a reader, a figure per clause.
void print_plan_text(const PlanArgs& a, const Corpus& c, const PlannedEpoch& p) {
  const balance::PlanOptions& opts = p.opts;
  const balance::PlanStats& s = p.plan.stats;
  std::printf("kilter plan: %s sampler, world size %d (%d per node), epoch %llu, seed %llu, data %s\n",
              opts.sampler.c_str(), a.world_size, a.ranks_per_node, static_cast<unsigned long long>(a.epoch),
              static_cast<unsigned long long>(opts.seed), c.source.c_str());
  std::printf("  documents %llu (%llu empty, %zu held out) -> %llu pieces of <= %u tokens; budget %llu tokens per micro-batch\n",
              static_cast<unsigned long long>(s.documents), static_cast<unsigned long long>(s.empty_docs),
              p.split.eval_docs.size(), static_cast<unsigned long long>(s.pieces), opts.context,
              static_cast<unsigned long long>(opts.max_tokens));
  std::printf("  steps/epoch %llu, micro-batches/step %.1f, target tokens/step %.0f (min %.0f, max %.0f; asked %llu)\n",
              static_cast<unsigned long long>(s.steps_per_epoch), s.micro_batches_per_step,
              s.target_tokens_per_step_mean, s.target_tokens_per_step_min, s.target_tokens_per_step_max,
              static_cast<unsigned long long>(opts.tokens_per_step));
  std::printf("  padding efficiency %.4f   cost imbalance p50 %.4f  p95 %.4f  max %.4f   (node p95 %.4f)\n",
              s.padding_efficiency, s.cost_imbalance_p50, s.cost_imbalance_p95, s.cost_imbalance_max,
              balance::node_cost_imbalance(p.plan, a.ranks_per_node, 0.95));
  std::printf("  rank-time waiting for the busiest rank if step times were the costs: %.4f\n", s.cost_wait_fraction);
  if (s.shard_group > 1)
    std::printf("  shard groups of %d ranks (train.shard = parameters), every micro-batch a meeting point: slot imbalance "
                "p50 %.4f  p95 %.4f; meeting-bound step / mean rank p50 %.4f  p95 %.4f; %llu group-steps with "
                "unequal micro-batch counts\n",
                s.shard_group, s.slot_imbalance_p50, s.slot_imbalance_p95, s.slotted_imbalance_p50,
                s.slotted_imbalance_p95, static_cast<unsigned long long>(s.uneven_group_steps));
  if (s.cost_imbalance_bound_p95 > 0)
    std::printf("  best any division of whole pieces could do: imbalance p50 %.4f  p95 %.4f\n",
                s.cost_imbalance_bound_p50, s.cost_imbalance_bound_p95);
  print_plan_cuts(s, opts, p.plan.cost);
  std::printf("  idle: %llu rank-steps in %llu steps (at most %llu ranks in one step); at most %.0f micro-batches per rank\n",
              static_cast<unsigned long long>(s.idle_rank_steps), static_cast<unsigned long long>(s.steps_with_idle_ranks),
              static_cast<unsigned long long>(s.idle_ranks_max), s.micro_batches_per_rank_max);
  if (s.tail_redistributed && s.tail_pieces > 0)
    std::printf("  tail: %llu pieces (%llu tokens) redistributed over the epoch's steps\n",
                static_cast<unsigned long long>(s.tail_pieces), static_cast<unsigned long long>(s.tail_tokens));
  else if (s.dropped_pieces > 0)
    std::printf("  tail: %llu pieces (%llu tokens) dropped\n", static_cast<unsigned long long>(s.dropped_pieces),
                static_cast<unsigned long long>(s.dropped_tokens));
  for (const auto& [dir, v] : p.per_source.items())
    std::printf("  source %s: weight %.4f, %llu tokens this epoch (share %.4f)\n", dir.c_str(), v["weight"].get<double>(),
                static_cast<unsigned long long>(v["tokens"].get<uint64_t>()), v["share"].get<double>());
  for (const std::string& line : p.wraps) std::printf("  %s\n", line.c_str());
  std::printf("  cost model a=%.4g b=%.4g c=%.4g (for a %s run: train.backend = %s); planned in %.3f s (%.3f s CPU); "
              "%.1f bytes/document held (peak +%.1f)\n",
              p.plan.cost.a, p.plan.cost.b, p.plan.cost.c, balance::runs_on_cpu(a.cfg) ? "CPU" : "GPU",
              a.cfg.train.backend.c_str(), p.plan_seconds, p.plan_cpu_seconds, p.bytes_per_doc, p.peak_extra_per_doc);
}

int run_plan(PlanArgs& a) {
  resolve_plan_args(a);
  const Corpus corpus = load_corpus(a);
  const PlannedEpoch planned = plan_epoch(a, corpus);
  const std::vector<std::string> warnings = balance::plan_warnings(planned.plan, planned.opts, a.cfg.comm.link_gbps);
  const auto memory = [&] {
    return memory_plan(a.cfg, corpus.dataset_vocab, a.world_size, a.ranks_per_node, a.device_memory_gib);
  };
  if (a.json) {
    nlohmann::json out = plan_json(a, corpus, planned, warnings);
    if (a.memory) out["memory"] = train::memory_plan_json(memory());
    std::cout << out.dump(2) << "\n";
  } else {
    print_plan_text(a, corpus, planned);
    if (a.memory) std::printf("%s", train::format_memory_plan(memory()).c_str());
  }
  for (const std::string& w : warnings) std::fprintf(stderr, "kilter plan: warning: %s\n", w.c_str());
  return 0;
}

}  // namespace

int cmd_plan(int argc, char** argv) {
  try {
    PlanArgs args;
    if (!parse_plan_args(argc, argv, args)) return 0;
    if (!args.calibrate_dir.empty()) return run_calibration(args.calibrate_dir, args.skip_steps, args.json);
    return run_plan(args);
  } catch (const Error& e) {
    std::fprintf(stderr, "kilter plan: %s\n", e.what());
    return e.is_user_error() ? 2 : 1;
  }
}

}  // namespace kilter::app
