// Division of one global step's pieces among P ranks by cost, piece by piece, then trades of
// pieces between pairs of ranks that give attention the same share of every rank's time (so the
// division holds when b is off; divide_terms.cpp), then cuts of pieces between ranks where a cut
// lowers the busiest rank's cost by more than it costs, and
// the packing of each rank's share into as few micro-batches of at most max_tokens tokens as it
// can (docs/design.md, "Batch plan"). A piece longer than max_tokens is always cut, one part per rank
// (context parallelism). Ranks may run at different speeds (a throttled GPU, a slower node: the
// in-run calibration measures it, docs/plan.md "In-run calibration"): rank r's load is its cost
// x speed[r], and the division evens the loads, so a slower rank gets proportionally less. A
// pure function of (pieces, cost model, speeds, max_tokens, P, cut_pieces): every rank computes
// the same division. Internal to lib/balance; build_epoch_plan() runs it
// step by step.
#pragma once
#include <cstdint>
#include <algorithm>
#include <map>
#include <memory_resource>
#include <set>
#include <utility>
#include <vector>

#include "lib/balance/plan.h"

namespace kilter::balance {

// The divisions stop once the busiest rank is within this share of the mean load: closer than
// that is below the noise of measured step times and only costs planning time.
constexpr double kGoodEnoughImbalance = 1e-3;

// Divides steps, one after the other, reusing its buffers so that an epoch of thousands of steps
// does not allocate per step beyond the plan's own vectors.
class StepDivider {
 public:
  // `cost` must be resolved (b >= 0, c >= 0, t >= 0). cut_pieces: cut for balance (pieces longer
  // than max_tokens are cut whatever it says; at most world_size parts each). rank_speed: per
  // rank, the time one unit of cost takes there relative to the others (> 0; empty: all 1, the
  // same division as before speeds existed, bit for bit: every load is multiplied by 1.0).
  // even_terms: after the whole-piece division, trade pieces so that attention takes the same share
  // of every rank's time (divide_terms.cpp; false only to compare without it).
  StepDivider(const CostModel& cost, uint64_t max_tokens, int world_size, bool cut_pieces = false,
              const std::vector<double>& rank_speed = {}, bool even_terms = true);

  // Divides pieces[0, n) (one step, any order, uncut) and appends the step to `out`: rank by
  // rank, each rank's micro-batches; the parts of cut pieces first, in the micro-batch (slot) their
  // piece's parts share on every rank, then the uncut pieces longest first. `out` must be for this
  // world size.
  void divide(const Piece* pieces, size_t n, PlanSteps& out);

  // The last step's busiest rank over its mean cost before the cuts for balance (packed).
  double uncut_imbalance() const { return uncut_imbalance_; }

  // The micro-batches a rank holding `tokens` tokens needs at the least: ceil(tokens / max_tokens).
  uint64_t min_micro_batches(uint64_t tokens) const { return (tokens + max_tokens_ - 1) / max_tokens_; }

