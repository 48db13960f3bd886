// The batch plan (docs/design.md, "Batch plan"): documents cut to the context, the pieces shuffled
// from (seed, epoch) and cut into global steps of ~tokens_per_step target tokens whose piece sets
// do not depend on the world size; each step's pieces are then divided among the P ranks piece by
// piece by cost, and each rank's share packed into micro-batches of at most max_tokens tokens.
// Every rank computes the same plan from (index, seed, epoch, options, P) without communication.
// Owner: balance (issues 4 and 13).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "lib/model/spec.h"

namespace kilter::balance {

// A piece of a document: input tokens [start, start+len), `len` targets (see io::PieceRequest).
// A PART of a cut piece is a Piece too: `offset` is how many tokens of its piece come
// before it (its positions start there; the piece itself starts at start - offset, a multiple of
// the context). offset == 0 and len == the whole piece: an uncut piece. Parts of one piece lie
// on different ranks of the same step, never two on one rank, and (the deadlock rule) all parts
// of one piece sit at the same local micro-batch index on their ranks, so that ranks running
// their micro-batches in order meet every exchange in the same slot.
struct Piece {
  uint64_t doc = 0;
  uint32_t start = 0;
  uint32_t len = 0;
  uint32_t offset = 0;
  uint32_t piece_start() const { return start - offset; }
};

// A piece of a step cut into parts, as step_cuts() lists it: the parts in token order.
struct CutPart {
  int rank = 0;              // the rank that computes it
  uint32_t micro_batch = 0;  // its local micro-batch index on that rank (the same for every part)
  uint32_t offset = 0;       // tokens of the piece before it
  uint32_t len = 0;
};
struct CutPiece {
  uint64_t doc = 0;
  uint32_t piece_start = 0;       // the piece's first token in its document
  std::vector<CutPart> parts;     // >= 2, offsets increasing, contiguous: parts[i+1].offset = parts[i].offset + parts[i].len
};

// padded_len == 0: a PACKED micro-batch (the balanced plan): the pieces' tokens concatenated,
// N = target_tokens <= data.max_tokens, one segment per piece, no padding.
// padded_len > 0: the NAIVE baseline: every piece is a row of padded_len tokens and the padding
// is computed (in the dense layers and in attention).
struct MicroBatch {
  std::vector<Piece> pieces;  // packed: longest first; naive: one row each
  uint32_t padded_len = 0;    // 0: packed; else the row length T (longest piece)
  uint64_t target_tokens = 0; // sum of piece lengths (real targets)
  double cost = 0;            // cost-model estimate
  bool packed() const { return padded_len == 0; }
  uint64_t tokens_computed() const {
    return packed() ? target_tokens : uint64_t(pieces.size()) * padded_len;
  }
  // The attention work: sum over the segments of e^2 - s^2 for a part [s, e) of its piece (L^2 for
  // an uncut piece), rows x padded_len^2 (naive).
  double attention_work() const;
  // Earlier tokens whose K/V the micro-batch's parts receive (and whose dK/dV they send back):
  // the sum of the parts' offsets (0 for uncut pieces and for the naive plan).
  double kv_tokens() const;
};

// One step as plain vectors: what StepView::expand() returns (tests and tools; the plan itself
// stores steps compactly, see PlanSteps).
struct Step {
  std::vector<MicroBatch> micro_batches;          // rank by rank, each rank's in the order it runs them
  std::vector<std::vector<uint32_t>> rank_batches; // [rank] -> indices into micro_batches
  uint64_t target_tokens = 0;                     // the step's pieces: independent of the world size
};

// cost = a * tokens_computed + b * attention_work + t * kv_tokens + c per micro-batch (all in one
// unit; with a = 1, the unit is one token of the dense layers).
struct CostModel {
  double a = 1.0;  // per computed token (padding included)
  double b = 0.0;  // per unit of attention work (sum of L^2); <= 0: default_attention_cost
  double c = -1.0; // per micro-batch (launches, weight reads); < 0: default_micro_batch_cost
  double t = 0.0;  // per earlier token whose K/V a part receives and whose dK/dV it sends back
  // The full transfer per earlier token, every layer with no overlap (a x kv_link_cost_coefficient);
  // 0 where unknown (data.cost_t given). link_bound_parts counts against it, and with `layers`
  // resolve_cost_model() charges its link-bound share.
  double t_link = 0.0;
  // n_layer where t was derived from the link (data.cost_t not given): resolve_cost_model() then
  // raises t to link_bound_transfer_cost(); 0: t stays as given (a user's or a calibrated t).
  int layers = 0;
  double operator()(const MicroBatch& mb) const;
  // Cost of one piece of `len` tokens inside a packed micro-batch, without the c term.
  double piece(uint32_t len) const { return a * double(len) + b * double(len) * double(len); }
  // Cost of the part [offset, offset + len) of a piece: a len + b (e^2 - s^2) + t s.
  double part(uint32_t offset, uint32_t len) const {
    const double s = double(offset), e = double(offset) + double(len);
    return a * double(len) + b * (e * e - s * s) + t * s;
  }
};

// t from the model shape and the link: what a cut costs the step, in dense tokens per earlier
// token, counting only the transfer the exchange cannot hide (docs/plan.md, "What a part costs").
// A part at offset s receives the K and V of its s earlier tokens in every layer (2 n_embd values
// of kv_value_bytes per token and layer) and sends their gradients back: the full transfer is
// kv_link_cost_coefficient() per earlier token. The exchange runs layer by layer, nonblocking:
// the earlier part's rank posts layer l's K/V as soon as its QKV projection is done and computes
// on. The receiving rank waits for the first layer's K/V once, then runs that much behind the
// sender, and every later layer's K/V arrive while it computes the layer before (the backward
// mirrors it for dK/dV). Where the ranks of a piece run their layers at a like pace (the plan
// evens their loads) and one layer's transfer is shorter than a layer's compute, one layer's
// transfer each way is exposed, not n_layer: t = kv_link_cost_coefficient() / n_layer, what this
// returns. That is the floor: where a layer's transfer outlasts a layer's compute, the link sets
// the pace and resolve_cost_model() raises t to link_bound_transfer_cost().
double transfer_cost_coefficient(const model::ModelSpec& spec, double kv_value_bytes, double link_gbps,
                                 double device_tflops);
// The full transfer, every layer forward and back, with no overlap: 2 model::kv_bytes_per_token
// over a link of link_gbps Gbit/s, over the seconds of one dense token (model::dense_flops_per_token,
// GPT-2: 6 (12 n_layer n_embd^2 + n_embd vocab) FLOPs) at device_tflops. The upper bound on t (a
// one-layer model, or a link so slow that it, not compute, sets each layer's pace).
double kv_link_cost_coefficient(const model::ModelSpec& spec, double kv_value_bytes, double link_gbps,
                                double device_tflops);

// t where the link may set the pace: per direction, forward K/V and backward dK/dV, the
// layer-by-layer pipeline exposes
//   exposed = x + (n_layer - 1) max(x - c, 0)
// with x = one layer's transfer that way for a part at offset s_ref, s_ref t_link / (2 n_layer)
// (half the round trip each way), and c = one layer's compute on the receiving rank that way:
// the forward's third and the backward's two thirds of the rank's load in the step,
// rank_load / (3 n_layer) and 2 rank_load / (3 n_layer). Returns
//   max(t_link / n_layer, (exposed_fwd + exposed_bwd) / s_ref),
// which is t_link / n_layer wherever x <= c both ways (a fast link) and approaches t_link as the
// link outgrows the compute. All in cost units (t_link, rank_load); reference_offset > 0.
double link_bound_transfer_cost(double t_link, int n_layer, double rank_load, double reference_offset);

// b from the model description, the same derivation as the trainer's: FLOPs (forward + backward)
// per unit of sum(L^2) of causal attention (model::attention_flops_per_square, 6 n_layer n_embd),
// over FLOPs per computed token of the dense layers and the LM head
// (model::dense_flops_per_token); for GPT-2 b = n_layer / (12 n_layer n_embd + vocab), for a = 1.
double attention_cost_coefficient(const model::ModelSpec& spec);
// b used when CostModel::b <= 0 and the model shape is unknown: 1 / (6 context), i.e. at full
// context the attention term is 1/6 of the token term, as for GPT-2-like shapes.
double default_attention_cost(uint32_t context);
// c used when CostModel::c < 0: kDefaultMicroBatchTokens x a. A micro-batch streams every weight
// from memory once forward and twice backward whatever its size, which costs as much as the
// FLOPs of (bytes per weight x FLOP rate) / (2 x memory bandwidth) tokens: ~300 tokens for bf16
// on an H100 (989 TFLOP/s, 3.35 TB/s), ~20-40 on a CPU core; kernel launches add to it on GPUs.
// `kilter plan --calibrate` measures it (docs/plan.md).
constexpr double kDefaultMicroBatchTokens = 256;
double default_micro_batch_cost(double a);
// c on a CPU run (plan_options_from_config, where data.cost_c < 0): kCpuMicroBatchTokens x a. On
// a CPU a micro-batch launches nothing, and streaming the weights costs tens of tokens' worth only
// where they do not fit in cache; smaller micro-batches keep their activations in cache, which
// runs faster per token, the other way. Measured on an Intel Xeon with AMX (docs/plan.md, "c on
// this CPU"): about -120 tokens' worth for a 4 x 128 model. 0 is between the two; the in-run fit
// moves it where the run tells it apart.
constexpr double kCpuMicroBatchTokens = 0;
// The cost model a plan uses: b <= 0 replaced by default_attention_cost(), c < 0 by
// default_micro_batch_cost(), and a t derived from the link (layers > 0 and t_link > 0) raised
// to link_bound_transfer_cost() for a typical cut of this step size: a rank's load
// a tokens_per_step / world_size (the mean), a part's offset min(context, tokens_per_step /
// world_size) (a typical prefix: one context at most, one rank's share at one context or less
// per rank). A t given as it is (layers == 0) stays.
CostModel resolve_cost_model(const CostModel& cost, uint32_t context, uint64_t tokens_per_step, int world_size);

struct PlanOptions {
  std::string sampler = "balanced";  // balanced | naive
  uint32_t context = 256;            // model.block_size
  uint64_t max_tokens = 2048;        // micro-batch token budget, padding included
  uint64_t tokens_per_step = 16384;  // target tokens per global step
  int naive_batch_size = 8;          // naive: sequences per rank per micro-batch
  std::string tail = "drop";         // drop | redistribute
  uint64_t seed = 1337;
  CostModel cost;
  // Balanced sampler: cut pieces between ranks where that lowers the busiest rank's cost by more
  // than the cut costs (data.cut_pieces). Pieces longer than max_tokens are cut whatever it says.
  bool cut_pieces = true;
  double kv_bytes_per_token = 0;     // K/V bytes of one token, all layers, one direction (statistics)
  // Balanced sampler: per rank, how long a unit of cost takes there relative to the others (the
  // in-run calibration's speed factors, docs/plan.md "In-run calibration"): the division evens
  // cost x speed, so a slower rank gets less. Empty: every rank 1. Its size is the world size.
  std::vector<double> rank_speed;
  // Shard groups (train.shard = parameters): ranks per group, consecutive ranks; > 1 evens each
  // group's micro-batches slot by slot (group_slots.h: equal counts within a group, each slot even
  // across its ranks). 0 or 1: off, the plan as without shard groups, bit for bit.
  int shard_group = 0;
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
  // Beyond docs/design.md's list:
  uint64_t documents = 0;              // documents given to the plan (empty ones included)
  uint64_t micro_batches = 0;          // in the epoch's steps
  uint64_t target_tokens = 0;          // real target tokens in the epoch's steps
  uint64_t tokens_computed = 0;        // rows x padded_len, summed
  double attention_work = 0;           // sum(len (len + 2 offset)) over the epoch's pieces and parts
  uint64_t tail_pieces = 0;            // pieces of the partial last step (balanced plan)
  uint64_t tail_tokens = 0;            // their target tokens
  bool tail_redistributed = false;     // true: spread over earlier steps; false: dropped
  uint64_t idle_rank_steps = 0;        // (step, rank) pairs where the rank has no micro-batch
  uint64_t steps_with_idle_ranks = 0;  // steps with at least one idle rank
  uint64_t idle_ranks_max = 0;         // most idle ranks in one step
  // Per step: a lower bound on max rank cost / mean rank cost that no division of the step's
  // pieces can beat (the longest piece alone; k+1 of the kP+1 longest on one rank); packed plans
  // only, 0 for the naive one. Where it exceeds 1, the step is too coarse for the world size.
  double cost_imbalance_bound_p50 = 0;
  double cost_imbalance_bound_p95 = 0;
  double micro_batches_per_rank_max = 0;  // most micro-batches one rank runs in one step
  // Sum over steps of the busiest rank's cost / sum of target tokens: the cost of a trained token
  // on the critical path (what the slowest rank makes everyone wait for). naive / balanced of
  // this is the speed-up the plan predicts.
  double critical_cost_per_token = 0;
  // Sum over steps and ranks of (busiest rank's cost - own cost) / sum over steps of P x the
  // busiest rank's cost: the share of rank-time spent waiting at the gradient collective if step
  // times were the costs — what the trainer's sync_wait_fraction would be without noise.
  double cost_wait_fraction = 0;
  double target_tokens_per_step_mean = 0;
  double target_tokens_per_step_min = 0;
  double target_tokens_per_step_max = 0;
  // Cut pieces (context parallelism). A cut is a boundary between two parts of a piece; a piece in k parts
  // has k - 1 cuts. kv bytes count K/V forward and dK/dV backward, each byte once per step; a
  // rank's figure is what it sends plus what it receives in one step.
  double cuts_per_step_p50 = 0;
  double cuts_per_step_max = 0;
  uint64_t cut_pieces = 0;             // pieces in >= 2 parts, over the epoch
  uint64_t cuts = 0;                   // over the epoch
  double kv_bytes_per_step_p50 = 0;
  double kv_bytes_per_step_max = 0;
  double kv_bytes_per_rank_max = 0;    // the most one rank moves in one step
  // The imbalance of each step's whole-piece division, before any cut for balance (long pieces
  // still cut into their chains): what the plan would give with data.cut_pieces = false.
  double cost_imbalance_uncut_p50 = 0;
  double cost_imbalance_uncut_p95 = 0;
  double cost_imbalance_uncut_max = 0;
  uint64_t cut_piece_ranks_max = 0;    // most parts (ranks) one cut piece spans
  // Later parts whose full K/V transfer exceeds their rank's cost in the step (t_link x offset >
  // rank cost): one layer's transfer outlasts a layer's compute there and the link sets the pace.
  // The derived t charges that pace for a typical offset (link_bound_transfer_cost); a part with a
  // longer prefix, or a given t, may be undercounted. 0 where cost.t_link is unknown.
  uint64_t link_bound_parts = 0;
  // Pieces longer than max_tokens (context parallelism): always cut, each over
  // ceil(len / max_tokens) ranks; the most ranks one of them spans (0: none).
  uint64_t long_pieces = 0;
  uint64_t long_piece_ranks_max = 0;
  // Shard groups (PlanOptions::shard_group > 1; all 0 otherwise): per (step, group, slot) the
  // busiest rank's micro-batch cost over the group's mean in that slot; per step the time the
  // per-slot meetings hold (max over groups of the sum over slots of the busiest rank's cost) over
  // the mean rank cost; and (step, group) pairs whose ranks run different micro-batch counts.
  int shard_group = 0;
  double slot_imbalance_p50 = 0;
  double slot_imbalance_p95 = 0;
  double slotted_imbalance_p50 = 0;
  double slotted_imbalance_p95 = 0;
  uint64_t uneven_group_steps = 0;
};

class PlanSteps;

// One step of a plan, read in place (valid while its PlanSteps lives; cheap to copy). A step's
// micro-batches are numbered rank by rank: rank r runs ids [rank_micro_batches(r)) in order.
class StepView {
 public:
  StepView(const PlanSteps& steps, uint64_t index) : steps_(&steps), index_(index) {}
  uint64_t target_tokens() const;
  uint32_t micro_batch_count() const;
  int world_size() const;
  // Rank r's micro-batches: ids [first, second) of this step.
  std::pair<uint32_t, uint32_t> rank_micro_batches(int rank) const;
  // Micro-batch `id` decoded into `out` (its pieces vector reused): pieces, padded_len,
  // target_tokens and cost, as the builder made it.
  void micro_batch(uint32_t id, MicroBatch& out) const;
  MicroBatch micro_batch(uint32_t id) const;
  Step expand() const;

