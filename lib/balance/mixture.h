// Weighted mixtures of datasets (`data.sources = A:0.7, B:0.2, C:0.1`): how global
// steps are drawn from several sources. The sources' documents have global ids in one merged
// index (io/mixture_index.h), so a mixture step is an ordinary list of pieces that the plan's
// divider splits among ranks and packs exactly as for one dataset (balance, packing and world-size
// invariance unchanged).
//
// The draw: every source is an endless stream of its pieces, shuffled from (seed, source, the
// source's own epoch); a source that runs out wraps into its next epoch on its own. Global step g
// takes from source k the next pieces of its stream until k's tokens since the start of training
// are nearest round(w_k x tokens_per_step x (g+1)) (the plan's rule for cutting steps), so every
// step holds about tokens_per_step tokens and the shares converge to the weights. It depends on
// the seed and the weights only, never on the world size. A mixture epoch is round(all sources'
// tokens / tokens_per_step) steps (what one merged dataset would give).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "lib/balance/plan.h"

namespace kilter::balance {

struct MixtureSource {
  std::string name;            // its directory, for messages
  double weight = 0;           // normalized: the weights sum to 1
  std::vector<uint64_t> docs;  // its documents in this split, global ids
};

// A source that ran out in global step `step` (0-based) and continues with its epoch
// `source_epoch` (0-based; >= 1).
struct SourceWrap {
  size_t source = 0;
  uint64_t source_epoch = 0;
  uint64_t step = 0;
};

class MixturePlanner {
 public:
  MixturePlanner(const std::vector<uint32_t>& doc_lengths, std::vector<MixtureSource> sources, PlanOptions opts);
  uint64_t steps_per_epoch() const { return steps_per_epoch_; }
  const std::vector<MixtureSource>& sources() const { return sources_; }
  // The plan of mixture epoch `epoch` for `world_size` ranks; `wraps` (when given) gets the
  // sources that wrap in it. Deterministic: the same for every call and every world size.
  EpochPlan build(uint64_t epoch, int world_size, std::vector<SourceWrap>* wraps = nullptr);
  const PlanOptions& options() const { return opts_; }
  // The cost model and rank speeds of the plans built from now on (a measured transfer charge, the
  // in-run calibration): the steps and their tokens stay the same, only their division among the
  // ranks follows them.
  void set_cost(const CostModel& cost) { opts_.cost = cost; }
  void set_rank_speed(std::vector<double> rank_speed) { opts_.rank_speed = std::move(rank_speed); }

 private:
  struct Stream {
    uint64_t source_epoch = 0;
    uint64_t next = 0;          // index into the source epoch's shuffled pieces
    uint64_t tokens_taken = 0;  // since the start of training
  };
  std::vector<Piece> shuffled(size_t source, uint64_t source_epoch) const;
  // Runs the draw for steps [first, first + count) from `streams`; appends each step's pieces to
  // `step_pieces` (when given, one vector per step) and the wraps to `wraps`.
  void draw(std::vector<Stream>& streams, uint64_t first, uint64_t count,
            std::vector<std::vector<Piece>>* step_pieces, std::vector<SourceWrap>* wraps);

  const std::vector<uint32_t>& doc_lengths_;
  std::vector<MixtureSource> sources_;
  PlanOptions opts_;
  uint64_t steps_per_epoch_ = 1;
  std::map<uint64_t, std::vector<Stream>> epoch_start_;  // stream states at the start of epochs drawn so far
  // The current shuffled order per source (regenerated when a source wraps).
  std::vector<std::vector<Piece>> order_;
  std::vector<uint64_t> order_epoch_;
};

// Target tokens of `step` per source, sources given by their first global document id (plus the
// end).
std::vector<uint64_t> tokens_by_source(const StepView& step, const std::vector<uint64_t>& doc_begin);

}  // namespace kilter::balance
