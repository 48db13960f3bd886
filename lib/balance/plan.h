// The batch plan (DESIGN.md, "Batch plan"): documents cut to the context, pieces grouped by
// length, micro-batches filled to a token budget, global steps of ~tokens_per_step target tokens
// defined independently of the world size, and micro-batches assigned to ranks by cost.
// Every rank computes the same plan from (index, seed, epoch, options) without communication.
// Owner: balance (issue 4).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kilter::balance {

// A piece of a document: input tokens [start, start+len), `len` targets (see io::PieceRequest).
struct Piece {
  uint64_t doc = 0;
  uint32_t start = 0;
  uint32_t len = 0;
};

struct MicroBatch {
  std::vector<Piece> pieces;  // one row each; rows are padded to padded_len
  uint32_t padded_len = 0;    // T: longest piece of the micro-batch
  uint64_t target_tokens = 0; // sum of piece lengths (real targets)
  double cost = 0;            // cost-model estimate
  uint64_t tokens_computed() const { return uint64_t(pieces.size()) * padded_len; }
};

struct Step {
  std::vector<MicroBatch> micro_batches;          // world-size independent content
  std::vector<std::vector<uint32_t>> rank_batches; // [rank] -> indices into micro_batches
  uint64_t target_tokens = 0;                     // all micro-batches together
};

struct CostModel {
  double a = 1.0;  // per computed token (padding included)
  double b = 0.0;  // per unit of sum(L^2) over pieces (attention)
  double operator()(const MicroBatch& mb) const;
};

struct PlanOptions {
  std::string sampler = "balanced";  // balanced | naive
  uint32_t context = 256;            // model.block_size
  uint64_t max_tokens = 2048;        // micro-batch token budget, padding included
  uint64_t tokens_per_step = 16384;  // target tokens per global step
  uint32_t bucket_width = 0;         // 0: automatic
  int naive_batch_size = 8;          // naive: sequences per rank per micro-batch
  std::string tail = "drop";         // drop | redistribute
  uint64_t seed = 1337;
  CostModel cost;
};

struct PlanStats {
  double padding_efficiency = 0;   // real tokens / computed tokens
  double cost_imbalance_p50 = 0;   // per step: max rank cost / mean rank cost
  double cost_imbalance_p95 = 0;
  double cost_imbalance_max = 0;
  uint64_t steps_per_epoch = 0;
  double micro_batches_per_step = 0;
  uint64_t pieces = 0;
  uint64_t dropped_pieces = 0;     // tail handling
  uint64_t dropped_tokens = 0;
  uint64_t empty_docs = 0;
};

struct EpochPlan {
  uint64_t epoch = 0;
  int world_size = 1;
  std::vector<Step> steps;
  PlanStats stats;
};

// Documents of the training and the held-out split: deterministic from (seed, eval_fraction).
struct Split {
  std::vector<uint64_t> train_docs;
  std::vector<uint64_t> eval_docs;
};
Split split_documents(const std::vector<uint32_t>& doc_lengths, double eval_fraction, uint64_t seed);

// Builds one epoch's plan over `docs` (global ids into doc_lengths).
EpochPlan build_epoch_plan(const std::vector<uint32_t>& doc_lengths,
                           const std::vector<uint64_t>& docs, const PlanOptions& opts,
                           int world_size, uint64_t epoch);

// Position in the plan, saved in checkpoints: training resumes at (epoch, step).
struct PlanPosition {
  uint64_t epoch = 0;
  uint64_t step_in_epoch = 0;
};

}  // namespace kilter::balance
