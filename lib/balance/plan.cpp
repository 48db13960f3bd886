// The balanced batch plan (docs/design.md, "Batch plan"): documents cut to the context, the pieces
// shuffled from (seed, epoch), global steps of ~tokens_per_step target tokens cut from that order
// (world-size independent), the tail dropped or redistributed, and each step divided among the
// ranks piece by piece and packed (divide.cpp).
#include "lib/balance/plan.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include "io/base/error.h"
#include "lib/balance/divide.h"
#include "lib/balance/group_slots.h"
#include "lib/balance/naive.h"
#include "lib/balance/rng.h"

namespace kilter::balance {

namespace {

// The shuffled pieces cut into steps of ~target tokens: a step takes the next piece unless it
// already has the target or stopping now is closer to it, so every step holds target +- context/2
// (the last group is the tail unless it does too). Depends on the pieces' order only, never on
// the world size.
struct StepCut {
  std::vector<uint64_t> step_end;  // step s holds pieces [step_end[s-1], step_end[s])
  uint64_t tail_begin = 0;         // pieces [tail_begin, n) are the tail
};
StepCut cut_steps(const std::vector<Piece>& pieces, uint64_t target, uint32_t context) {
  StepCut cut;
  uint64_t cur_tokens = 0, begin = 0;
  for (uint64_t i = 0; i < pieces.size(); ++i) {
    const uint64_t t = pieces[i].len;
    // Stop before this piece when the step has its target or when overshooting by t would
    // land farther from the target than stopping short: cur + t - target > target - cur.
    if (i > begin && (cur_tokens >= target || 2 * cur_tokens + t > 2 * target)) {
      cut.step_end.push_back(i);
      begin = i;
      cur_tokens = 0;
    }
    cur_tokens += t;
  }
  cut.tail_begin = pieces.size();
  if (begin < pieces.size()) {
    if (2 * cur_tokens + context >= 2 * target) cut.step_end.push_back(pieces.size());
    else cut.tail_begin = begin;
  }
  return cut;
}

}  // namespace

// ---- cost model -------------------------------------------------------------------------------

double MicroBatch::attention_work() const {
  if (!packed()) return double(pieces.size()) * double(padded_len) * double(padded_len);
  double sum_sq = 0;
  for (const Piece& p : pieces) {
    const double s = double(p.offset), e = double(p.offset) + double(p.len);
    sum_sq += e * e - s * s;
  }
  return sum_sq;
}

double MicroBatch::kv_tokens() const {
  double earlier = 0;
  for (const Piece& p : pieces) earlier += double(p.offset);
  return earlier;
}

double CostModel::operator()(const MicroBatch& mb) const {
  return a * double(mb.tokens_computed()) + b * mb.attention_work() + t * mb.kv_tokens() + std::max(c, 0.0);
}

double kv_link_cost_coefficient(const model::ModelSpec& spec, double kv_value_bytes, double link_gbps,
                                double device_tflops) {
  KILTER_CHECK(spec.n_layer >= 1 && spec.n_embd >= 1 && spec.vocab_size >= 0 && kv_value_bytes > 0,
               "kv_link_cost_coefficient: bad model shape n_layer=" << spec.n_layer << " n_embd=" << spec.n_embd
               << " vocab=" << spec.vocab_size << " bytes=" << kv_value_bytes);
  KILTER_CHECK(link_gbps > 0, "comm.link_gbps = " << link_gbps << ": must be > 0");
  KILTER_CHECK(device_tflops > 0, "comm.device_tflops = " << device_tflops << ": must be > 0");
  // K/V forward plus dK/dV backward.
  const double transfer_s = 2.0 * model::kv_bytes_per_token(spec, kv_value_bytes) / (link_gbps * 1e9 / 8);
  const double token_s = model::dense_flops_per_token(spec) / (device_tflops * 1e12);
  return transfer_s / token_s;
}

double transfer_cost_coefficient(const model::ModelSpec& spec, double kv_value_bytes, double link_gbps,
                                 double device_tflops) {
  // One layer's transfer forward and one backward are exposed; the others overlap (plan.h).
  return kv_link_cost_coefficient(spec, kv_value_bytes, link_gbps, device_tflops) / spec.n_layer;
}

double link_bound_transfer_cost(double t_link, int n_layer, double rank_load, double reference_offset) {
  KILTER_CHECK(n_layer >= 1 && t_link >= 0 && rank_load >= 0 && reference_offset > 0,
               "link_bound_transfer_cost: bad arguments t_link=" << t_link << " n_layer=" << n_layer
               << " rank_load=" << rank_load << " reference_offset=" << reference_offset);
  const double layers = double(n_layer);
  const double x = reference_offset * t_link / (2.0 * layers);  // one layer's transfer, each way
  // The receiving rank's compute of one layer: the forward is a third of a step's work, the
  // backward two thirds.
  const double compute_fwd = rank_load / (3.0 * layers), compute_bwd = 2.0 * rank_load / (3.0 * layers);
  // The first layer's transfer waits in full; each later one by what the layer before it does not hide.
  const auto exposed = [&](double compute) { return x + (layers - 1.0) * std::max(x - compute, 0.0); };
  return std::max(t_link / layers, (exposed(compute_fwd) + exposed(compute_bwd)) / reference_offset);
}

double attention_cost_coefficient(const model::ModelSpec& spec) {
  KILTER_CHECK(spec.n_layer >= 1 && spec.n_embd >= 1 && spec.vocab_size >= 0,
               "attention_cost_coefficient: bad model shape n_layer=" << spec.n_layer << " n_embd=" << spec.n_embd
               << " vocab=" << spec.vocab_size);
  return model::attention_flops_per_square(spec) / model::dense_flops_per_token(spec);
}

double default_attention_cost(uint32_t context) { return 1.0 / (6.0 * std::max<uint32_t>(context, 1)); }

double default_micro_batch_cost(double a) { return kDefaultMicroBatchTokens * a; }

CostModel resolve_cost_model(const CostModel& cost, uint32_t context, uint64_t tokens_per_step, int world_size) {
  CostModel resolved = cost;
  if (!(resolved.b > 0)) resolved.b = default_attention_cost(context);
  if (!(resolved.c >= 0)) resolved.c = default_micro_batch_cost(resolved.a);
  if (resolved.layers > 0 && resolved.t_link > 0 && tokens_per_step > 0 && world_size >= 1) {
    // A typical cut of this step size: a rank's share of the step, a prefix of at most a context.
    const double per_rank = double(tokens_per_step) / double(world_size);
    const double reference_offset = std::min(double(std::max<uint32_t>(context, 1)), per_rank);
    resolved.t = std::max(resolved.t, link_bound_transfer_cost(resolved.t_link, resolved.layers,
                                                                resolved.a * per_rank, reference_offset));
  }
  return resolved;
}

void check_plan_options(const PlanOptions& opts, int world_size) {
  KILTER_CHECK(opts.sampler == "balanced" || opts.sampler == "naive",
               "data.sampler = '" << opts.sampler << "': expected balanced | naive");
  KILTER_CHECK(opts.tail == "drop" || opts.tail == "redistribute",
               "data.tail = '" << opts.tail << "': expected drop | redistribute");
  KILTER_CHECK(opts.context >= 1, "model.block_size (the plan's context) = " << opts.context << ": must be >= 1");
  KILTER_CHECK(opts.max_tokens >= 1, "data.max_tokens = " << opts.max_tokens << ": must be >= 1");
  // The balanced plan cuts a piece longer than a micro-batch over several ranks (context
  // parallelism; long_piece_ranks() checks the world size); the naive baseline cannot.
  KILTER_CHECK(opts.sampler != "naive" || opts.max_tokens >= opts.context,
               "data.max_tokens = " << opts.max_tokens << " is smaller than the context model.block_size = "
               << opts.context << " with data.sampler = naive, which cannot cut a piece between ranks; raise "
               "data.max_tokens to >= " << opts.context << ", lower model.block_size or use data.sampler = balanced");
  KILTER_CHECK(opts.tokens_per_step >= 1, "train.tokens_per_step = " << opts.tokens_per_step
               << ": a step must hold at least one token (e.g. " << 8 * opts.max_tokens << ")");
  KILTER_CHECK(opts.naive_batch_size >= 1, "data.naive_batch_size = " << opts.naive_batch_size << ": must be >= 1");
  KILTER_CHECK(world_size >= 1, "world size " << world_size << ": must be >= 1");
  KILTER_CHECK(opts.cost.a >= 0 && std::isfinite(opts.cost.a), "data.cost_a = " << opts.cost.a << ": must be >= 0");
  KILTER_CHECK(std::isfinite(opts.cost.b), "data.cost_b = " << opts.cost.b << ": must be a number");
  KILTER_CHECK(std::isfinite(opts.cost.c), "data.cost_c = " << opts.cost.c << ": must be a number");
  KILTER_CHECK(opts.cost.t >= 0 && std::isfinite(opts.cost.t), "data.cost_t = " << opts.cost.t << ": must be >= 0");
  KILTER_CHECK(opts.cost.a > 0 || opts.cost.b > 0,
               "data.cost_a = 0 with data.cost_b = " << opts.cost.b << ": the cost model needs a > 0 or b > 0");
  KILTER_CHECK(opts.rank_speed.empty() || opts.rank_speed.size() == size_t(world_size),
               "plan: " << opts.rank_speed.size() << " rank speeds for a world size of " << world_size);
  for (double speed : opts.rank_speed)
    KILTER_CHECK(speed > 0 && std::isfinite(speed), "plan: a rank speed of " << speed << " (must be > 0)");
}

uint64_t long_piece_ranks(uint32_t longest_piece, uint64_t max_tokens) {
  return std::max<uint64_t>(1, (uint64_t(longest_piece) + max_tokens - 1) / max_tokens);
}

void account_long_pieces(uint32_t longest_piece, uint64_t long_pieces, const PlanOptions& opts, int world_size,
                         PlanStats& stats) {
  const uint64_t ranks_needed = long_piece_ranks(longest_piece, opts.max_tokens);
  stats.long_pieces = long_pieces;
  stats.long_piece_ranks_max = long_pieces > 0 ? ranks_needed : 0;
  KILTER_CHECK(ranks_needed <= uint64_t(world_size),
               "the data holds pieces of " << longest_piece << " tokens (model.block_size = " << opts.context
               << ") and a micro-batch holds data.max_tokens = " << opts.max_tokens << ": such a piece is cut over "
               << ranks_needed << " ranks, more than the world size " << world_size << "; run on >= " << ranks_needed
               << " ranks, or in a new run raise data.max_tokens to >= " << longest_piece
               << " or lower model.block_size (a resumed run keeps both)");
}

std::string idle_rank_warning(const PlanOptions& opts, int world_size) {
  // Cutting pieces between ranks balances steps of less than a context per rank.
  if (opts.sampler != "balanced" || world_size <= 1 || opts.cut_pieces) return "";
  const uint64_t per_rank = opts.tokens_per_step / uint64_t(world_size);
  if (per_rank >= opts.context) return "";
  const uint64_t step_needed = uint64_t(world_size) * opts.context;
  const uint64_t ranks_fit = std::max<uint64_t>(1, opts.tokens_per_step / opts.context);
  std::ostringstream os;
  os << "train.tokens_per_step = " << opts.tokens_per_step << " over " << world_size << " ranks is " << per_rank
     << " tokens per rank, less than one context (model.block_size = " << opts.context
     << "): a rank given a full-length piece carries more than its share and some ranks idle in some steps "
        "(they still join every collective); set train.tokens_per_step >= "
     << step_needed << " (2x that balances better) or run on <= " << ranks_fit << " ranks";
  return os.str();
}

// ---- documents --------------------------------------------------------------------------------

EpochPlan start_plan(const std::vector<uint64_t>& docs, const CostModel& cost, int world_size, uint64_t epoch,
                     uint32_t context, bool padded) {
  EpochPlan plan;
  plan.epoch = epoch;
  plan.world_size = world_size;
  plan.cost = cost;
  plan.steps = PlanSteps(context, world_size, padded, cost);
  plan.stats.documents = docs.size();
  return plan;
}

std::vector<Piece> cut_documents(const std::vector<uint32_t>& doc_lengths, const std::vector<uint64_t>& docs,
                                 uint32_t context, uint64_t* empty_docs) {
  KILTER_CHECK(context >= 1, "cut_documents: context must be >= 1");
  std::vector<Piece> pieces;
  uint64_t count = 0, empty = 0;
  for (uint64_t doc : docs) count += (uint64_t(doc_lengths.at(doc)) + context - 1) / context;
  pieces.reserve(count);
  for (uint64_t doc : docs) {
    const uint32_t n = doc_lengths[doc];
    if (n == 0) ++empty;
    for (uint32_t start = 0; start < n; start += std::min(context, n - start))
      pieces.push_back(Piece{doc, start, std::min(context, n - start)});
  }
  if (empty_docs) *empty_docs = empty;
  return pieces;
}

std::vector<uint64_t> all_documents(size_t num_docs) {
  std::vector<uint64_t> docs(num_docs);
  std::iota(docs.begin(), docs.end(), uint64_t(0));
  return docs;
}

Split split_documents(const std::vector<uint32_t>& doc_lengths, double eval_fraction, uint64_t seed) {
  KILTER_CHECK(eval_fraction >= 0 && eval_fraction < 1,
               "data.eval_fraction = " << eval_fraction << ": must be in [0, 1)");
  const uint64_t n = doc_lengths.size();
  Split split;
  uint64_t n_eval = static_cast<uint64_t>(std::llround(eval_fraction * double(n)));
  if (eval_fraction > 0 && n >= 2) n_eval = std::max<uint64_t>(n_eval, 1);
  if (n_eval == 0) {
    split.train_docs = all_documents(n);
    return split;
  }
  // The n_eval documents with the smallest keyed hash: an exact count, independent of any order
  // and of the epoch, so the held-out set never leaks into training.
  const uint64_t key = mix64(seed ^ (static_cast<uint64_t>(RngStream::kEvalSplit) << 56));
  std::vector<std::pair<uint64_t, uint64_t>> keyed(n);
  for (uint64_t d = 0; d < n; ++d) keyed[d] = {mix64(key ^ mix64(d)), d};
  std::nth_element(keyed.begin(), keyed.begin() + n_eval, keyed.end());
  std::vector<char> is_eval(n, 0);
  for (uint64_t i = 0; i < n_eval; ++i) is_eval[keyed[i].second] = 1;
  keyed.clear();
  keyed.shrink_to_fit();
  split.eval_docs.reserve(n_eval);
  split.train_docs.reserve(n - n_eval);
  for (uint64_t d = 0; d < n; ++d) (is_eval[d] ? split.eval_docs : split.train_docs).push_back(d);
  return split;
}

PlanPosition next_position(PlanPosition pos, uint64_t steps_in_epoch) {
  if (pos.step_in_epoch + 1 < steps_in_epoch) return {pos.epoch, pos.step_in_epoch + 1};
  return {pos.epoch + 1, 0};
}

// ---- the balanced plan ------------------------------------------------------------------------

namespace {

EpochPlan build_balanced_plan(const std::vector<uint32_t>& doc_lengths, const std::vector<uint64_t>& docs,
                              const PlanOptions& opts, const CostModel& cost, int world_size, uint64_t epoch) {
  EpochPlan plan = start_plan(docs, cost, world_size, epoch, opts.context, false);
  PlanStats& stats = plan.stats;

  // The epoch's piece order: a shuffle from (seed, epoch) alone, so the steps cut from it are
  // the same for every world size.
  std::vector<Piece> pieces = cut_documents(doc_lengths, docs, opts.context, &stats.empty_docs);
  stats.pieces = pieces.size();
  // A piece longer than a micro-batch is cut over ranks, one part each: the world size must hold it.
  uint32_t longest = 0;
  uint64_t long_pieces = 0;
  for (const Piece& p : pieces) {
    longest = std::max(longest, p.len);
    long_pieces += p.len > opts.max_tokens;
  }
  account_long_pieces(longest, long_pieces, opts, world_size, stats);
  Xoshiro256 piece_rng(opts.seed, epoch, RngStream::kPieceOrder);
  fisher_yates(pieces.data(), pieces.size(), piece_rng);

  StepCut cut = cut_steps(pieces, opts.tokens_per_step, opts.context);
  for (uint64_t i = cut.tail_begin; i < pieces.size(); ++i) stats.tail_tokens += pieces[i].len;
  const uint64_t n_tail = pieces.size() - cut.tail_begin;
  stats.tail_pieces = n_tail;
  bool spread_tail = false;
  if (cut.step_end.empty() && n_tail > 0) {
    // Fewer tokens than one step in the whole split: the tail is the epoch's only step, under
    // either policy, so a tiny dataset still trains.
    cut.step_end.push_back(pieces.size());
    cut.tail_begin = pieces.size();
    stats.tail_redistributed = true;
  } else if (opts.tail == "redistribute" && n_tail > 0) {
    spread_tail = true;
    stats.tail_redistributed = true;
  } else {
    stats.dropped_pieces = n_tail;
    stats.dropped_tokens = stats.tail_tokens;
  }

  const uint64_t n_steps = cut.step_end.size();
  // Every piece but a dropped tail goes into the plan; the micro-batches' count is known only
  // once packed (shrink_to_fit() below trims that one array).
  plan.steps.reserve(n_steps, spread_tail ? pieces.size() : cut.tail_begin, 0);
  // Shard groups: each group's micro-batches even slot by slot (group_slots.h).
  StepDivision division(cost, opts, world_size);
  const auto divide = [&](const Piece* step_pieces, size_t n) { division.divide(step_pieces, n, plan); };
  plan.rank_speed = opts.rank_speed;
  plan.kv_bytes_per_token = opts.kv_bytes_per_token;
  plan.uncut_imbalance.reserve(n_steps);
  std::vector<Piece> with_tail;  // a step's pieces plus its share of a redistributed tail
  uint64_t tail_next = cut.tail_begin;
  for (uint64_t s = 0; s < n_steps; ++s) {
    const uint64_t begin = s == 0 ? 0 : cut.step_end[s - 1];
    const uint64_t end = cut.step_end[s];
    if (!spread_tail) {
      divide(pieces.data() + begin, end - begin);
      continue;
    }
    // The tail's pieces spread evenly over the epoch's steps: piece j goes to step j n_steps / n_tail.
    with_tail.assign(pieces.begin() + long(begin), pieces.begin() + long(end));
    for (; tail_next < pieces.size() && ((tail_next - cut.tail_begin) * n_steps) / n_tail == s; ++tail_next)
      with_tail.push_back(pieces[tail_next]);
    divide(with_tail.data(), with_tail.size());
  }
  plan.steps.shrink_to_fit();
  compute_plan_stats(plan);
  division.add_stats(plan);
  return plan;
}

}  // namespace

EpochPlan build_epoch_plan(const std::vector<uint32_t>& doc_lengths, const std::vector<uint64_t>& docs,
                           const PlanOptions& opts, int world_size, uint64_t epoch) {
  check_plan_options(opts, world_size);
  for (uint64_t doc : docs)
    KILTER_CHECK(doc < doc_lengths.size(), "plan: document id " << doc << " is outside the index ("
                 << doc_lengths.size() << " documents)");
  const CostModel cost = resolve_cost_model(opts.cost, opts.context, opts.tokens_per_step, world_size);
  if (opts.sampler == "naive") return build_naive_plan(doc_lengths, docs, opts, cost, world_size, epoch);
  return build_balanced_plan(doc_lengths, docs, opts, cost, world_size, epoch);
}

}  // namespace kilter::balance