 private:
  // A part of a cut piece on a rank: [offset, offset + len) of step piece `item`, in the rank's
  // micro-batch `slot` (the same on every rank holding a part of that piece).
  struct Part {
    uint32_t item;
    uint32_t offset;
    uint32_t len;
    uint32_t slot;
  };
  // A rank's share while dividing: its uncut pieces (indices into the step, longest first), its
  // parts, the tokens of parts in each of its first micro-batches (slots 0..m-1: the parts'
  // micro-batches are always a prefix), and the summed cost (pieces and parts) and tokens.
  struct Share {
    std::vector<uint32_t> items;
    std::vector<Part> parts;
    std::vector<uint64_t> slot_tokens;
    double piece_cost = 0;
    uint64_t tokens = 0;
  };
  // While dividing, a share is charged the fewest micro-batches it can pack into (at least its
  // parts' slots); the packed result decides between the initial divisions (packed_busiest_load).
  // load_of() is a share's cost; rank_load() its time on `rank`, the cost x the rank's speed (what
  // the division evens).
  double load_of(double piece_cost, uint64_t tokens, size_t slots) const {
    return piece_cost + cost_.c * double(std::max<uint64_t>(slots, min_micro_batches(tokens)));
  }
  double rank_load(int rank, double piece_cost, uint64_t tokens, size_t slots) const {
    const double cost = load_of(piece_cost, tokens, slots);
    return uniform_speed_ ? cost : speed_[rank] * cost;
  }
  // A rank's cost from its time (load / speed).
  double cost_of_load(int rank, double load) const { return uniform_speed_ ? load : load * inverse_speed_[rank]; }
  double load(int rank) const {
    const Share& s = shares_[rank];
    return rank_load(rank, s.piece_cost, s.tokens, s.slot_tokens.size());
  }
  // The balanced level of a total cost: the time every rank takes when the loads are even,
  // total / sum(1 / speed) (total / P at equal speeds).
  double level_of(double total_cost) const { return total_cost / inverse_speed_sum_; }
  // A change the cut phase weighs: a piece water-filled over a chain of ranks (a new cut when
  // the chain is one rank longer), or an uncut piece moved whole.
  struct Cut {
    double score = 0;        // max(the changed ranks' loads, the mean): lower is better
    bool move = false;       // move: the busiest share's item `index` to `partner`
    int partner = -1;
    size_t index = 0;
    uint32_t item = 0;       // chain: the piece, its slot, its ranks in token order, their parts' ends
    uint32_t slot = 0;
    std::vector<int> ranks;
    std::vector<uint32_t> ends;
    int new_cuts = 0;
  };
  // The term phase (divide_terms.cpp): a pair of ranks, h the one whose time holds more attention.
  struct TermSums {
    double cost = 0, attn = 0, tokens = 0;
  };
  struct TermPair {
    int h = -1, t = -1;
    size_t bins_h = 0, bins_t = 0;  // micro-batches each share packs into
    double attn_h = 0, attn_t = 0;  // sum of L^2 (parts: e^2 - s^2)
    double speed_h = 1, speed_t = 1;
    double top = 0;                 // the load neither may exceed
    std::vector<TermSums> prefix;   // over t's items, longest first
    double gap(double dq) const;    // |speed_h (attn_h - dq) - speed_t (attn_t + dq)|
    void window(double w_x, const Share& sh, const Share& st, double c, double& w_lo, double& w_hi) const;
  };
  // h gives its item xi and takes t's items [begin, end) and `extra` (-1: none); xi == SIZE_MAX:
  // none found.
  struct TermExchange {
    double gap = 0;
    size_t xi = SIZE_MAX;
    long begin = 0, end = 0;
    long extra = -1;
  };
  double squared_len(uint32_t item) const;  // a step piece's attention work, L^2
  double attention_of(const Share& share) const;
  void term_pair(int a, int b, double ceiling, TermPair& p);
  void move_items(int from, int to, const std::vector<uint32_t>& items);
  void try_exchange(const TermPair& p, const TermExchange& ex, TermExchange& best) const;
  void scan_pairs(const TermPair& p, size_t xi, long first, TermExchange& best) const;
  void scan_runs(const TermPair& p, size_t xi, TermExchange& best) const;
  TermExchange best_exchange(const TermPair& p, const std::vector<uint32_t>& banned) const;
  bool even_pair(int a, int b, double ceiling);
  void even_terms();
  void build_chains(const std::vector<uint32_t>& long_items);
  static const Part* find_part(const Share& share, uint32_t item);
  uint32_t largest_end(uint32_t offset, double budget) const;
  // speed and inverse: per holder, or null at equal speeds.
  bool water_fill(uint32_t len, const std::vector<double>& base, const double* speed, const double* inverse,
                  const std::vector<uint64_t>& room, double ceiling, std::vector<uint32_t>& ends) const;
  bool split_two(uint32_t len, double base0, double base1, double speed0, double speed1, uint64_t room0,
                 uint64_t room1, double ceiling, uint32_t& e_out) const;
  void try_chain(uint32_t item, uint32_t slot, const std::vector<int>& ranks, int new_cuts, double mean,
                 Cut& best) const;
  void apply_cut(int busiest, const Cut& cut);
  void cut_for_balance();
  void reset_shares();
  double busiest_load() const;
  void longest_first();
  void best_fit(double capacity);
  double refine();
  bool improve_busiest();
  void insert_sorted(std::vector<uint32_t>& items, uint32_t item) const;
  void move_item(Share& from, Share& to, uint32_t item) const;  // with its cost and tokens
  void first_fit(const Share& share);
  size_t assign_bins(int rank);  // fills bin_of_, bin_tokens_; returns the micro-batches
  double packed_busiest_load();
  void pack(int rank, PlanSteps& out);

  CostModel cost_;
  uint64_t max_tokens_;
  int world_size_;
  bool cut_pieces_;
  bool even_terms_;
  std::vector<double> speed_;       // per rank (1 where not given)
  std::vector<double> inverse_speed_;
  bool uniform_speed_ = true;       // every rank 1: the arithmetic of equal speeds, no multiplications
  double inverse_speed_sum_ = 1.0;  // sum(1 / speed): P at equal speeds
  double min_speed_ = 1.0;
  double uncut_imbalance_ = 1.0;
  uint64_t balance_cuts_ = 0;
  std::vector<Share> base_shares_;    // the chains of long pieces, before any uncut piece
  bool has_chains_ = false;
  std::map<uint32_t, std::vector<int>> holders_;  // cut item -> ranks holding its parts, in token order
  mutable std::vector<double> base_scratch_, speed_scratch_, inverse_scratch_;
  mutable std::vector<uint64_t> room_scratch_;
  mutable std::vector<uint32_t> ends_scratch_, fill_scratch_;
  double tolerance_ = 0;
  double least_busiest_ = 0;  // the current step's lower bound on the busiest rank's load
  // Scratch of the current step.
  const Piece* pieces_ = nullptr;
  std::vector<uint64_t> order_;       // (context - len) << 32 | index: longest first, then by index
  std::vector<double> piece_cost_;    // per step piece
  std::vector<double> prefix_cost_;   // prefix sums of piece costs, longest first
  std::vector<Share> shares_;         // per rank
  std::vector<Share> best_shares_;    // the best division so far, while candidates are compared
  // (load, rank), ascending; its nodes come from a pool kept across steps (no malloc per update).
  std::pmr::unsynchronized_pool_resource node_pool_;
  std::pmr::set<std::pair<double, int>> by_load_{&node_pool_};
  std::vector<std::pair<double, int>> heap_;  // LPT min-heap of (load, rank)
  std::vector<uint32_t> bin_of_;      // packing: micro-batch of each of a rank's items
  std::vector<uint64_t> bin_tokens_;  // packing: tokens per micro-batch
  std::vector<uint32_t> by_bin_;      // packing: a rank's items grouped by micro-batch
  TermPair term_scratch_;             // the term phase's buffers
  std::vector<uint32_t> term_banned_, term_give_, term_take_;
};

}  // namespace kilter::balance
