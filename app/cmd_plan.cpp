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
#include "io/error.h"
#include "lib/balance/calibrate.h"
#include "lib/balance/plan.h"
#include "lib/balance/plan_config.h"
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

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
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

nlohmann::json stats_json(const balance::EpochPlan& plan) {
  const balance::PlanStats& s = plan.stats;
  return {{"padding_efficiency", s.padding_efficiency},
          {"cost_imbalance_p50", s.cost_imbalance_p50},
          {"cost_imbalance_p95", s.cost_imbalance_p95},
          {"cost_imbalance_max", s.cost_imbalance_max},
          {"steps_per_epoch", s.steps_per_epoch},
          {"micro_batches_per_step", s.micro_batches_per_step},
          {"documents", s.documents},
          {"empty_docs", s.empty_docs},
          {"pieces", s.pieces},
          {"micro_batches", s.micro_batches},
          {"target_tokens", s.target_tokens},
          {"tokens_computed", s.tokens_computed},
          {"target_tokens_per_step_mean", s.target_tokens_per_step_mean},
          {"target_tokens_per_step_min", s.target_tokens_per_step_min},
          {"target_tokens_per_step_max", s.target_tokens_per_step_max},
          {"dropped_pieces", s.dropped_pieces},
          {"dropped_tokens", s.dropped_tokens},
          {"tail_pieces", s.tail_pieces},
          {"tail_tokens", s.tail_tokens},
          {"tail_redistributed", s.tail_redistributed},
          {"idle_rank_steps", s.idle_rank_steps},
          {"steps_with_idle_ranks", s.steps_with_idle_ranks},
          {"idle_ranks_max", s.idle_ranks_max},
          {"micro_batches_per_rank_max", s.micro_batches_per_rank_max},
          {"cost_imbalance_bound_p50", s.cost_imbalance_bound_p50},
          {"cost_imbalance_bound_p95", s.cost_imbalance_bound_p95},
          {"critical_cost_per_token", s.critical_cost_per_token},
          {"cost_wait_fraction", s.cost_wait_fraction},
          {"cuts_per_step_p50", s.cuts_per_step_p50},
          {"cuts_per_step_max", s.cuts_per_step_max},
          {"cuts", s.cuts},
          {"cut_pieces", s.cut_pieces},
          {"cut_piece_ranks_max", s.cut_piece_ranks_max},
          {"kv_bytes_per_step_p50", s.kv_bytes_per_step_p50},
          {"kv_bytes_per_step_max", s.kv_bytes_per_step_max},
          {"kv_bytes_per_rank_max", s.kv_bytes_per_rank_max},
          {"cost_imbalance_uncut_p50", s.cost_imbalance_uncut_p50},
          {"cost_imbalance_uncut_p95", s.cost_imbalance_uncut_p95},
          {"cost_imbalance_uncut_max", s.cost_imbalance_uncut_max},
          {"long_pieces", s.long_pieces},
          {"long_piece_ranks_max", s.long_piece_ranks_max},
          {"link_bound_parts", s.link_bound_parts}};
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

}  // namespace

