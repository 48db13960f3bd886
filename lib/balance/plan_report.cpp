// The plan's statistics, warnings and cut line for `kilter plan` and `kilter train` (see
// plan_report.h).
#include "lib/balance/plan_report.h"

#include <algorithm>
#include <cstdio>

namespace kilter::balance {

namespace {

std::string idle_steps_warning(const PlanStats& s, const PlanOptions& opts, int world_size) {
  return std::to_string(s.steps_with_idle_ranks) + " of " + std::to_string(s.steps_per_epoch) +
         " steps leave ranks idle (" + std::to_string(s.idle_rank_steps) + " idle rank-steps, at most " +
         std::to_string(s.idle_ranks_max) +
         " in one step); idle ranks still join every collective; raise train.tokens_per_step to >= " +
         std::to_string(uint64_t(world_size) * opts.context) + " (world size x model.block_size)";
}

// "" where the steps balance (cost_imbalance_p95 <= 1.02), or where only whole pieces are divided
// and no division could do better than the plan did (the bound says so).
std::string coarse_steps_warning(const EpochPlan& plan, const PlanOptions& opts) {
  const PlanStats& s = plan.stats;
  const int world_size = plan.world_size;
  // Never below what the idle-rank warning asks (>= world size x block_size), so the two
  // suggestions agree.
  const auto coarser_step = static_cast<unsigned long long>(
      std::max<uint64_t>(2 * uint64_t(opts.tokens_per_step), 2 * uint64_t(world_size) * uint64_t(opts.context)));
  const double contexts_per_rank = double(opts.tokens_per_step) / double(world_size) / double(opts.context);
  const bool cutting = opts.cut_pieces && opts.sampler == "balanced";
  char line[480];
  if (cutting && s.cost_imbalance_p95 > 1.02) {
    // With cuts the whole-piece bound is not the limit: what is left comes from cuts that cost
    // more (t per earlier token) than they would even out.
    std::snprintf(line, sizeof line,
                  "the steps are too coarse for %d ranks: with cut pieces the plan gets cost_imbalance_p95 %.3f (whole "
                  "pieces alone: %.3f at best); a rank's share is only %.1f contexts, and the cuts that would even it "
                  "out cost more than they save at t = %.4g per earlier token; raise train.tokens_per_step (e.g. to "
                  "%llu) to balance",
                  world_size, s.cost_imbalance_p95, s.cost_imbalance_bound_p95, contexts_per_rank, plan.cost.t,
                  coarser_step);
    return line;
  }
  if (!cutting && s.cost_imbalance_p95 > 1.02 && s.cost_imbalance_bound_p95 > 1.02) {
    std::snprintf(line, sizeof line,
                  "the steps are too coarse for %d ranks: no division of their pieces gets cost_imbalance_p95 below "
                  "%.3f (a rank's share is only %.1f contexts and long pieces cost more than it); raise "
                  "train.tokens_per_step (e.g. to %llu) to balance%s",
                  world_size, s.cost_imbalance_bound_p95, contexts_per_rank, coarser_step,
                  opts.sampler == "balanced" ? ", or let the plan cut pieces (data.cut_pieces = true)" : "");
    return line;
  }
  return "";
}

std::string link_bound_warning(const EpochPlan& plan, double link_gbps) {
  char line[400];
  std::snprintf(line, sizeof line,
                "%llu parts of cut pieces receive more K/V than their rank computes in the step (comm.link_gbps = %g): "
                "the link sets their pace and the plan's transfer cost t = %.4g (charged for a typical part) undercounts "
                "them; measure t with `kilter plan --calibrate` and set data.cost_t, or raise comm.link_gbps if the "
                "link is faster",
                static_cast<unsigned long long>(plan.stats.link_bound_parts), link_gbps, plan.cost.t);
  return line;
}

}  // namespace

nlohmann::json plan_stats_json(const PlanStats& s) {
  nlohmann::json j = {{"padding_efficiency", s.padding_efficiency},
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
          {"attention_work", s.attention_work},
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
  if (s.shard_group > 1) {  // shard groups only: plans without them print what they always did
    j["shard_group"] = s.shard_group;
    j["slot_imbalance_p50"] = s.slot_imbalance_p50;
    j["slot_imbalance_p95"] = s.slot_imbalance_p95;
    j["slotted_imbalance_p50"] = s.slotted_imbalance_p50;
    j["slotted_imbalance_p95"] = s.slotted_imbalance_p95;
    j["uneven_group_steps"] = s.uneven_group_steps;
  }
  return j;
}

std::vector<std::string> plan_warnings(const EpochPlan& plan, const PlanOptions& opts, double link_gbps) {
  const PlanStats& s = plan.stats;
  std::vector<std::string> warnings;
  const std::string too_small = idle_rank_warning(opts, plan.world_size);
  if (!too_small.empty()) warnings.push_back(too_small);
  if (s.steps_with_idle_ranks > 0) warnings.push_back(idle_steps_warning(s, opts, plan.world_size));
  const std::string coarse = coarse_steps_warning(plan, opts);
  if (!coarse.empty()) warnings.push_back(coarse);
  if (s.link_bound_parts > 0) warnings.push_back(link_bound_warning(plan, link_gbps));
  if (s.steps_per_epoch == 0) warnings.push_back("the plan has no steps: the split holds no tokens");
  return warnings;
}

std::string describe_cuts(const PlanStats& s) {
  char line[400];
  std::snprintf(line, sizeof line,
                "%.0f cuts per step (p50, max %.0f), K/V %.3g B per step (p50); cost imbalance p95 %.3f with cuts, "
                "%.3f whole pieces only (bound %.3f)",
                s.cuts_per_step_p50, s.cuts_per_step_max, s.kv_bytes_per_step_p50, s.cost_imbalance_p95,
                s.cost_imbalance_uncut_p95, s.cost_imbalance_bound_p95);
  std::string text = line;
  if (s.long_pieces > 0)
    text += "; pieces longer than data.max_tokens span up to " + std::to_string(s.long_piece_ranks_max) + " ranks";
  return text;
}

}  // namespace kilter::balance