 private:
  const PlanSteps* steps_;
  uint64_t index_;
};

// The steps of an epoch plan, stored flat so that a plan for millions of documents and a
// thousand ranks stays small (docs/plan.md, "Memory"): one array of pieces (8 bytes each) in
// step, rank, micro-batch order; per micro-batch only the end of its pieces, per (step, rank)
// only the end of its micro-batches, both as 32-bit offsets into the step; per step its first
// piece, first micro-batch and target tokens. What follows from the pieces (a micro-batch's
// tokens, padded length and cost) is recomputed when read. The later parts of cut pieces
// (offset > 0) add 8 bytes each to a side table (their index in the step and their offset); a
// first part (offset 0) is stored like an uncut piece of its length.
class PlanSteps {
 public:
  // context: every piece starts at a multiple of it and is at most that long (cut_documents); a
  // part lies inside such a piece;
  // padded: naive micro-batches (rows padded to the longest piece) instead of packed ones.
  PlanSteps(uint32_t context = 1, int world_size = 1, bool padded = false, CostModel cost = {});

  uint64_t size() const { return step_target_tokens_.size(); }
  bool empty() const { return size() == 0; }
  StepView operator[](uint64_t s) const { return StepView(*this, s); }
  int world_size() const { return world_size_; }
  bool padded() const { return padded_; }
  const CostModel& cost() const { return cost_; }

