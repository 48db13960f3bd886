// Division of a step's pieces among ranks (see divide.h). Longest-first to the least-loaded rank
// (LPT) leaves the busiest rank at most one piece above the mean, which is tight when a rank's
// share holds many pieces; when it holds only a few (64-1024 ranks), best fit against the mean
// share does better, and moves and swaps of single pieces between the busiest rank and the
// least-loaded ones close most of what either leaves. The candidates are compared once packed;
// the search stops at the step's lower bound. The c-per-micro-batch term enters every load as
// c x ceil(tokens / max_tokens), so a rank whose share needs one more micro-batch is charged
// for it while dividing.
// The cut phase and the chains of pieces longer than max_tokens are in divide_cuts.cpp.
#include "lib/balance/divide.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <iterator>
#include <utility>

#include "io/base/error.h"

namespace kilter::balance {

namespace {

// Capacities (x the mean share) best fit runs with, after LPT: the first always, the others
// only while the best division so far leaves the busiest rank more than kRetryImbalance above
// the mean (each costs about as much as LPT, and where the first two got that close the others
// rarely gain).
constexpr double kBestFitCapacities[] = {1.0, 1.003, 1.01, 1.03};
constexpr double kRetryImbalance = 5e-3;
// Ranks compared with the busiest one in each improvement round: the least-loaded few are where
// a move or swap helps most.
constexpr int kSwapPartners = 8;

}  // namespace

StepDivider::StepDivider(const CostModel& cost, uint64_t max_tokens, int world_size, bool cut_pieces,
                         const std::vector<double>& rank_speed, bool even_terms)
    : cost_(cost), max_tokens_(max_tokens), world_size_(world_size), cut_pieces_(cut_pieces), even_terms_(even_terms) {
  KILTER_CHECK(world_size >= 1, "StepDivider: world size " << world_size << " must be >= 1");
  KILTER_CHECK(max_tokens >= 1, "StepDivider: max_tokens must be >= 1");
  KILTER_CHECK(cost.a >= 0 && cost.b >= 0 && cost.c >= 0 && cost.t >= 0,
               "StepDivider: unresolved cost model a=" << cost.a << " b=" << cost.b << " c=" << cost.c
               << " t=" << cost.t);
  KILTER_CHECK(rank_speed.empty() || rank_speed.size() == size_t(world_size),
               "StepDivider: " << rank_speed.size() << " rank speeds for " << world_size << " ranks");
  speed_.assign(size_t(world_size), 1.0);
  inverse_speed_.assign(size_t(world_size), 1.0);
  inverse_speed_sum_ = 0;
  for (int r = 0; r < world_size; ++r) {
    if (!rank_speed.empty()) speed_[r] = rank_speed[r];
    KILTER_CHECK(speed_[r] > 0 && std::isfinite(speed_[r]), "StepDivider: rank " << r << " speed " << speed_[r]);
    inverse_speed_[r] = 1.0 / speed_[r];
    inverse_speed_sum_ += inverse_speed_[r];
    uniform_speed_ = uniform_speed_ && speed_[r] == 1.0;
  }
  min_speed_ = *std::min_element(speed_.begin(), speed_.end());
  shares_.resize(world_size);
  base_shares_.resize(world_size);
}

void StepDivider::insert_sorted(std::vector<uint32_t>& items, uint32_t item) const {
  // Longest first, then by index: the same order LPT builds.
  const auto before = [this](uint32_t x, uint32_t y) {
    return pieces_[x].len > pieces_[y].len || (pieces_[x].len == pieces_[y].len && x < y);
  };
  items.insert(std::upper_bound(items.begin(), items.end(), item, before), item);
}

void StepDivider::move_item(Share& from, Share& to, uint32_t item) const {
  from.items.erase(std::find(from.items.begin(), from.items.end(), item));
  from.piece_cost -= piece_cost_[item];
  from.tokens -= pieces_[item].len;
  to.piece_cost += piece_cost_[item];
  to.tokens += pieces_[item].len;
  insert_sorted(to.items, item);
}

void StepDivider::reset_shares() {
  for (int r = 0; r < world_size_; ++r) {
    Share& share = shares_[r];
    share.items.clear();
    if (has_chains_) {
      const Share& base = base_shares_[r];
      share.parts = base.parts;
      share.slot_tokens = base.slot_tokens;
      share.piece_cost = base.piece_cost;
      share.tokens = base.tokens;
    } else {
      share.parts.clear();
      share.slot_tokens.clear();
      share.piece_cost = 0;
      share.tokens = 0;
    }
  }
}

double StepDivider::busiest_load() const {
  double top = 0;
  for (int r = 0; r < world_size_; ++r) top = std::max(top, load(r));
  return top;
}

// Best fit decreasing against the mean load: each piece, longest first, goes to the busiest rank
// it still fits under `capacity`, else to the least-loaded one. Where shares hold only a few
// pieces it fills ranks to the mean with a long piece plus the right shorter ones, which LPT (a
// long piece to every rank first, then the rest) often misses.
void StepDivider::best_fit(double capacity) {
  by_load_.clear();
  for (int r = 0; r < world_size_; ++r) by_load_.insert({load(r), r});  // 0 but for chains
  for (uint64_t key : order_) {
    const uint32_t item = uint32_t(key);
    const uint32_t len = pieces_[item].len;
    const double w = piece_cost_[item];
    // The busiest rank whose load stays <= capacity with this piece (the c term can add one
    // micro-batch, and a slower rank's load grows by more than w: look back over a few
    // candidates for the exact check).
    auto it = by_load_.upper_bound({capacity - w * min_speed_, world_size_});
    int rank = -1;
    for (int tries = 0; tries < 4 && it != by_load_.begin(); ++tries) {
      --it;
      const Share& s = shares_[it->second];
      if (rank_load(it->second, s.piece_cost + w, s.tokens + len, s.slot_tokens.size()) <= capacity) {
        rank = it->second;
        break;
      }
    }
    if (rank < 0) it = by_load_.begin(), rank = it->second;
    by_load_.erase(it);
    Share& share = shares_[rank];
    share.items.push_back(item);
    share.piece_cost += w;
    share.tokens += len;
    by_load_.insert({load(rank), rank});
  }
}

void StepDivider::longest_first() {
  heap_.clear();
  for (int r = 0; r < world_size_; ++r) heap_.push_back({load(r), r});  // 0 but for chains
  // A min-heap of (load, rank): ties go to the lower rank.
  const std::greater<std::pair<double, int>> later;
  std::make_heap(heap_.begin(), heap_.end(), later);
  for (uint64_t key : order_) {
    const uint32_t item = uint32_t(key);
    std::pop_heap(heap_.begin(), heap_.end(), later);
    const int rank = heap_.back().second;
    Share& share = shares_[rank];
    share.items.push_back(item);  // items arrive longest first
    share.piece_cost += piece_cost_[item];
    share.tokens += pieces_[item].len;
    heap_.back().first = load(rank);
    std::push_heap(heap_.begin(), heap_.end(), later);
  }
}

// One round: the single move or swap between the busiest rank and one of the least-loaded ranks
// that lowers the larger of the two loads the most. Returns false when none does.
bool StepDivider::improve_busiest() {
  const auto top_entry = std::prev(by_load_.end());
  const double top = top_entry->first;
  const int busiest = top_entry->second;
  Share& mine = shares_[busiest];
  double best_pair_max = top - tolerance_;
  int best_partner = -1;
  size_t best_x = 0;
  long best_y = -1;  // -1: a move, else the index of the partner's item to swap in

  int examined = 0;
  for (auto it = by_load_.begin(); it != top_entry && examined < kSwapPartners; ++it, ++examined) {
    const int partner = it->second;
    const double gap = top - it->first;
    if (gap <= tolerance_) break;  // the rest are as busy
    const Share& theirs = shares_[partner];
    for (size_t xi = 0; xi < mine.items.size(); ++xi) {
      const uint32_t x = mine.items[xi];
      const uint32_t len_x = pieces_[x].len;
      if (xi > 0 && pieces_[mine.items[xi - 1]].len == len_x) continue;  // same piece cost
      const double w_x = piece_cost_[x];
      // Move x.
      {
        const double pair_max =
            std::max(rank_load(busiest, mine.piece_cost - w_x, mine.tokens - len_x, mine.slot_tokens.size()),
                     rank_load(partner, theirs.piece_cost + w_x, theirs.tokens + len_x, theirs.slot_tokens.size()));
        if (pair_max < best_pair_max) best_pair_max = pair_max, best_partner = partner, best_x = xi, best_y = -1;
      }
      // Swap x for a shorter y, best near w_y = w_x - gap / (speed of both): the cost whose move
      // evens the two (w_x - gap / 2 at equal speeds); the partner's items are sorted longest
      // first, i.e. by descending cost.
      const double want = w_x - (uniform_speed_ ? gap / 2 : gap / (speed_[busiest] + speed_[partner]));
      const auto first_at_or_below = std::partition_point(
          theirs.items.begin(), theirs.items.end(), [&](uint32_t y) { return piece_cost_[y] > want; });
      const long j = long(first_at_or_below - theirs.items.begin());
      for (long yi = std::max(0L, j - 1); yi <= j && yi < long(theirs.items.size()); ++yi) {
        const uint32_t y = theirs.items[yi];
        const uint32_t len_y = pieces_[y].len;
        if (len_y >= len_x) continue;
        const double d = w_x - piece_cost_[y];
        const double pair_max =
            std::max(rank_load(busiest, mine.piece_cost - d, mine.tokens - (len_x - len_y), mine.slot_tokens.size()),
                     rank_load(partner, theirs.piece_cost + d, theirs.tokens + (len_x - len_y), theirs.slot_tokens.size()));
        if (pair_max < best_pair_max) best_pair_max = pair_max, best_partner = partner, best_x = xi, best_y = yi;
      }
    }
  }
  if (best_partner < 0) return false;

  Share& theirs = shares_[best_partner];
  by_load_.erase(top_entry);
  by_load_.erase({load(best_partner), best_partner});
  const uint32_t x = mine.items[best_x], y = best_y >= 0 ? theirs.items[best_y] : 0;  // y: read before x moves in
  move_item(mine, theirs, x);
  if (best_y >= 0) move_item(theirs, mine, y);
  by_load_.insert({load(busiest), busiest});
  by_load_.insert({load(best_partner), best_partner});
  return true;
}

// The share's items, longest first, each into the first micro-batch of bin_tokens_ with room,
// else a new one (first fit decreasing).
void StepDivider::first_fit(const Share& share) {
  for (size_t i = 0; i < share.items.size(); ++i) {
    const uint32_t len = pieces_[share.items[i]].len;
    size_t b = 0;
    while (b < bin_tokens_.size() && bin_tokens_[b] + len > max_tokens_) ++b;
    if (b == bin_tokens_.size()) bin_tokens_.push_back(0);
    bin_tokens_[b] += len;
    bin_of_[i] = uint32_t(b);
  }
}

size_t StepDivider::assign_bins(int rank) {
  const Share& share = shares_[rank];
  const size_t n = share.items.size();
  bin_of_.assign(n, 0);
  bin_tokens_.clear();
  if (!share.slot_tokens.empty()) {
    // The parts' slots come first; the pieces go first fit into what they leave, then into new
    // micro-batches.
    bin_tokens_.assign(share.slot_tokens.begin(), share.slot_tokens.end());
    first_fit(share);
    return bin_tokens_.size();
  }
  if (n == 0) return 0;
  const uint64_t fewest = min_micro_batches(share.tokens);
  if (fewest <= 1) {
    bin_tokens_.push_back(share.tokens);
  } else {
    // Next fit over the longest-first order keeps pieces of similar length together; when that
    // needs more micro-batches than the fewest possible, first fit decreasing fills the gaps.
    for (size_t i = 0; i < n; ++i) {
      const uint32_t len = pieces_[share.items[i]].len;
      if (bin_tokens_.empty() || bin_tokens_.back() + len > max_tokens_) bin_tokens_.push_back(0);
      bin_tokens_.back() += len;
      bin_of_[i] = uint32_t(bin_tokens_.size() - 1);
    }
    if (bin_tokens_.size() > fewest) {
      bin_tokens_.clear();
      first_fit(share);
    }
  }
  return bin_tokens_.size();
}

double StepDivider::packed_busiest_load() {
  double top = 0;
  for (int r = 0; r < world_size_; ++r)
    top = std::max(top, speed_[r] * (shares_[r].piece_cost + cost_.c * double(assign_bins(r))));
  return top;
}

void StepDivider::pack(int rank, PlanSteps& out) {
  Share& share = shares_[rank];
  const size_t n = share.items.size();
  if (n > 0 || !share.parts.empty()) {
    assign_bins(rank);
    std::sort(share.parts.begin(), share.parts.end(), [](const Part& x, const Part& y) {
      return x.slot < y.slot || (x.slot == y.slot && x.item < y.item);
    });
    size_t part = 0;
    // The pieces micro-batch by micro-batch, each keeping the share's longest-first order: a
    // counting sort of the items by bin.
    std::vector<uint64_t>& next = bin_tokens_;  // reused as each bin's next slot
    std::fill(next.begin(), next.end(), 0);
    for (size_t i = 0; i < n; ++i) ++next[bin_of_[i]];
    uint64_t offset = 0;
    for (uint64_t& slot : next) offset += std::exchange(slot, offset);
    by_bin_.resize(n);
    for (size_t i = 0; i < n; ++i) by_bin_[next[bin_of_[i]]++] = share.items[i];
    size_t i = 0;
    for (size_t bin = 0; bin < next.size(); ++bin) {
      for (; part < share.parts.size() && share.parts[part].slot == bin; ++part) {
        const Part& p = share.parts[part];
        const Piece& whole = pieces_[p.item];
        out.add_piece(Piece{whole.doc, whole.start + p.offset, p.len, p.offset});
      }
      for (; i < next[bin]; ++i) out.add_piece(pieces_[by_bin_[i]]);
      out.end_micro_batch();
    }
  }
  out.end_rank();
}

// Moves and swaps until the busiest rank is at the best any division can reach
// (least_busiest_) or close enough to the mean; each round lowers the busiest load without
// raising another above it, so they end; the cap bounds planning time on adversarial inputs.
// Returns the busiest load.
double StepDivider::refine() {
  const size_t n = order_.size();
  if (world_size_ <= 1 || n <= 1) return busiest_load();
  double total_load = 0;
  by_load_.clear();
  for (int r = 0; r < world_size_; ++r) {
    total_load += cost_of_load(r, load(r));
    by_load_.insert({load(r), r});
  }
  const double good_enough = std::max(least_busiest_, level_of(total_load) * (1 + kGoodEnoughImbalance));
  tolerance_ = std::prev(by_load_.end())->first * 1e-12;
  const size_t max_rounds = 2 * size_t(world_size_) + n;
  for (size_t round = 0; round < max_rounds; ++round) {
    if (std::prev(by_load_.end())->first <= good_enough || !improve_busiest()) break;
  }
  return std::prev(by_load_.end())->first;
}

void StepDivider::divide(const Piece* pieces, size_t n, PlanSteps& out) {
  KILTER_CHECK(n < (uint64_t(1) << 32), "plan: a step of " << n << " pieces is too large");
  KILTER_CHECK(out.world_size() == world_size_,
               "plan: steps for " << out.world_size() << " ranks given to a divider for " << world_size_);
  pieces_ = pieces;
  order_.clear();
  piece_cost_.resize(n);
  std::vector<uint32_t> long_items;
  uint64_t target_tokens = 0;
  for (size_t i = 0; i < n; ++i) {
    KILTER_CHECK(pieces[i].len >= 1 && pieces[i].offset == 0, "plan: a step's pieces must be uncut and non-empty");
    piece_cost_[i] = cost_.piece(pieces[i].len);
    target_tokens += pieces[i].len;
    if (pieces[i].len > max_tokens_) long_items.push_back(uint32_t(i));
    else order_.push_back((uint64_t(~pieces[i].len) << 32) | i);
  }
  std::sort(order_.begin(), order_.end());
  build_chains(long_items);
  const size_t n_items = order_.size();
  // What no division beats (as in stats.cpp): for every k with kP < n, some rank holds k+1 of
  // the kP+1 longest pieces, and it runs a micro-batch. (With chains, no early stop.)
  prefix_cost_.resize(n_items + 1);
  prefix_cost_[0] = 0;
  for (size_t i = 0; i < n_items; ++i) prefix_cost_[i + 1] = prefix_cost_[i] + piece_cost_[uint32_t(order_[i])];
  least_busiest_ = 0;
  if (!has_chains_) {
    for (size_t k = 0, P = size_t(world_size_); k * P < n_items; ++k)
      least_busiest_ = std::max(least_busiest_, prefix_cost_[k * P + 1] - prefix_cost_[k * P - k]);
    least_busiest_ += cost_.c;
    least_busiest_ *= min_speed_;  // whichever rank holds them takes at least this long
  }
  reset_shares();
  longest_first();
  refine();
  if (world_size_ > 1 && n_items > size_t(world_size_)) {
    // Best fit against the mean share and a little above it as well (just above the mean,
    // a rank can take two long pieces that leave another rank free for the shorter ones); the
    // division whose busiest rank ends lowest, once refined and packed, goes on (ties: the
    // earlier one).
    double total_piece_cost = prefix_cost_[n_items];
    for (const Share& base : base_shares_) total_piece_cost += has_chains_ ? base.piece_cost : 0;
    const uint64_t micro_batches = std::max<uint64_t>(min_micro_batches(target_tokens), uint64_t(world_size_));
    const double mean = level_of(total_piece_cost + cost_.c * double(micro_batches));
    double best_top = packed_busiest_load();
    // Nothing to gain once the busiest rank is within kGoodEnoughImbalance of the mean or at the
    // step's lower bound.
    const double good_enough = std::max(mean * (1 + kGoodEnoughImbalance), least_busiest_);
    if (best_shares_.size() != size_t(world_size_)) best_shares_.resize(world_size_);
    shares_.swap(best_shares_);
    for (double above : kBestFitCapacities) {
      if (best_top <= good_enough || (above > 1.0 && best_top <= mean * (1 + kRetryImbalance))) break;
      reset_shares();
      best_fit(mean * above);
      refine();
      const double top = packed_busiest_load();
      if (top < best_top) {
        best_top = top;
        shares_.swap(best_shares_);
      }
    }
    shares_.swap(best_shares_);
  }
  if (even_terms_) even_terms();
  // The whole-piece division's imbalance, as packed.
  double uncut_top = 0;
  {
    double& top = uncut_top;
    double total = 0;
    for (int r = 0; r < world_size_; ++r) {
      const double l = shares_[r].piece_cost + cost_.c * double(assign_bins(r));
      top = std::max(top, speed_[r] * l);
      total += l;
    }
    uncut_imbalance_ = total > 0 ? top * inverse_speed_sum_ / total : 1.0;
  }
  if (cut_pieces_ && world_size_ > 1) {
    // The cuts weigh loads with the fewest micro-batches a share can pack into; where packing
    // needs more and the busiest rank ends above the whole-piece division's, that one stays.
    best_shares_ = shares_;
    cut_for_balance();
    if (balance_cuts_ > 0 && packed_busiest_load() > uncut_top) {
      shares_.swap(best_shares_);
      balance_cuts_ = 0;
    }
  }

  for (int r = 0; r < world_size_; ++r) pack(r, out);
  out.end_step(target_tokens);
}

}  // namespace kilter::balance
