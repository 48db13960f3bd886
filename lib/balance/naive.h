// The `naive` sampler, kilter's baseline: what torch's DistributedSampler with a fixed batch size
// does. Internal to lib/balance: build_epoch_plan() picks it for sampler = naive.
#pragma once
#include <cstdint>
#include <vector>

#include "lib/balance/plan.h"

namespace kilter::balance {

// Every rank gets naive_batch_size whole pieces per micro-batch, drawn from one epoch-wide
// shuffle, padded to the longest; rank r runs sequences r, r+P, r+2P, ... of each step, so the
// steps' content depends on the world size. A step holds the multiple of P x naive_batch_size
// sequences closest to tokens_per_step; the leftover sequences of the epoch are dropped
// (DistributedSampler's drop_last), whatever `tail` says.
EpochPlan build_naive_plan(const std::vector<uint32_t>& doc_lengths, const std::vector<uint64_t>& docs,
                           const PlanOptions& opts, const CostModel& cost, int world_size, uint64_t epoch);

}  // namespace kilter::balance