  // Building, step by step: pieces of a micro-batch, then end_micro_batch(); end_rank() after
  // each rank's micro-batches (every rank, idle ones too); end_step() after the last rank.
  // reserve() with the final counts keeps every array at its size (shrink_to_fit() otherwise).
  void reserve(uint64_t steps, uint64_t pieces, uint64_t micro_batches);
  void add_piece(const Piece& piece);
  void end_micro_batch();
  void end_rank();
  void end_step(uint64_t target_tokens);
  void shrink_to_fit();

  // Bytes the arrays hold (capacity, not size).
  uint64_t heap_bytes() const;
  // Whether step s holds a later part of a cut piece (else step_cuts() of it is empty).
  bool step_has_parts(uint64_t s) const { return step_part_end_.at(s) > step_part_begin(s); }

 private:
  friend class StepView;
  // A piece as stored: its document and its last token's position. Pieces start at multiples
  // of the context and are 1..context long, so start = last - last % context and
  // len = last % context + 1.
  struct StoredPiece {
    uint32_t doc;
    uint32_t last;
  };
  // offset: the part's offset from the side table (0: an uncut piece or a first part).
  Piece piece(uint64_t i, uint32_t offset = 0) const {
    const StoredPiece& p = pieces_[i];
    const uint32_t end = p.last % context_ + 1;  // the part's end within its piece
    const uint32_t piece_start = p.last - (end - 1);
    return Piece{p.doc, piece_start + offset, end - offset, offset};
  }
  // A later part: its piece's index within the step and its offset.
  struct StoredPart {
    uint32_t index;
    uint32_t offset;
  };
  uint64_t step_piece_begin(uint64_t s) const { return s == 0 ? 0 : step_piece_end_[s - 1]; }
  uint64_t step_part_begin(uint64_t s) const { return s == 0 ? 0 : step_part_end_[s - 1]; }
  uint64_t step_mb_begin(uint64_t s) const { return s == 0 ? 0 : step_mb_end_[s - 1]; }

