// What a batch plan says about itself to a user: its statistics as JSON under one set of names,
// the warnings worth acting on, and one line about its cut pieces. `kilter plan` and `kilter
// train` (its start-up log and summary.json) both print them from here, so the two cannot drift
// apart (docs/plan.md, "Statistics").
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lib/balance/plan.h"

namespace kilter::balance {

// Every PlanStats figure under the name `kilter plan --json` prints it (docs/plan.md's table).
nlohmann::json plan_stats_json(const PlanStats& stats);

// The plan's warnings, one line each without a prefix, in this order: a step too small for the
// world size (idle_rank_warning), steps that leave ranks idle, steps too coarse to balance, parts
// of cut pieces the link paces (`link_gbps`: comm.link_gbps, which that line names), a plan
// without steps. Empty when there is nothing to say.
std::vector<std::string> plan_warnings(const EpochPlan& plan, const PlanOptions& opts, double link_gbps);

// The plan's cuts in one line: "3 cuts per step (p50, max 3), K/V 1.33e+04 B per step (p50); cost
// imbalance p95 1.003 with cuts, 1.064 whole pieces only (bound 1.064)", and the ranks that pieces
// longer than data.max_tokens span where there are such pieces. For a plan that cuts (stats.cuts > 0).
std::string describe_cuts(const PlanStats& stats);

}  // namespace kilter::balance
