// Statistics of an epoch plan (docs/design.md's padding_efficiency, cost_imbalance_p50|p95|max,
// steps_per_epoch, micro_batches_per_step, plus idle ranks and token figures) and the plan's
// fingerprint that ranks compare to prove they planned the same epoch.
#include <algorithm>
#include <cmath>
#include <functional>

#include "io/base/error.h"
#include "lib/balance/plan.h"
#include "lib/balance/rng.h"

namespace kilter::balance {

double quantile_of(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  // Nearest rank: the smallest value with at least q of the values at or below it.
  const double rank = std::ceil(q * double(values.size()));
  const size_t index = static_cast<size_t>(std::clamp(rank, 1.0, double(values.size()))) - 1;
  return values[index];
}

std::vector<double> rank_costs(const Step& step) {
  std::vector<double> loads(step.rank_batches.size(), 0.0);
  for (size_t r = 0; r < step.rank_batches.size(); ++r)
    for (uint32_t m : step.rank_batches[r]) loads[r] += step.micro_batches.at(m).cost;
  return loads;
}

// Per-rank costs of a step read in place; each micro-batch's pieces pass through `scratch`, and
// `visit(mb)` sees every micro-batch once (the statistics' other sums).
template <typename Visit>
static std::vector<double> rank_costs(const StepView& step, MicroBatch& scratch, Visit&& visit) {
  std::vector<double> loads(size_t(step.world_size()), 0.0);
  for (int r = 0; r < step.world_size(); ++r) {
    const auto [first, end] = step.rank_micro_batches(r);
    for (uint32_t m = first; m < end; ++m) {
      step.micro_batch(m, scratch);
      loads[r] += scratch.cost;
      visit(scratch);
    }
  }
  return loads;
}

std::vector<double> rank_costs(const StepView& step) {
  MicroBatch scratch;
  return rank_costs(step, scratch, [](const MicroBatch&) {});
}

// Rank times of a step, cost x speed (plan.rank_speed), in `times`; the costs themselves where the
// plan has no speeds.
static const std::vector<double>& rank_times(const std::vector<double>& loads, const std::vector<double>& speed,
                                             std::vector<double>& times) {
  if (speed.empty()) return loads;
  times.resize(loads.size());
  for (size_t r = 0; r < loads.size(); ++r) times[r] = loads[r] * speed[r];
  return times;
}

// The busiest rank's time over the balanced level, sum(cost) / sum(1 / speed): 1 where the times
// are even.
static double max_over_level(const std::vector<double>& loads, const std::vector<double>& speed) {
  double total = 0, inverse_speeds = 0, top = 0;
  for (size_t r = 0; r < loads.size(); ++r) {
    total += loads[r];
    inverse_speeds += 1.0 / speed[r];
    top = std::max(top, loads[r] * speed[r]);
  }
  return total > 0 ? top * inverse_speeds / total : 1.0;
}

static double max_over_mean(const std::vector<double>& loads) {
  if (loads.empty()) return 1.0;
  double total = 0, top = 0;
  for (double l : loads) total += l, top = std::max(top, l);
  const double mean = total / double(loads.size());
  return mean > 0 ? top / mean : 1.0;
}

double least_busiest_cost(std::vector<double>& piece_costs, size_t world, double c) {
  const size_t n = piece_costs.size();
  if (n == 0 || world == 0) return 0;
  std::vector<double>& w = piece_costs;
  std::sort(w.begin(), w.end(), std::greater<double>());
  double least = w[0];
  // Pairs among the P+q longest.
  const size_t P = world;
  const size_t q_max = std::min<size_t>({P, n > P ? n - P : 0, 64});
  for (size_t q = 1; q <= q_max; ++q) {
    for (size_t i = 1; i <= q; ++i) {
      double bound = w[P - q + i - 1] + w[P + q - i];
      if (i < q) bound = std::min(bound, w[P + q - i] + w[P + q - i - 1] + w[P + q - i - 2]);
      least = std::max(least, bound);
    }
  }
  // k of the kP+1 longest (k >= 1): the window [kP-k, kP], by prefix sums made in place (w[j]
  // becomes the sum of the j+1 longest).
  for (size_t j = 1; j < n; ++j) w[j] += w[j - 1];
  for (size_t k = 1; k * P < n; ++k) {
    const size_t first = k * P - k, last = k * P;
    least = std::max(least, w[last] - (first > 0 ? w[first - 1] : 0.0));
  }
  return least + std::max(c, 0.0);
}

// The imbalance no division of a packed step's pieces can beat: least_busiest_cost over the
// step's mean rank cost. `piece_costs` holds the step's piece costs (used as scratch).
static double step_bound(const std::vector<double>& loads, double c, std::vector<double>& piece_costs) {
  const size_t world = loads.size();
  double total = 0;
  for (double l : loads) total += l;
  const double mean = world ? total / double(world) : 0;
  if (!(mean > 0)) return 1.0;
  if (piece_costs.empty()) return 1.0;
  return std::max(1.0, least_busiest_cost(piece_costs, world, c) / mean);
}

void compute_plan_stats(EpochPlan& plan) {
  PlanStats& s = plan.stats;
  s.steps_per_epoch = plan.steps.size();
  s.micro_batches = s.target_tokens = s.tokens_computed = 0;
  s.attention_work = 0;
  s.idle_rank_steps = s.steps_with_idle_ranks = s.idle_ranks_max = 0;
  s.micro_batches_per_rank_max = 0;
  std::vector<double> imbalance, bound, cuts_per_step, kv_bytes_per_step;
  s.cuts = s.cut_pieces = 0;
  s.kv_bytes_per_rank_max = 0;
  s.cut_piece_ranks_max = 0;
  s.link_bound_parts = 0;
  imbalance.reserve(plan.steps.size());
  std::vector<double> piece_costs;  // the step's piece costs, for step_bound()
  std::vector<double> times_scratch;
  MicroBatch scratch;
  const bool packed = !plan.steps.padded();
  double critical_cost = 0, rank_time = 0, wait_time = 0;
  double step_tokens_min = 0, step_tokens_max = 0;
  for (uint64_t i = 0; i < plan.steps.size(); ++i) {
    const StepView step = plan.steps[i];
    s.micro_batches += step.micro_batch_count();
    uint64_t idle = 0;
    for (int r = 0; r < step.world_size(); ++r) {
      const auto [first, end] = step.rank_micro_batches(r);
      idle += first == end;
      s.micro_batches_per_rank_max = std::max(s.micro_batches_per_rank_max, double(end - first));
    }
    s.idle_rank_steps += idle;
    s.steps_with_idle_ranks += idle > 0;
    s.idle_ranks_max = std::max(s.idle_ranks_max, idle);
    piece_costs.clear();
    const std::vector<double> loads = rank_costs(step, scratch, [&](const MicroBatch& mb) {
      s.target_tokens += mb.target_tokens;
      s.tokens_computed += mb.tokens_computed();
      s.attention_work += mb.attention_work();
      if (packed)
        for (const Piece& p : mb.pieces)
          if (p.offset == 0) piece_costs.push_back(plan.cost.piece(p.len));  // parts: below
    });
    // Cut pieces: checked against the rules (step_cuts throws), counted, their K/V traffic, and
    // their whole length for the whole-piece bound (the first part was counted as a piece above).
    uint64_t step_cuts_count = 0;
    double step_kv_bytes = 0;
    if (packed && plan.steps.step_has_parts(i)) {
      std::vector<double> rank_bytes(size_t(step.world_size()), 0.0);
      for (const CutPiece& cut : step_cuts(step)) {
        step_cuts_count += cut.parts.size() - 1;
        ++s.cut_pieces;
        const CutPart& last = cut.parts.back();
        const uint32_t whole = last.offset + last.len;
        if (whole > 0) piece_costs.push_back(plan.cost.piece(whole));
        for (size_t k = 0; k < cut.parts.size(); ++k) {
          if (k == 0) {
            // Its first part was counted as a piece of its own length above: take it back.
            auto it = std::find(piece_costs.begin(), piece_costs.end(), plan.cost.piece(cut.parts[0].len));
            if (it != piece_costs.end()) piece_costs.erase(it);
          }
          // Part k receives the K/V of the tokens before it and sends their gradients back; part
          // j < k sends its own tokens' K/V to it and receives their gradients.
          const double bytes = 2.0 * double(cut.parts[k].offset) * plan.kv_bytes_per_token;
          step_kv_bytes += bytes;
          rank_bytes[size_t(cut.parts[k].rank)] += bytes;
          if (k > 0 && plan.cost.t_link * double(cut.parts[k].offset) > loads[size_t(cut.parts[k].rank)])
            ++s.link_bound_parts;
          for (size_t j = 0; j < k; ++j)
            rank_bytes[size_t(cut.parts[j].rank)] += 2.0 * double(cut.parts[j].len) * plan.kv_bytes_per_token;
        }
        s.cut_piece_ranks_max = std::max<uint64_t>(s.cut_piece_ranks_max, cut.parts.size());
      }
      for (double b : rank_bytes) s.kv_bytes_per_rank_max = std::max(s.kv_bytes_per_rank_max, b);
    }
    s.cuts += step_cuts_count;
    cuts_per_step.push_back(double(step_cuts_count));
    kv_bytes_per_step.push_back(step_kv_bytes);
    imbalance.push_back(plan.rank_speed.empty() ? max_over_mean(loads) : max_over_level(loads, plan.rank_speed));
    const std::vector<double>& times = rank_times(loads, plan.rank_speed, times_scratch);
    const double busiest = times.empty() ? 0 : *std::max_element(times.begin(), times.end());
    critical_cost += busiest;
    rank_time += busiest * double(times.size());
    for (double l : times) wait_time += busiest - l;
    if (packed) bound.push_back(step_bound(loads, plan.cost.c, piece_costs));
    const double t = double(step.target_tokens());
    step_tokens_min = i == 0 ? t : std::min(step_tokens_min, t);
    step_tokens_max = std::max(step_tokens_max, t);
  }
  s.padding_efficiency = s.tokens_computed ? double(s.target_tokens) / double(s.tokens_computed) : 0;
  s.cost_imbalance_p50 = quantile_of(imbalance, 0.50);
  s.cost_imbalance_p95 = quantile_of(imbalance, 0.95);
  s.cost_imbalance_max = quantile_of(imbalance, 1.0);
  s.critical_cost_per_token = s.target_tokens ? critical_cost / double(s.target_tokens) : 0;
  s.cost_wait_fraction = rank_time > 0 ? wait_time / rank_time : 0;
  s.cost_imbalance_bound_p50 = packed ? quantile_of(bound, 0.50) : 0;
  s.cost_imbalance_bound_p95 = packed ? quantile_of(bound, 0.95) : 0;
  s.micro_batches_per_step = s.steps_per_epoch ? double(s.micro_batches) / double(s.steps_per_epoch) : 0;
  s.target_tokens_per_step_mean = s.steps_per_epoch ? double(s.target_tokens) / double(s.steps_per_epoch) : 0;
  s.target_tokens_per_step_min = step_tokens_min;
  s.target_tokens_per_step_max = step_tokens_max;
  s.cuts_per_step_p50 = quantile_of(cuts_per_step, 0.50);
  s.cuts_per_step_max = quantile_of(cuts_per_step, 1.0);
  s.kv_bytes_per_step_p50 = quantile_of(kv_bytes_per_step, 0.50);
  s.kv_bytes_per_step_max = quantile_of(kv_bytes_per_step, 1.0);
  if (plan.uncut_imbalance.size() == plan.steps.size()) {
    s.cost_imbalance_uncut_p50 = quantile_of(plan.uncut_imbalance, 0.50);
    s.cost_imbalance_uncut_p95 = quantile_of(plan.uncut_imbalance, 0.95);
    s.cost_imbalance_uncut_max = quantile_of(plan.uncut_imbalance, 1.0);
  } else {
    s.cost_imbalance_uncut_p50 = s.cost_imbalance_p50;
    s.cost_imbalance_uncut_p95 = s.cost_imbalance_p95;
    s.cost_imbalance_uncut_max = s.cost_imbalance_max;
  }
}

double node_cost_imbalance(const EpochPlan& plan, int ranks_per_node, double quantile) {
  KILTER_CHECK(ranks_per_node >= 1, "ranks per node " << ranks_per_node << ": must be >= 1");
  std::vector<double> imbalance;
  for (uint64_t i = 0; i < plan.steps.size(); ++i) {
    const std::vector<double> loads = rank_costs(plan.steps[i]);
    std::vector<double> node_loads((loads.size() + ranks_per_node - 1) / ranks_per_node, 0.0);
    for (size_t r = 0; r < loads.size(); ++r) node_loads[r / ranks_per_node] += loads[r];
    imbalance.push_back(max_over_mean(node_loads));
  }
  return imbalance.empty() ? 1.0 : quantile_of(imbalance, quantile);
}

uint64_t plan_fingerprint(const EpochPlan& plan) {
  uint64_t h = mix64(plan.epoch) ^ mix64(uint64_t(plan.world_size) + 0x51ED27ull);
  auto add = [&h](uint64_t v) { h = mix64(h ^ v) + 0x9E3779B97F4A7C15ull; };
  MicroBatch mb;
  for (uint64_t s = 0; s < plan.steps.size(); ++s) {
    const StepView step = plan.steps[s];
    add(step.micro_batch_count());
    for (uint32_t m = 0; m < step.micro_batch_count(); ++m) {
      step.micro_batch(m, mb);
      add(mb.padded_len);
      for (const Piece& p : mb.pieces) {
        add(p.doc);
        add((uint64_t(p.start) << 32) | p.len);
        if (p.offset != 0) add(p.offset);  // parts (uncut plans keep their fingerprints)
      }
    }
    for (int r = 0; r < step.world_size(); ++r) {
      const auto [first, end] = step.rank_micro_batches(r);
      add(end - first);
      for (uint32_t m = first; m < end; ++m) add(m);
    }
  }
  return h;
}

}  // namespace kilter::balance
