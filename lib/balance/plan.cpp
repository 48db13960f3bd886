// The balanced batch plan (DESIGN.md, "Batch plan"): documents cut to the context, pieces
// counting-sorted into length buckets and shuffled inside each bucket, micro-batches filled to
// the token budget in ascending length order, micro-batches shuffled across the epoch, global
// steps of ~tokens_per_step target tokens cut from that order (world-size independent), the
// tail dropped or redistributed, and each step's micro-batches assigned to ranks by cost.
#include "lib/balance/plan.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "io/error.h"
#include "lib/balance/assign.h"
#include "lib/balance/naive.h"
#include "lib/balance/rng.h"

namespace kilter::balance {

namespace {

// Automatic buckets: exact lengths below 2 x kAutoBucketShare, then widths of ~1/kAutoBucketShare
// of the bucket's first length, which bounds padding inside a bucket to ~1.6% of a row.
constexpr uint32_t kAutoBucketShare = 64;
// A micro-batch takes a piece from the next bucket only while its padding stays under this
// share of its computed tokens; otherwise it is closed, under-filled but not padded.
constexpr double kMaxPaddingShare = 1.0 / 32.0;

// bucket_of[len] for len in [1, context]; buckets ascend with length.
std::vector<uint32_t> make_bucket_table(uint32_t context, uint32_t bucket_width, uint32_t* num_buckets) {
  std::vector<uint32_t> bucket_of(context + 1, 0);
  uint32_t bucket = 0;
  uint32_t bucket_start = 1;
  for (uint32_t len = 1; len <= context; ++len) {
    const uint32_t width = bucket_width > 0 ? bucket_width : std::max(1u, bucket_start / kAutoBucketShare);
    if (len >= bucket_start + width) {
      ++bucket;
      bucket_start = len;
    }
    bucket_of[len] = bucket;
  }
  *num_buckets = bucket + 1;
  return bucket_of;
}

void check_options(const std::vector<uint32_t>& doc_lengths, const std::vector<uint64_t>& docs,
                   const PlanOptions& opts, int world_size) {
  KILTER_CHECK(opts.sampler == "balanced" || opts.sampler == "naive",
               "data.sampler = '" << opts.sampler << "': expected balanced | naive");
  KILTER_CHECK(opts.tail == "drop" || opts.tail == "redistribute",
               "data.tail = '" << opts.tail << "': expected drop | redistribute");
  KILTER_CHECK(opts.context >= 1, "model.block_size (plan context) = " << opts.context << ": must be >= 1");
  KILTER_CHECK(opts.max_tokens >= opts.context, "data.max_tokens = " << opts.max_tokens
               << ": must be >= model.block_size (" << opts.context << ") so a full piece fits");
  KILTER_CHECK(opts.tokens_per_step >= 1, "train.tokens_per_step = " << opts.tokens_per_step << ": must be >= 1");
  KILTER_CHECK(opts.naive_batch_size >= 1, "data.naive_batch_size = " << opts.naive_batch_size << ": must be >= 1");
  KILTER_CHECK(world_size >= 1, "world size " << world_size << ": must be >= 1");
  KILTER_CHECK(opts.cost.a >= 0, "data.cost_a = " << opts.cost.a << ": must be >= 0");
  for (uint64_t doc : docs)
    KILTER_CHECK(doc < doc_lengths.size(), "plan: document id " << doc << " is outside the index ("
                 << doc_lengths.size() << " documents)");
}

// A micro-batch while the plan is built: a range of the bucket-ordered piece array.
struct PieceRange {
  uint64_t begin = 0;
  uint32_t rows = 0;
  uint32_t padded_len = 0;
  uint64_t target_tokens = 0;
};

// Walks the bucket-ordered pieces and closes a micro-batch when the next piece would break the
// token budget (rows x longest) or pad it beyond kMaxPaddingShare.
std::vector<PieceRange> fill_micro_batches(const std::vector<Piece>& pieces, uint64_t max_tokens) {
  std::vector<PieceRange> ranges;
  PieceRange cur;
  for (uint64_t i = 0; i < pieces.size(); ++i) {
    const uint32_t len = pieces[i].len;
    if (cur.rows > 0) {
      const uint64_t padded = std::max(cur.padded_len, len);
      const uint64_t computed = (uint64_t(cur.rows) + 1) * padded;
      const uint64_t real = cur.target_tokens + len;
      const bool fits = computed <= max_tokens;
      const bool tight = double(computed - real) <= kMaxPaddingShare * double(computed);
      if (!fits || !tight) {
        ranges.push_back(cur);
        cur = PieceRange{};
      }
    }
    if (cur.rows == 0) cur.begin = i;
    ++cur.rows;
    cur.padded_len = std::max(cur.padded_len, len);
    cur.target_tokens += len;
  }
  if (cur.rows > 0) ranges.push_back(cur);
  return ranges;
}

// Cuts the shuffled micro-batch order into steps of ~target tokens: a step takes the next
// micro-batch unless it already has the target or stopping now is closer to it. Every step
// closed this way holds >= target - max_tokens/2; the last group is the tail unless it does too.
struct StepCut {
  std::vector<std::vector<uint32_t>> steps;  // micro-batch ids per step
  std::vector<uint32_t> tail;
};
StepCut cut_steps(const std::vector<uint32_t>& order, const std::vector<PieceRange>& ranges,
                  uint64_t target, uint64_t max_tokens) {
  StepCut cut;
  std::vector<uint32_t> cur;
  uint64_t cur_tokens = 0;
  for (uint32_t id : order) {
    const uint64_t t = ranges[id].target_tokens;
    // Stop before this micro-batch when the step has its target or when overshooting by t
    // would land farther from the target than stopping short: cur + t - target > target - cur.
    if (!cur.empty() && (cur_tokens >= target || 2 * cur_tokens + t > 2 * target)) {
      cut.steps.push_back(std::move(cur));
      cur.clear();
      cur_tokens = 0;
    }
    cur.push_back(id);
    cur_tokens += t;
  }
  if (!cur.empty()) {
    if (2 * cur_tokens + max_tokens >= 2 * target) cut.steps.push_back(std::move(cur));
    else cut.tail = std::move(cur);
  }
  return cut;
}

}  // namespace

// ---- cost model -------------------------------------------------------------------------------

double CostModel::operator()(const MicroBatch& mb) const {
  double sum_sq = 0;
  for (const Piece& p : mb.pieces) sum_sq += double(p.len) * double(p.len);
  return a * double(mb.tokens_computed()) + b * sum_sq;
}

double attention_cost_coefficient(int n_layer, int n_embd, int vocab_size) {
  KILTER_CHECK(n_layer >= 1 && n_embd >= 1 && vocab_size >= 0,
               "attention_cost_coefficient: bad model shape n_layer=" << n_layer << " n_embd=" << n_embd
               << " vocab=" << vocab_size);
  return double(n_layer) / (12.0 * n_layer * n_embd + vocab_size);
}

double default_attention_cost(uint32_t context) { return 1.0 / (6.0 * std::max<uint32_t>(context, 1)); }

CostModel resolve_cost_model(const CostModel& cost, uint32_t context) {
  CostModel resolved = cost;
  if (!(resolved.b > 0)) resolved.b = default_attention_cost(context);
  return resolved;
}

// ---- documents --------------------------------------------------------------------------------

EpochPlan start_plan(const std::vector<uint64_t>& docs, const CostModel& cost, int world_size, uint64_t epoch) {
  EpochPlan plan;
  plan.epoch = epoch;
  plan.world_size = world_size;
  plan.cost = cost;
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
  EpochPlan plan = start_plan(docs, cost, world_size, epoch);
  PlanStats& stats = plan.stats;
  const uint32_t context = opts.context;

  // Counting sort of the pieces by bucket, straight from the lengths (no unsorted copy).
  uint32_t num_buckets = 0;
  const std::vector<uint32_t> bucket_of = make_bucket_table(context, opts.bucket_width, &num_buckets);
  std::vector<uint64_t> bucket_begin(num_buckets + 1, 0);
  for (uint64_t doc : docs) {
    const uint32_t n = doc_lengths[doc];
    if (n == 0) {
      ++stats.empty_docs;
      continue;
    }
    bucket_begin[bucket_of[context] + 1] += n / context;
    if (n % context) ++bucket_begin[bucket_of[n % context] + 1];
  }
  std::partial_sum(bucket_begin.begin(), bucket_begin.end(), bucket_begin.begin());
  stats.pieces = bucket_begin.back();
  std::vector<Piece> pieces(stats.pieces);
  {
    std::vector<uint64_t> cursor(bucket_begin.begin(), bucket_begin.end() - 1);
    for (uint64_t doc : docs) {
      const uint32_t n = doc_lengths[doc];
      for (uint32_t start = 0; start < n; start += std::min(context, n - start)) {
        const uint32_t len = std::min(context, n - start);
        pieces[cursor[bucket_of[len]]++] = Piece{doc, start, len};
      }
    }
  }
  // Which pieces share a micro-batch changes every epoch; the length order does not.
  Xoshiro256 piece_rng(opts.seed, epoch, RngStream::kPieceOrder);
  for (uint32_t b = 0; b < num_buckets; ++b)
    fisher_yates(pieces.data() + bucket_begin[b], bucket_begin[b + 1] - bucket_begin[b], piece_rng);

  const std::vector<PieceRange> ranges = fill_micro_batches(pieces, opts.max_tokens);
  KILTER_CHECK(ranges.size() < (uint64_t(1) << 32), "plan: too many micro-batches in one epoch");

  // Shuffle the micro-batches across the epoch so that every step mixes lengths (a step of
  // only long sequences would have a different loss scale).
  std::vector<uint32_t> order(ranges.size());
  std::iota(order.begin(), order.end(), 0u);
  Xoshiro256 order_rng(opts.seed, epoch, RngStream::kMicroBatchOrder);
  fisher_yates(order.data(), order.size(), order_rng);
  StepCut cut = cut_steps(order, ranges, opts.tokens_per_step, opts.max_tokens);
  order.clear();
  order.shrink_to_fit();

  for (uint32_t id : cut.tail) {
    ++stats.tail_micro_batches;
    stats.tail_tokens += ranges[id].target_tokens;
  }
  if (cut.steps.empty() && !cut.tail.empty()) {
    // Fewer tokens than one step in the whole split: the tail is the epoch's only step, under
    // either policy, so a tiny dataset still trains.
    cut.steps.push_back(std::move(cut.tail));
    cut.tail.clear();
    stats.tail_redistributed = true;
  } else if (opts.tail == "redistribute") {
    // Spread the tail's micro-batches evenly over the epoch's steps, appended at their ends.
    const uint64_t n_steps = cut.steps.size(), n_tail = cut.tail.size();
    for (uint64_t j = 0; j < n_tail; ++j) cut.steps[(j * n_steps) / n_tail].push_back(cut.tail[j]);
    stats.tail_redistributed = true;
  } else {
    for (uint32_t id : cut.tail) {
      stats.dropped_pieces += ranges[id].rows;
      stats.dropped_tokens += ranges[id].target_tokens;
    }
  }

  plan.steps.resize(cut.steps.size());
  std::vector<double> costs;
  for (size_t s = 0; s < cut.steps.size(); ++s) {
    Step& step = plan.steps[s];
    step.micro_batches.resize(cut.steps[s].size());
    costs.assign(cut.steps[s].size(), 0.0);
    for (size_t m = 0; m < cut.steps[s].size(); ++m) {
      const PieceRange& r = ranges[cut.steps[s][m]];
      MicroBatch& mb = step.micro_batches[m];
      mb.pieces.assign(pieces.begin() + r.begin, pieces.begin() + r.begin + r.rows);
      mb.padded_len = r.padded_len;
      mb.target_tokens = r.target_tokens;
      mb.cost = cost(mb);
      costs[m] = mb.cost;
      step.target_tokens += mb.target_tokens;
    }
    step.rank_batches = assign_by_cost(costs, world_size);
    std::vector<uint32_t>().swap(cut.steps[s]);
  }
  compute_plan_stats(plan);
  return plan;
}

}  // namespace

EpochPlan build_epoch_plan(const std::vector<uint32_t>& doc_lengths, const std::vector<uint64_t>& docs,
                           const PlanOptions& opts, int world_size, uint64_t epoch) {
  check_options(doc_lengths, docs, opts, world_size);
  const CostModel cost = resolve_cost_model(opts.cost, opts.context);
  if (opts.sampler == "naive") return build_naive_plan(doc_lengths, docs, opts, cost, world_size, epoch);
  return build_balanced_plan(doc_lengths, docs, opts, cost, world_size, epoch);
}

}  // namespace kilter::balance
