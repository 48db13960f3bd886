// Weighted mixtures of datasets (see mixture.h).
#include "lib/balance/mixture.h"

#include <algorithm>
#include <cmath>

#include "io/base/error.h"
#include "lib/balance/divide.h"
#include "lib/balance/group_slots.h"
#include "lib/balance/rng.h"

namespace kilter::balance {

MixturePlanner::MixturePlanner(const std::vector<uint32_t>& doc_lengths, std::vector<MixtureSource> sources,
                               PlanOptions opts)
    : doc_lengths_(doc_lengths), sources_(std::move(sources)), opts_(std::move(opts)) {
  KILTER_CHECK(!sources_.empty(), "data.sources: no source");
  uint64_t total = 0;
  for (const MixtureSource& s : sources_) {
    uint64_t tokens = 0;
    for (uint64_t doc : s.docs) tokens += doc_lengths_.at(doc);
    KILTER_CHECK(tokens > 0, "data.sources: " << s.name << " has no tokens to train on (in the training split)");
    total += tokens;
  }
  steps_per_epoch_ = std::max<uint64_t>(1, uint64_t(std::llround(double(total) / double(opts_.tokens_per_step))));
  order_.resize(sources_.size());
  order_epoch_.assign(sources_.size(), UINT64_MAX);
  epoch_start_[0] = std::vector<Stream>(sources_.size());
}

std::vector<Piece> MixturePlanner::shuffled(size_t source, uint64_t source_epoch) const {
  std::vector<Piece> pieces = cut_documents(doc_lengths_, sources_[source].docs, opts_.context);
  // Each source has its own stream of shuffles: (seed, source) mixed, then the source's epoch.
  Xoshiro256 rng(mix64(opts_.seed ^ mix64(0x5EED50C0ull + source)), source_epoch, RngStream::kPieceOrder);
  fisher_yates(pieces.data(), pieces.size(), rng);
  return pieces;
}

void MixturePlanner::draw(std::vector<Stream>& streams, uint64_t first, uint64_t count,
                          std::vector<std::vector<Piece>>* step_pieces, std::vector<SourceWrap>* wraps) {
  const double per_step = double(opts_.tokens_per_step);
  for (uint64_t g = first; g < first + count; ++g) {
    std::vector<Piece>* out = nullptr;
    if (step_pieces) {
      step_pieces->emplace_back();
      out = &step_pieces->back();
    }
    uint64_t taken_this_step = 0;
    for (size_t k = 0; k < sources_.size(); ++k) {
      Stream& st = streams[k];
      const uint64_t target = uint64_t(std::llround(sources_[k].weight * per_step * double(g + 1)));
      while (true) {
        if (order_epoch_[k] != st.source_epoch) {
          order_[k] = shuffled(k, st.source_epoch);
          order_epoch_[k] = st.source_epoch;
        }
        const Piece& piece = order_[k][st.next];
        const uint64_t t = piece.len;
        // Stop before this piece when the source has its share or taking it would land farther
        // from the share than stopping short (the rule that cuts a plan's steps).
        if (st.tokens_taken >= target || 2 * st.tokens_taken + t > 2 * target) break;
        if (out) out->push_back(piece);
        st.tokens_taken += t;
        taken_this_step += t;
        if (++st.next == order_[k].size()) {
          st.next = 0;
          ++st.source_epoch;
          if (wraps) wraps->push_back({k, st.source_epoch, g});
        }
      }
    }
    KILTER_CHECK(taken_this_step > 0, "data.sources: step " << g << " drew no piece: train.tokens_per_step = "
                                        << opts_.tokens_per_step << " is too small for the weights; raise it");
  }
}

EpochPlan MixturePlanner::build(uint64_t epoch, int world_size, std::vector<SourceWrap>* wraps) {
  check_plan_options(opts_, world_size);
  // The streams at the start of `epoch`: from the latest epoch start known before it.
  auto known = epoch_start_.upper_bound(epoch);
  --known;
  std::vector<Stream> streams = known->second;
  for (uint64_t e = known->first; e < epoch; ++e) {
    draw(streams, e * steps_per_epoch_, steps_per_epoch_, nullptr, nullptr);
    epoch_start_[e + 1] = streams;
  }
  std::vector<std::vector<Piece>> steps;
  draw(streams, epoch * steps_per_epoch_, steps_per_epoch_, &steps, wraps);
  epoch_start_[epoch + 1] = streams;

  std::vector<uint64_t> all_docs;
  for (const MixtureSource& s : sources_) all_docs.insert(all_docs.end(), s.docs.begin(), s.docs.end());
  const CostModel cost = resolve_cost_model(opts_.cost, opts_.context, opts_.tokens_per_step, world_size);
  EpochPlan plan = start_plan(all_docs, cost, world_size, epoch, opts_.context, false);
  uint64_t pieces = 0, long_pieces = 0;
  uint32_t longest = 0;
  for (const auto& step : steps) {
    pieces += step.size();
    for (const Piece& p : step) {
      longest = std::max(longest, p.len);
      long_pieces += p.len > opts_.max_tokens;
    }
  }
  plan.stats.pieces = pieces;
  account_long_pieces(longest, long_pieces, opts_, world_size, plan.stats);
  plan.steps.reserve(steps.size(), pieces, 0);
  // The same division as one dataset's plan: cuts for balance where data.cut_pieces allows them.
  KILTER_CHECK(opts_.rank_speed.empty() || opts_.rank_speed.size() == size_t(world_size),
               "plan: " << opts_.rank_speed.size() << " rank speeds for a world size of " << world_size);
  StepDivision division(cost, opts_, world_size);  // shard groups: slot by slot (group_slots.h)
  plan.rank_speed = opts_.rank_speed;
  plan.kv_bytes_per_token = opts_.kv_bytes_per_token;
  plan.uncut_imbalance.reserve(steps.size());
  for (const auto& step : steps) division.divide(step.data(), step.size(), plan);
  plan.steps.shrink_to_fit();
  compute_plan_stats(plan);
  division.add_stats(plan);
  return plan;
}

std::vector<uint64_t> tokens_by_source(const StepView& step, const std::vector<uint64_t>& doc_begin) {
  std::vector<uint64_t> tokens(doc_begin.size() - 1, 0);
  MicroBatch mb;
  for (uint32_t id = 0; id < step.micro_batch_count(); ++id) {
    step.micro_batch(id, mb);
    for (const Piece& p : mb.pieces) {
      const size_t k = size_t(std::upper_bound(doc_begin.begin(), doc_begin.end(), p.doc) - doc_begin.begin()) - 1;
      tokens[k] += p.len;
    }
  }
  return tokens;
}

}  // namespace kilter::balance
