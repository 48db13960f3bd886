// The `naive` sampler (see naive.h): the baseline kilter's balanced plan is measured against.
#include "lib/balance/naive.h"

#include <algorithm>
#include <cmath>

#include "lib/balance/rng.h"

namespace kilter::balance {

EpochPlan build_naive_plan(const std::vector<uint32_t>& doc_lengths, const std::vector<uint64_t>& docs,
                           const PlanOptions& opts, const CostModel& cost, int world_size, uint64_t epoch) {
  EpochPlan plan = start_plan(docs, cost, world_size, epoch, opts.context, true);
  PlanStats& stats = plan.stats;

  std::vector<Piece> pieces = cut_documents(doc_lengths, docs, opts.context, &stats.empty_docs);
  stats.pieces = pieces.size();
  if (pieces.empty()) {
    compute_plan_stats(plan);
    return plan;
  }
  Xoshiro256 rng(opts.seed, epoch, RngStream::kNaiveOrder);
  fisher_yates(pieces.data(), pieces.size(), rng);

  uint64_t total_tokens = 0;
  for (const Piece& p : pieces) total_tokens += p.len;
  const double mean_len = double(total_tokens) / double(pieces.size());
  const uint64_t world = uint64_t(world_size), batch = uint64_t(opts.naive_batch_size);
  // Micro-batches per rank per step: the count whose sequences hold closest to tokens_per_step.
  const uint64_t per_rank = std::max<uint64_t>(
      1, static_cast<uint64_t>(std::llround(double(opts.tokens_per_step) / (mean_len * double(world * batch)))));
  const uint64_t per_step = world * per_rank * batch;
  uint64_t n_steps = pieces.size() / per_step;
  uint64_t used = n_steps * per_step;
  if (n_steps == 0) {
    // Fewer sequences than one step: one partial step, dealt round-robin as the sampler would.
    n_steps = 1;
    used = pieces.size();
  }
  for (uint64_t i = used; i < pieces.size(); ++i) {
    ++stats.dropped_pieces;
    stats.dropped_tokens += pieces[i].len;
  }

  plan.steps.reserve(n_steps, used, n_steps * world * per_rank);
  for (uint64_t s = 0; s < n_steps; ++s) {
    const uint64_t first = s * per_step;
    const uint64_t count = std::min(per_step, used - first);
    uint64_t step_tokens = 0;
    // Rank r's j-th micro-batch holds the step's sequences r + P (j B + i), i < B (as a
    // distributed sampler deals them); the plan stores them rank by rank.
    for (uint64_t r = 0; r < world; ++r) {
      for (uint64_t j = 0; j < per_rank; ++j) {
        uint64_t rows = 0;
        for (uint64_t i = 0; i < batch; ++i) {
          const uint64_t pos = r + world * (j * batch + i);
          if (pos >= count) break;
          plan.steps.add_piece(pieces[first + pos]);
          step_tokens += pieces[first + pos].len;
          ++rows;
        }
        if (rows > 0) plan.steps.end_micro_batch();
      }
      plan.steps.end_rank();
    }
    plan.steps.end_step(step_tokens);
  }
  plan.steps.shrink_to_fit();
  compute_plan_stats(plan);
  return plan;
}

}  // namespace kilter::balance