int cmd_plan(int argc, char** argv) {
  try {
    Config cfg;
    std::string data_dir, sampler, lengths_spec, calibrate_dir;
    int world_size = 1, ranks_per_node = 0;
    double device_memory_gib = 0;
    uint64_t docs = 0, synth_seed = 0, epoch = 0;
    int64_t skip_steps = 2;
    po::options_description extra("kilter plan");
    extra.add_options()
        ("data", po::value(&data_dir), "dataset directory (same as --data.dir)")
        ("world-size", po::value(&world_size)->default_value(1), "ranks to plan for")
        ("ranks-per-node", po::value(&ranks_per_node)->default_value(0), "ranks per node for the node figures (0: comm.ranks_per_node, else all on one node)")
        ("sampler", po::value(&sampler), "balanced | naive (same as --data.sampler)")
        ("epoch", po::value(&epoch)->default_value(0), "epoch to plan (the plan is deterministic from train.seed and the epoch)")
        ("json", "print one JSON object")
        ("memory", "also the memory plan: bytes per rank (parameters, gradients, optimizer state, activations, checkpoint, prefetch) and the node's total against this machine's memory")
        ("device-memory", po::value(&device_memory_gib), "with --memory on the cuda backend: GiB each rank's device offers (default: this machine's device, if any)")
        ("lengths", po::value(&lengths_spec), "synthetic lengths instead of --data: lognormal:MU,SIGMA[,MAX] | uniform:MIN,MAX")
        ("docs", po::value(&docs)->default_value(0), "synthetic documents (with --lengths)")
        ("seed", po::value(&synth_seed), "seed of the synthetic lengths (default: train.seed)")
        ("calibrate", po::value(&calibrate_dir), "fit cost_a, cost_b and cost_c to RUN_DIR/metrics/rank-*.csv and print them")
        ("skip-steps", po::value(&skip_steps)->default_value(2), "with --calibrate: warm-up steps left out of the fit");
    po::variables_map vm;
    if (!parse_command_line(argc, argv, kUsage, extra, vm, cfg)) return 0;
    const bool json = vm.count("json") > 0;
    if (!calibrate_dir.empty()) return run_calibration(calibrate_dir, skip_steps, json);

    if (!sampler.empty()) cfg.data.sampler = sampler;
    if (!data_dir.empty()) cfg.data.dir = data_dir;
    cfg.validate();
    KILTER_USER_CHECK(world_size >= 1, "--world-size " << world_size << ": must be >= 1");
    if (ranks_per_node <= 0) ranks_per_node = cfg.comm.ranks_per_node > 0 ? cfg.comm.ranks_per_node : world_size;
    KILTER_USER_CHECK(ranks_per_node >= 1 && world_size % ranks_per_node == 0,
                 "--ranks-per-node " << ranks_per_node << ": must divide --world-size " << world_size);
    KILTER_USER_CHECK(lengths_spec.empty() != (cfg.data.dir.empty() && cfg.data.sources.empty()),
                 "give either --data DIR (or --data.dir, or a mixture --data.sources) or --lengths SPEC --docs N, "
                 "not both and not neither");

    // The corpus: the index's lengths, or synthetic ones.
    const auto load_start = std::chrono::steady_clock::now();
    std::vector<uint32_t> doc_lengths;
    uint32_t dataset_vocab = 0;
    std::string source;
    train::TrainingData mixture;
    if (!lengths_spec.empty()) {
      KILTER_USER_CHECK(docs >= 1, "--lengths needs --docs N >= 1");
      const balance::LengthSpec spec = balance::parse_length_spec(lengths_spec);
      doc_lengths = balance::synthetic_lengths(spec, docs, vm.count("seed") ? synth_seed : cfg.train.seed);
      source = lengths_spec;
    } else {
      mixture = train::load_training_data(cfg);  // data.dir, or data.sources merged
      dataset_vocab = mixture.index.vocab_size;
      doc_lengths = mixture.index.doc_lengths;
      source = cfg.data.sources.empty() ? cfg.data.dir : cfg.data.sources;
    }
    const double load_seconds = seconds_since(load_start);

    const balance::PlanOptions opts = balance::plan_options_from_config(cfg, dataset_vocab);
    const uint64_t rss_before = current_rss_bytes();
    const auto plan_start = std::chrono::steady_clock::now();
    const std::clock_t plan_cpu_start = std::clock();
    const balance::Split split = balance::split_documents(doc_lengths, cfg.data.eval_fraction, cfg.train.seed);
    std::unique_ptr<train::PlanCache> mixture_plans;  // data.sources: the mixture's draw
    if (mixture.mixture()) mixture_plans = train::make_plan_cache(mixture, split.train_docs, opts, world_size);
    const balance::EpochPlan plan = mixture_plans ? mixture_plans->get(epoch)
                                                  : balance::build_epoch_plan(doc_lengths, split.train_docs, opts, world_size, epoch);
    // Tokens per source over the epoch, and where sources wrap.
    nlohmann::json per_source;
    std::vector<uint64_t> source_tokens(mixture.sources.size(), 0);
    for (uint64_t i = 0; mixture_plans && i < plan.steps.size(); ++i) {
      const std::vector<uint64_t> t = balance::tokens_by_source(plan.steps[i], mixture.doc_begin);
      for (size_t k = 0; k < t.size(); ++k) source_tokens[k] += t[k];
    }
    for (size_t k = 0; k < mixture.sources.size(); ++k)
      per_source[mixture.sources[k]] = {{"weight", mixture.weights[k]}, {"tokens", source_tokens[k]},
                                        {"share", double(source_tokens[k]) / double(std::max<uint64_t>(1, plan.stats.target_tokens))}};
    const std::vector<std::string> wraps = mixture_plans ? train::wrap_messages(mixture, mixture_plans->wraps(epoch))
                                                         : std::vector<std::string>();
    const double plan_seconds = seconds_since(plan_start);
    // CPU seconds too: on a shared node the wall time says more about the neighbours.
    const double plan_cpu_seconds = double(std::clock() - plan_cpu_start) / CLOCKS_PER_SEC;
    const uint64_t peak_rss = peak_rss_bytes();
    const uint64_t plan_bytes = balance::plan_heap_bytes(plan);
    const double n_docs = double(std::max<size_t>(doc_lengths.size(), 1));
    // What a rank keeps per document: the lengths (4 B), its split's ids (8 B) and the plan.
    const double bytes_per_doc =
        double(plan_bytes + doc_lengths.size() * sizeof(uint32_t) +
               (split.train_docs.size() + split.eval_docs.size()) * sizeof(uint64_t)) / n_docs;
    const double peak_extra_per_doc = double(peak_rss > rss_before ? peak_rss - rss_before : 0) / n_docs;
    const balance::PlanStats& s = plan.stats;

    std::vector<std::string> warnings;
    const std::string too_small = balance::idle_rank_warning(opts, world_size);
    if (!too_small.empty()) warnings.push_back(too_small);
    if (s.steps_with_idle_ranks > 0) {
      warnings.push_back(std::to_string(s.steps_with_idle_ranks) + " of " + std::to_string(s.steps_per_epoch) +
                         " steps leave ranks idle (" + std::to_string(s.idle_rank_steps) +
                         " idle rank-steps, at most " + std::to_string(s.idle_ranks_max) +
                         " in one step); idle ranks still join every collective; raise train.tokens_per_step to >= " +
                         std::to_string(uint64_t(world_size) * opts.context) + " (world size x model.block_size)");
    }
    // Never below what the idle-rank warning asks (>= world size x block_size), so the two
    // suggestions agree.
    const auto coarser_step = static_cast<unsigned long long>(std::max<uint64_t>(
        2 * uint64_t(opts.tokens_per_step), 2 * uint64_t(world_size) * uint64_t(opts.context)));
    const double contexts_per_rank = double(opts.tokens_per_step) / double(world_size) / double(opts.context);
    const bool cutting = opts.cut_pieces && opts.sampler == "balanced";
    if (cutting && s.cost_imbalance_p95 > 1.02) {
      // With cuts the whole-piece bound is not the limit: what is left comes from cuts that cost
      // more (t per earlier token) than they would even out.
      char line[480];
      std::snprintf(line, sizeof line,
                    "the steps are too coarse for %d ranks: with cut pieces the plan gets cost_imbalance_p95 %.3f (whole "
                    "pieces alone: %.3f at best); a rank's share is only %.1f contexts, and the cuts that would even it "
                    "out cost more than they save at t = %.4g per earlier token; raise train.tokens_per_step (e.g. to "
                    "%llu) to balance",
                    world_size, s.cost_imbalance_p95, s.cost_imbalance_bound_p95, contexts_per_rank, plan.cost.t,
                    coarser_step);
      warnings.push_back(line);
    } else if (!cutting && s.cost_imbalance_p95 > 1.02 && s.cost_imbalance_bound_p95 > 1.02) {
      char line[400];
      std::snprintf(line, sizeof line,
                    "the steps are too coarse for %d ranks: no division of their pieces gets cost_imbalance_p95 below "
                    "%.3f (a rank's share is only %.1f contexts and long pieces cost more than it); raise "
                    "train.tokens_per_step (e.g. to %llu) to balance%s",
                    world_size, s.cost_imbalance_bound_p95, contexts_per_rank, coarser_step,
                    opts.sampler == "balanced" ? ", or let the plan cut pieces (data.cut_pieces = true)" : "");
      warnings.push_back(line);
    }
    if (s.link_bound_parts > 0) {
      char line[400];
      std::snprintf(line, sizeof line,
                    "%llu parts of cut pieces receive more K/V than their rank computes in the step (comm.link_gbps = %g): "
                    "the link sets their pace and the plan's transfer cost t = %.4g (charged for a typical part) undercounts "
                    "them; measure t with `kilter plan --calibrate` and set data.cost_t, or raise comm.link_gbps if the "
                    "link is faster",
                    static_cast<unsigned long long>(s.link_bound_parts), cfg.comm.link_gbps, plan.cost.t);
      warnings.push_back(line);
    }
    if (s.steps_per_epoch == 0) warnings.push_back("the plan has no steps: the split holds no tokens");

    char fingerprint[17];
    std::snprintf(fingerprint, sizeof fingerprint, "%016llx",
                  static_cast<unsigned long long>(balance::plan_fingerprint(plan)));
    if (json) {
      nlohmann::json out = stats_json(plan);
      out["sampler"] = opts.sampler;
      out["world_size"] = world_size;
      out["ranks_per_node"] = ranks_per_node;
      out["node_cost_imbalance_p95"] = balance::node_cost_imbalance(plan, ranks_per_node, 0.95);
      out["epoch"] = epoch;
      out["seed"] = opts.seed;
      out["source"] = source;
      out["context"] = opts.context;
      out["max_tokens"] = opts.max_tokens;
      out["tokens_per_step"] = opts.tokens_per_step;
      out["naive_batch_size"] = opts.naive_batch_size;
      out["tail"] = opts.tail;
      out["eval_docs"] = split.eval_docs.size();
      out["cost_a"] = plan.cost.a;
      out["cost_b"] = plan.cost.b;
      out["cost_c"] = plan.cost.c;
      out["cost_t"] = plan.cost.t;
      out["device_tflops"] = balance::device_tflops(cfg);
      out["cut_pieces_enabled"] = opts.cut_pieces;
      out["kv_bytes_per_token"] = opts.kv_bytes_per_token;
      out["index_load_seconds"] = load_seconds;
      out["plan_build_seconds"] = plan_seconds;
      out["plan_build_cpu_seconds"] = plan_cpu_seconds;
      out["plan_bytes"] = plan_bytes;
      out["bytes_per_doc"] = bytes_per_doc;
      out["peak_extra_bytes_per_doc"] = peak_extra_per_doc;
      out["peak_rss_bytes"] = peak_rss;
      out["fingerprint"] = fingerprint;
      out["warnings"] = warnings;
      if (mixture.mixture()) {
        out["tokens_per_source"] = per_source;
        out["source_wraps"] = wraps;
      }
      if (vm.count("memory")) out["memory"] = train::memory_plan_json(memory_plan(cfg, dataset_vocab, world_size, ranks_per_node, device_memory_gib));
      std::cout << out.dump(2) << "\n";
    } else {
      std::printf("kilter plan: %s sampler, world size %d (%d per node), epoch %llu, seed %llu, data %s\n",
                  opts.sampler.c_str(), world_size, ranks_per_node, static_cast<unsigned long long>(epoch),
                  static_cast<unsigned long long>(opts.seed), source.c_str());
      std::printf("  documents %llu (%llu empty, %zu held out) -> %llu pieces of <= %u tokens; budget %llu tokens per micro-batch\n",
                  static_cast<unsigned long long>(s.documents), static_cast<unsigned long long>(s.empty_docs),
                  split.eval_docs.size(), static_cast<unsigned long long>(s.pieces), opts.context,
                  static_cast<unsigned long long>(opts.max_tokens));
      std::printf("  steps/epoch %llu, micro-batches/step %.1f, target tokens/step %.0f (min %.0f, max %.0f; asked %llu)\n",
                  static_cast<unsigned long long>(s.steps_per_epoch), s.micro_batches_per_step,
                  s.target_tokens_per_step_mean, s.target_tokens_per_step_min, s.target_tokens_per_step_max,
                  static_cast<unsigned long long>(opts.tokens_per_step));
      std::printf("  padding efficiency %.4f   cost imbalance p50 %.4f  p95 %.4f  max %.4f   (node p95 %.4f)\n",
                  s.padding_efficiency, s.cost_imbalance_p50, s.cost_imbalance_p95, s.cost_imbalance_max,
                  balance::node_cost_imbalance(plan, ranks_per_node, 0.95));
      std::printf("  rank-time waiting for the busiest rank if step times were the costs: %.4f\n", s.cost_wait_fraction);
      if (s.cost_imbalance_bound_p95 > 0)
        std::printf("  best any division of whole pieces could do: imbalance p50 %.4f  p95 %.4f\n",
                    s.cost_imbalance_bound_p50, s.cost_imbalance_bound_p95);
      std::printf("  cuts: %s; per step p50 %.0f  max %.0f (%llu pieces cut, at most over %llu ranks); whole pieces only: "
                  "imbalance p50 %.4f  p95 %.4f  max %.4f\n",
                  opts.cut_pieces ? "on" : "off (data.cut_pieces)", s.cuts_per_step_p50, s.cuts_per_step_max,
                  static_cast<unsigned long long>(s.cut_pieces), static_cast<unsigned long long>(s.cut_piece_ranks_max),
                  s.cost_imbalance_uncut_p50, s.cost_imbalance_uncut_p95, s.cost_imbalance_uncut_max);
      std::printf("  K/V exchanged (forward K/V + backward dK/dV): per step p50 %.3g B  max %.3g B; one rank at most %.3g B "
                  "a step (%.0f B per token, transfer cost t=%.4g)\n",
                  s.kv_bytes_per_step_p50, s.kv_bytes_per_step_max, s.kv_bytes_per_rank_max, opts.kv_bytes_per_token,
                  plan.cost.t);
      if (s.long_pieces > 0)
        std::printf("  context parallelism: %llu pieces longer than data.max_tokens = %llu, each cut over up to %llu ranks\n",
                    static_cast<unsigned long long>(s.long_pieces), static_cast<unsigned long long>(opts.max_tokens),
                    static_cast<unsigned long long>(s.long_piece_ranks_max));
      std::printf("  idle: %llu rank-steps in %llu steps (at most %llu ranks in one step); at most %.0f micro-batches per rank\n",
                  static_cast<unsigned long long>(s.idle_rank_steps), static_cast<unsigned long long>(s.steps_with_idle_ranks),
                  static_cast<unsigned long long>(s.idle_ranks_max), s.micro_batches_per_rank_max);
      if (s.tail_redistributed && s.tail_pieces > 0)
        std::printf("  tail: %llu pieces (%llu tokens) redistributed over the epoch's steps\n",
                    static_cast<unsigned long long>(s.tail_pieces), static_cast<unsigned long long>(s.tail_tokens));
      else if (s.dropped_pieces > 0)
        std::printf("  tail: %llu pieces (%llu tokens) dropped\n", static_cast<unsigned long long>(s.dropped_pieces),
                    static_cast<unsigned long long>(s.dropped_tokens));
      for (const auto& [dir, v] : per_source.items())
        std::printf("  source %s: weight %.4f, %llu tokens this epoch (share %.4f)\n", dir.c_str(), v["weight"].get<double>(),
                    static_cast<unsigned long long>(v["tokens"].get<uint64_t>()), v["share"].get<double>());
      for (const std::string& line : wraps) std::printf("  %s\n", line.c_str());
      std::printf("  cost model a=%.4g b=%.4g c=%.4g; planned in %.3f s (%.3f s CPU); %.1f bytes/document held (peak +%.1f)\n",
                  plan.cost.a, plan.cost.b, plan.cost.c, plan_seconds, plan_cpu_seconds, bytes_per_doc, peak_extra_per_doc);
    }
    if (vm.count("memory") && !json)
      std::printf("%s", train::format_memory_plan(memory_plan(cfg, dataset_vocab, world_size, ranks_per_node, device_memory_gib)).c_str());
    for (const std::string& w : warnings) std::fprintf(stderr, "kilter plan: warning: %s\n", w.c_str());
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "kilter plan: %s\n", e.what());
    return e.is_user_error() ? 2 : 1;
  }
}

}  // namespace kilter::app