  uint32_t context_;
  int world_size_;
  bool padded_;
  CostModel cost_;
  std::vector<StoredPiece> pieces_;
  std::vector<uint32_t> mb_piece_end_;     // per micro-batch: end of its pieces, from its step's first
  std::vector<uint32_t> rank_mb_end_;      // per (step, rank): end of the rank's micro-batches, from the step's first
  std::vector<uint64_t> step_piece_end_;   // per step: end of its pieces in pieces_
  std::vector<uint64_t> step_mb_end_;      // per step: end of its micro-batches in mb_piece_end_
  std::vector<uint64_t> step_target_tokens_;
  std::vector<StoredPart> parts_;          // later parts, step by step, by index
  std::vector<uint64_t> step_part_end_;    // per step: end of its later parts in parts_
  // While building the current step.
  uint64_t building_pieces_ = 0, building_mbs_ = 0;
  int building_ranks_ = 0;
};

struct EpochPlan {
  uint64_t epoch = 0;
  int world_size = 1;
  PlanSteps steps;
  PlanStats stats;
  CostModel cost;  // the resolved cost model the micro-batch costs are computed with
  std::vector<double> rank_speed;  // PlanOptions::rank_speed (empty: equal); statistics weigh rank costs by it
  double kv_bytes_per_token = 0;  // PlanOptions::kv_bytes_per_token (statistics)
  // Per step: max / mean rank cost of the whole-piece division before the cuts for balance
  // (empty: no such figure, e.g. the naive plan).
  std::vector<double> uncut_imbalance;
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

// Ranks a piece of `longest_piece` tokens spans when micro-batches hold max_tokens (>= 1): the
// smallest world size that can train it.
uint64_t long_piece_ranks(uint32_t longest_piece, uint64_t max_tokens);

// Pieces longer than data.max_tokens (context parallelism) in a plan of `world_size` ranks:
// stats.long_pieces = long_pieces and stats.long_piece_ranks_max = long_piece_ranks(longest);
// throws a user error naming the ranks needed where the world size cannot hold the longest piece.
// Every plan builder calls it before it divides a step.
void account_long_pieces(uint32_t longest_piece, uint64_t long_pieces, const PlanOptions& opts, int world_size,
                         PlanStats& stats);

// One line for the user when tokens_per_step / world_size is below one context (balanced
// sampler without cut_pieces): a rank given a full-length piece then holds more than its share
// while others idle or wait. Says which step size (or world size) avoids it; "" when the step is
// large enough or pieces may be cut.
std::string idle_rank_warning(const PlanOptions& opts, int world_size);

// The options' errors, each naming its config key (model.block_size > data.max_tokens, a zero
// train.tokens_per_step, ...); build_epoch_plan() calls it. Throws kilter::Error.
void check_plan_options(const PlanOptions& opts, int world_size);

// Position in the plan, saved in checkpoints: training resumes at (epoch, step).
struct PlanPosition {
  uint64_t epoch = 0;
  uint64_t step_in_epoch = 0;
};

// ---- helpers beyond the core interface ------------------------------------------------------

// Cuts documents into pieces of at most `context` tokens covering [0, n) in document order;
// empty documents give no piece and are counted in *empty_docs (when given).
std::vector<Piece> cut_documents(const std::vector<uint32_t>& doc_lengths,
                                 const std::vector<uint64_t>& docs, uint32_t context,
                                 uint64_t* empty_docs = nullptr);

// A plan with no steps yet: epoch, world size, cost model, the steps' storage for `context` and
// `padded` (naive) micro-batches and stats.documents filled in (the common start of every planner).
EpochPlan start_plan(const std::vector<uint64_t>& docs, const CostModel& cost, int world_size, uint64_t epoch,
                     uint32_t context, bool padded);

// All document ids 0..n-1 (the whole corpus as one split).
std::vector<uint64_t> all_documents(size_t num_docs);

// The position after `pos` in a plan whose epoch pos.epoch has `steps_in_epoch` steps: the
// next step, or step 0 of the next epoch.
PlanPosition next_position(PlanPosition pos, uint64_t steps_in_epoch);

// The cut pieces of one step (lib/balance/cuts.cpp): every piece that has parts on several ranks,
// ordered by (doc, piece_start). Throws kilter::Error where the step breaks the rules above
// (parts not contiguous, two parts on one rank, parts at different local micro-batch indices).
std::vector<CutPiece> step_cuts(const Step& step);
std::vector<CutPiece> step_cuts(const StepView& step);

// Per-rank cost of one step (sum of its micro-batches' costs).
std::vector<double> rank_costs(const StepView& step);
std::vector<double> rank_costs(const Step& step);

// A lower bound on the busiest rank's cost in any division of a step's pieces among `world`
// ranks: the largest of these, each true of every division (c added: a rank with pieces runs a
// micro-batch). `piece_costs` is used as scratch (sorted, then summed in place). With w_0 >= w_1 >= ...:
// - k of the kP+1 longest: for every k with kP < n, some rank holds k+1 of the kP+1 longest
//   pieces, so it costs at least w_{kP} + ... + w_{kP-k} (k = 0: the longest piece alone).
// - Pairs among the P+q longest (1 <= q <= min(P, n-P, 64)): for i = 1..q, take T, the P+q+1-i
//   longest, and its top part, the P-q+i longest. Either some rank holds a top piece and another
//   piece of T, and costs at least w_{P-q+i-1} + w_{P+q-i}; or every top piece is alone among T on
//   its own rank, and the other 2q+1-2i pieces of T lie on the q-i remaining ranks: then (i < q)
//   one of those holds three, at least the three shortest of T. (i = q: no rank remains, so the
//   first case holds.) This sees steps where a few more pieces than ranks must pair up.
double least_busiest_cost(std::vector<double>& piece_costs, size_t world, double c);

// Recomputes plan.stats' cost, padding, idle and token figures from plan.steps (the builders
// call it; the counts of pieces, dropped, empty and tail figures are the builder's). Where the
// plan has rank speeds, the imbalance and wait figures are of the ranks' times (cost x speed, the
// mean being the balanced level), which is what the division evened.
void compute_plan_stats(EpochPlan& plan);

// Per step: max node cost / mean node cost with `ranks_per_node` consecutive ranks per node;
// returns the given quantile (0.5, 0.95, 1.0) over the steps. 1.0 for a single node.
double node_cost_imbalance(const EpochPlan& plan, int ranks_per_node, double quantile);

// A 64-bit fingerprint of the plan's content and assignment: ranks compare it (one allreduce
// of min and max) to prove they planned the same epoch.
uint64_t plan_fingerprint(const EpochPlan& plan);

// Nearest-rank quantile of `values` (copied and sorted); 0 for an empty vector.
double quantile_of(std::vector<double> values, double q);

}  // namespace kilter::balance
