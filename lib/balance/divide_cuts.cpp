// The cut phase of a step's division (see divide.h; the whole-piece division and packing are in
// divide.cpp). Context parallelism: while the busiest rank is above the mean, the cut of one of its pieces or
// parts with one of the least-loaded ranks that lowers the larger of the two loads most (the
// later part pays t per earlier token) goes in; each part of a piece lies in the same micro-batch
// slot on its rank, and a rank's slots with parts are its first micro-batches. Pieces longer than
// max_tokens are first cut into equal chains of ceil(len / max_tokens) parts laid out in rows.
#include "lib/balance/divide.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <iterator>
#include <utility>

#include "io/base/error.h"

namespace kilter::balance {

namespace {

// Cuts: partners tried per cut; a cut must lower the busiest rank by this share of the mean at
// least (smaller cuts are below the noise of measured step times and only add exchanges).
constexpr int kCutPartners = 4;
constexpr double kMinCutGain = 5e-4;
// Cuts stop once the busiest rank is within this share of the mean (the goal is 1.01).
constexpr double kCutGoodEnough = 3e-3;
// At most kCutsPerRankBoundary x (P - 1) cuts per step. The wrap-around rule needs P - 1 (the
// yardstick, reported as cuts_per_step); one cut at a time, the greedy needs more where every rank
// boundary is a cut (a quarter context per rank: the Llama row of bench/plan.sh reaches 1.018 at
// P - 1 and 1.003 at 2 (P - 1), with 1.32 P cuts). Each cut still pays its transfer and must gain.
constexpr uint64_t kCutsPerRankBoundary = 2;

}  // namespace

// Pieces longer than max_tokens: each is cut into k = ceil(len / max_tokens) parts of equal length
// (to a token), one per rank, all in one slot. The chains are packed into rows of P ranks (first
// fit, widest first); rows sorted widest first and row j laid on ranks 0..width_j-1 keep every
// rank's slots with parts a prefix 0..m-1 (no empty micro-batch before a slot). Within a row the
// costliest parts go to the least-loaded ranks.
void StepDivider::build_chains(const std::vector<uint32_t>& long_items) {
  for (Share& share : base_shares_) share = Share{};
  has_chains_ = !long_items.empty();
  if (!has_chains_) return;
  const uint64_t P = uint64_t(world_size_);
  std::vector<std::pair<uint64_t, uint32_t>> chains;  // (ranks it spans, item), widest first
  for (uint32_t item : long_items) {
    const uint64_t k = (uint64_t(pieces_[item].len) + max_tokens_ - 1) / max_tokens_;
    KILTER_CHECK(k <= P, "plan: a piece of " << pieces_[item].len << " tokens needs " << k << " ranks of data.max_tokens = "
                 << max_tokens_ << ", more than the world size " << P << "; run on >= " << k << " ranks or raise data.max_tokens");
    chains.push_back({k, item});
  }
  std::sort(chains.begin(), chains.end(), [](const auto& x, const auto& y) {
    return x.first > y.first || (x.first == y.first && x.second < y.second);
  });
  std::vector<uint64_t> width;
  std::vector<std::vector<uint32_t>> row_chains;
  for (size_t c = 0; c < chains.size(); ++c) {
    size_t row = 0;
    while (row < width.size() && width[row] + chains[c].first > P) ++row;
    if (row == width.size()) width.push_back(0), row_chains.emplace_back();
    width[row] += chains[c].first;
    row_chains[row].push_back(uint32_t(c));
  }
  std::vector<size_t> rows(width.size());
  for (size_t j = 0; j < rows.size(); ++j) rows[j] = j;
  std::stable_sort(rows.begin(), rows.end(), [&](size_t x, size_t y) { return width[x] > width[y]; });
  std::vector<Part> row_parts;
  std::vector<int> ranks;
  for (size_t slot = 0; slot < rows.size(); ++slot) {
    row_parts.clear();
    for (uint32_t c : row_chains[rows[slot]]) {
      const uint32_t item = chains[c].second, len = pieces_[item].len;
      const uint64_t k = chains[c].first;
      for (uint64_t i = 0; i < k; ++i) {
        const uint32_t begin = uint32_t(i * len / k), end = uint32_t((i + 1) * len / k);
        row_parts.push_back(Part{item, begin, end - begin, uint32_t(slot)});
      }
    }
    const auto part_cost = [this](const Part& p) { return cost_.part(p.offset, p.len); };
    std::stable_sort(row_parts.begin(), row_parts.end(),
                     [&](const Part& x, const Part& y) { return part_cost(x) > part_cost(y); });
    ranks.resize(row_parts.size());
    for (size_t r = 0; r < ranks.size(); ++r) ranks[r] = int(r);
    std::stable_sort(ranks.begin(), ranks.end(),
                     [&](int x, int y) { return base_shares_[x].piece_cost < base_shares_[y].piece_cost; });
    for (size_t i = 0; i < row_parts.size(); ++i) {
      Share& share = base_shares_[ranks[i]];
      share.parts.push_back(row_parts[i]);
      share.slot_tokens.push_back(row_parts[i].len);
      share.piece_cost += part_cost(row_parts[i]);
      share.tokens += row_parts[i].len;
    }
  }
}

// The largest end e >= o + 1 of a part [o, e) whose cost stays <= budget (cost_.part is
// a e + b e^2 + const in e: the root of the quadratic), or o when even one token costs more.
uint32_t StepDivider::largest_end(uint32_t o, double budget) const {
  const double od = double(o);
  const double r = budget - cost_.t * od + cost_.a * od + cost_.b * od * od;  // b e^2 + a e <= r
  double e;
  if (cost_.b > 0) e = (-cost_.a + std::sqrt(cost_.a * cost_.a + 4 * cost_.b * std::max(r, 0.0))) / (2 * cost_.b);
  else if (cost_.a > 0) e = r / cost_.a;
  else e = 4e9;
  uint64_t end = uint64_t(std::clamp(std::floor(e), od, 4e9));
  while (end > o && cost_.part(o, uint32_t(end - o)) > budget) --end;
  return uint32_t(std::max<uint64_t>(end, o));
}

// Water filling of one piece over a chain of ranks, in token order: the smallest level T such that
// every holder i, given base[i] (its cost without this piece) plus its part, times its speed,
// stays <= T, each part >= 1 token and <= room[i]. Each holder in turn takes the longest part that
// keeps it at T (where t < a, more for the earlier ranks only makes the later parts cheaper);
// binary search on T. Returns false when no level below `ceiling` works; else `ends` holds each
// part's end.
bool StepDivider::water_fill(uint32_t len, const std::vector<double>& base, const double* speed, const double* inverse,
                             const std::vector<uint64_t>& room, double ceiling, std::vector<uint32_t>& ends) const {
  const size_t k = base.size();
  ends.resize(k);
  if (k == 2) {  // most cuts: solved directly (split_two), not by bisection on the level
    uint32_t e = 0;
    if (!split_two(len, base[0], base[1], speed ? speed[0] : 1.0, speed ? speed[1] : 1.0, room[0], room[1], ceiling, e))
      return false;
    ends[0] = e, ends[1] = len;
    return true;
  }
  // Each holder but the last takes the longest part that keeps it at `level`; the last takes the
  // rest. Returns the last holder's load minus the level (<= 0: the level works), or +infinity
  // where an earlier holder cannot take even one token (or its room runs out) at this level.
  const auto fill = [&](double level, std::vector<uint32_t>& out) -> double {
    uint32_t o = 0;
    for (size_t i = 0; i + 1 < k; ++i) {
      const uint32_t latest = uint32_t(len - (k - 1 - i));  // a token for each later holder
      const uint32_t e = uint32_t(std::min<uint64_t>(
          {uint64_t(largest_end(o, (inverse ? level * inverse[i] : level) - base[i])), uint64_t(latest),
           uint64_t(o) + room[i]}));
      if (e <= o) return INFINITY;
      out[i] = e;
      o = e;
    }
    out[k - 1] = len;
    if (uint64_t(len - o) > room[k - 1]) return INFINITY;
    const double last = base[k - 1] + cost_.part(o, len - o);
    return (speed ? speed[k - 1] * last : last) - level;
  };
  double g_hi = fill(ceiling, ends);
  if (!(g_hi <= 0)) return false;
  // The level can be no lower than the holders' balanced level with the whole piece among them
  // (the parts' b terms telescope to b len^2, and each later part pays t for at least one earlier
  // token), nor than any holder's time without a part.
  double sum = 0, inverse_speeds = 0, top = 0;
  for (size_t i = 0; i < k; ++i) {
    sum += base[i];
    inverse_speeds += inverse ? inverse[i] : 1.0;
    top = std::max(top, speed ? speed[i] * base[i] : base[i]);
  }
  const double spread = cost_.piece(len) + cost_.t * double(k - 1);
  double lo = std::max(top, (sum + spread) / inverse_speeds), hi = ceiling;
  double g_lo = INFINITY;  // not evaluated: the first step bisects
  std::vector<uint32_t>& trial = fill_scratch_;
  trial.resize(k);
  // The ends move by whole tokens: a level finer than a quarter of a token's cost (a) picks the
  // same parts to within one token, well below what the busiest rank's load can tell.
  const double resolution = std::max(1e-5 * hi, 0.25 * cost_.a);
  // Regula falsi on the last holder's excess, which falls about linearly as the level rises
  // (Illinois: the end kept twice in a row has its excess halved), inside the bracket
  // [lo infeasible, hi feasible]; a bisection where the excess is not known (an earlier holder
  // failed). 3-4 fills where bisection took 7 on the Llama row of bench/plan.sh.
  int kept = 0;  // +1: hi kept last time, -1: lo kept
  for (int iter = 0; iter < 40 && hi - lo > resolution; ++iter) {
    double mid = 0.5 * (lo + hi);
    if (std::isfinite(g_lo) && g_lo > g_hi) {
      mid = hi - g_hi * (hi - lo) / (g_hi - g_lo);
      mid = std::clamp(mid, lo + 0.05 * (hi - lo), hi - 0.05 * (hi - lo));
    }
    const double g = fill(mid, trial);
    if (g <= 0) {
      hi = mid, g_hi = g, ends.swap(trial);
      if (kept == -1) g_lo *= 0.5;
      kept = -1;
    } else {
      lo = mid, g_lo = g;
      if (kept == 1) g_hi *= 0.5;
      kept = 1;
    }
  }
  return true;
}

// Two holders of a piece of len tokens at speeds s0 and s1, the first taking [0, e), the second
// [e, len): the e that minimizes the larger of f0(e) = s0 (base0 + part(0, e)) and
// f1(e) = s1 (base1 + part(e, len - e)), e in [max(1, len - room1), min(len - 1, room0)]. f0 rises
// with e and f1 is concave in e (b >= 0), so the larger of the two is least at an end of the range
// or where they cross, the roots of f0 - f1 = (s0 + s1) b e^2 + ((s0 + s1) a - s1 t) e +
// (s0 base0 - s1 base1 - s1 a len - s1 b len^2) (at equal speeds 2b e^2 + (2a - t) e + ...):
// those candidates (each crossing's two integers) are compared, and a tie goes to the larger e
// (the longest first part, as water filling takes it). What the bisection of water_fill()
// computes, in a few operations. false: the range is empty or its best is above `ceiling`.
bool StepDivider::split_two(uint32_t len, double base0, double base1, double speed0, double speed1, uint64_t room0,
                            uint64_t room1, double ceiling, uint32_t& e_out) const {
  const int64_t lo = std::max<int64_t>(1, int64_t(len) - int64_t(room1));
  const int64_t hi = std::min<int64_t>(int64_t(len) - 1, int64_t(room0));
  if (lo > hi) return false;
  const auto level = [&](int64_t e) {
    return std::max(speed0 * (base0 + cost_.part(0, uint32_t(e))),
                    speed1 * (base1 + cost_.part(uint32_t(e), uint32_t(int64_t(len) - e))));
  };
  int64_t best_e = -1;
  double best = 0;
  const auto consider = [&](double x) {
    if (!(x >= double(lo))) x = double(lo);  // NaN too
    if (x > double(hi)) x = double(hi);
    const int64_t e = int64_t(x);
    const double v = level(e);
    if (best_e < 0 || v < best || (v == best && e > best_e)) best = v, best_e = e;
  };
  consider(double(lo));
  consider(double(hi));
  const double L = len, speeds = speed0 + speed1;
  const double qa = speeds * cost_.b, qb = speeds * cost_.a - speed1 * cost_.t;
  const double qc = speed0 * base0 - speed1 * base1 - speed1 * cost_.a * L - speed1 * cost_.b * L * L;
  std::array<double, 2> roots = {NAN, NAN};
  if (qa > 0) {
    const double disc = qb * qb - 4 * qa * qc;
    if (disc >= 0) roots = {(-qb - std::sqrt(disc)) / (2 * qa), (-qb + std::sqrt(disc)) / (2 * qa)};
  } else if (qb != 0) {
    roots[0] = -qc / qb;
  }
  for (double r : roots) {
    if (!std::isfinite(r)) continue;
    consider(std::floor(r));
    consider(std::floor(r) + 1);
  }
  if (!(best <= ceiling)) return false;
  e_out = uint32_t(best_e);
  return true;
}

// A chain for `item` (uncut on the busiest rank, or already cut) over `ranks` in token order, in
// `slot`: water-filled, scored by its holders' new loads, kept in `best` when it scores lower.
void StepDivider::try_chain(uint32_t item, uint32_t slot, const std::vector<int>& ranks, int new_cuts, double mean,
                            Cut& best) const {
  const uint32_t len = pieces_[item].len;
  const size_t k = ranks.size();
  if (k < 2 || k > len) return;
  base_scratch_.resize(k);
  room_scratch_.resize(k);
  if (!uniform_speed_) {
    speed_scratch_.resize(k);
    inverse_scratch_.resize(k);
    for (size_t i = 0; i < k; ++i) speed_scratch_[i] = speed_[ranks[i]], inverse_scratch_[i] = inverse_speed_[ranks[i]];
  }
  for (size_t i = 0; i < k; ++i) {
    const Share& s = shares_[ranks[i]];
    double cost = s.piece_cost;
    uint64_t tokens = s.tokens;
    uint64_t in_slot = slot < s.slot_tokens.size() ? s.slot_tokens[slot] : 0;
    size_t slots = std::max<size_t>(s.slot_tokens.size(), slot + 1);
    const Part* own = find_part(s, item);
    if (own) {
      cost -= cost_.part(own->offset, own->len);
      tokens -= own->len;
      in_slot -= own->len;
    } else if (std::find(s.items.begin(), s.items.end(), item) != s.items.end()) {
      cost -= piece_cost_[item];
      tokens -= len;
    }
    base_scratch_[i] = load_of(cost, tokens, slots);
    room_scratch_[i] = max_tokens_ - std::min<uint64_t>(max_tokens_, in_slot);
  }
  // No chain can leave its holders below their balanced level with the whole piece among them:
  // skip the water filling where that already loses to the best so far.
  double sum = 0, inverse_speeds = 0;
  for (size_t i = 0; i < k; ++i) sum += base_scratch_[i], inverse_speeds += uniform_speed_ ? 1.0 : inverse_scratch_[i];
  if ((sum + cost_.piece(len) + cost_.t * double(k - 1)) / inverse_speeds > best.score) return;
  std::vector<uint32_t>& ends = ends_scratch_;
  const double* speed = uniform_speed_ ? nullptr : speed_scratch_.data();
  const double* inverse = uniform_speed_ ? nullptr : inverse_scratch_.data();
  if (!water_fill(len, base_scratch_, speed, inverse, room_scratch_, best.score, ends)) return;
  // The exact loads (the micro-batch count follows the tokens).
  double score = mean;
  uint32_t o = 0;
  for (size_t i = 0; i < k; ++i) {
    const Share& s = shares_[ranks[i]];
    double cost = s.piece_cost;
    uint64_t tokens = s.tokens;
    const Part* own = find_part(s, item);
    if (own) cost -= cost_.part(own->offset, own->len), tokens -= own->len;
    else if (std::find(s.items.begin(), s.items.end(), item) != s.items.end()) cost -= piece_cost_[item], tokens -= len;
    score = std::max(score, rank_load(ranks[i], cost + cost_.part(o, ends[i] - o), tokens + (ends[i] - o),
                                      std::max<size_t>(s.slot_tokens.size(), slot + 1)));
    o = ends[i];
  }
  // Ties (both at the mean): the fewer new cuts.
  if (score < best.score ||
      (score == best.score && (best.move || !best.ranks.empty()) && new_cuts < best.new_cuts)) {
    best = Cut{};
    best.score = score;
    best.item = item;
    best.slot = slot;
    best.ranks = ranks;
    best.ends = ends;
    best.new_cuts = new_cuts;
  }
}

const StepDivider::Part* StepDivider::find_part(const Share& share, uint32_t item) {
  for (const Part& p : share.parts)
    if (p.item == item) return &p;
  return nullptr;
}

void StepDivider::apply_cut(int busiest, const Cut& cut) {
  if (cut.move) {
    move_item(shares_[busiest], shares_[cut.partner], shares_[busiest].items[cut.index]);
    return;
  }
  const uint32_t item = cut.item, len = pieces_[item].len;
  uint32_t o = 0;
  for (size_t i = 0; i < cut.ranks.size(); ++i) {
    Share& s = shares_[cut.ranks[i]];
    const Part part{item, o, cut.ends[i] - o, cut.slot};
    o = cut.ends[i];
    if (cut.slot == s.slot_tokens.size()) s.slot_tokens.push_back(0);
    auto own = std::find_if(s.parts.begin(), s.parts.end(), [&](const Part& p) { return p.item == item; });
    if (own != s.parts.end()) {
      s.piece_cost -= cost_.part(own->offset, own->len);
      s.tokens -= own->len;
      s.slot_tokens[cut.slot] -= own->len;
      *own = part;
    } else {
      auto whole = std::find(s.items.begin(), s.items.end(), item);
      if (whole != s.items.end()) {
        s.items.erase(whole);
        s.piece_cost -= piece_cost_[item];
        s.tokens -= len;
      }
      s.parts.push_back(part);
    }
    s.piece_cost += cost_.part(part.offset, part.len);
    s.tokens += part.len;
    s.slot_tokens[cut.slot] += part.len;
  }
  holders_[item] = cut.ranks;
}

// Cuts for balance: while the busiest rank is more than kGoodEnoughImbalance above the mean, the
// best of: water filling again a cut piece it holds a part of; adding one of the kCutPartners
// least-loaded ranks at the front or the back of such a piece, or of an uncut piece it holds
// (a new cut); moving one of its uncut pieces whole. It must lower the busiest load by more than
// kMinCutGain of the mean (the transfer cost counted); at most kCutsPerRankBoundary x (P - 1) cuts
// per step (twice the wrap-around rule's count).
void StepDivider::cut_for_balance() {
  balance_cuts_ = 0;
  if (!cut_pieces_ || world_size_ <= 1) return;
  holders_.clear();
  for (int r = 0; r < world_size_; ++r)
    for (const Part& p : shares_[r].parts) holders_[p.item].push_back(r);
  for (auto& [item, ranks] : holders_)
    std::sort(ranks.begin(), ranks.end(), [&](int x, int y) {
      return find_part(shares_[x], item)->offset < find_part(shares_[y], item)->offset;
    });
  by_load_.clear();
  double total = 0;  // the ranks' costs (loads over their speeds)
  for (int r = 0; r < world_size_; ++r) {
    by_load_.insert({load(r), r});
    total += cost_of_load(r, load(r));
  }
  std::vector<int> chain;
  const size_t max_rounds = 4 * kCutsPerRankBoundary * size_t(world_size_) + 64;
  for (size_t round = 0; round < max_rounds; ++round) {
    const auto top_entry = std::prev(by_load_.end());
    const double top = top_entry->first;
    const int busiest = top_entry->second;
    const double mean = level_of(total);
    if (top <= mean * (1 + kCutGoodEnough)) break;
    const bool may_cut = balance_cuts_ < kCutsPerRankBoundary * (uint64_t(world_size_) - 1);
    Cut best;
    best.score = top - mean * kMinCutGain;
    const Share& mine = shares_[busiest];
    // The cut pieces it holds a part of: water filled again, or one rank longer.
    for (const Part& part : mine.parts) {
      const std::vector<int>& ranks = holders_.at(part.item);
      try_chain(part.item, part.slot, ranks, 0, mean, best);
      if (!may_cut) continue;
      int examined = 0;
      for (auto it = by_load_.begin(); it != top_entry && examined < kCutPartners; ++it, ++examined) {
        const int partner = it->second;
        if (top - it->first <= mean * kMinCutGain) break;
        if (part.slot > shares_[partner].slot_tokens.size() || find_part(shares_[partner], part.item)) continue;
        chain.assign(1, partner);
        chain.insert(chain.end(), ranks.begin(), ranks.end());
        try_chain(part.item, part.slot, chain, 1, mean, best);
        chain.assign(ranks.begin(), ranks.end());
        chain.push_back(partner);
        try_chain(part.item, part.slot, chain, 1, mean, best);
      }
    }
    // Its uncut pieces: cut in two with a partner, or moved whole.
    int examined = 0;
    for (auto it = by_load_.begin(); it != top_entry && examined < kCutPartners; ++it, ++examined) {
      if (top - it->first <= mean * kMinCutGain) break;
      const int partner = it->second;
      const Share& theirs = shares_[partner];
      // The lowest slot both ranks can share or open (a prefix on both).
      const size_t last_slot = std::min(mine.slot_tokens.size(), theirs.slot_tokens.size());
      for (size_t xi = 0; xi < mine.items.size(); ++xi) {
        const uint32_t x = mine.items[xi], len = pieces_[x].len;
        if (xi > 0 && pieces_[mine.items[xi - 1]].len == len) continue;
        const double score =
            std::max({rank_load(busiest, mine.piece_cost - piece_cost_[x], mine.tokens - len, mine.slot_tokens.size()),
                      rank_load(partner, theirs.piece_cost + piece_cost_[x], theirs.tokens + len, theirs.slot_tokens.size()),
                      mean});
        if (score < best.score || (score == best.score && best.new_cuts > 0)) {
          best = Cut{};
          best.score = score;
          best.partner = partner;
          best.index = xi;
          best.move = true;
        }
        if (!may_cut || len < 2) continue;
        for (size_t slot = 0; slot <= last_slot; ++slot) {
          const auto room = [&](const Share& sh) {
            return slot < sh.slot_tokens.size() ? max_tokens_ - std::min<uint64_t>(max_tokens_, sh.slot_tokens[slot]) : max_tokens_;
          };
          if (room(mine) < 1 || room(theirs) < 1 || room(mine) + room(theirs) < len) continue;
          chain = {partner, busiest};
          try_chain(x, uint32_t(slot), chain, 1, mean, best);
          chain = {busiest, partner};
          try_chain(x, uint32_t(slot), chain, 1, mean, best);
          break;
        }
      }
    }
    if (!best.move && best.ranks.empty()) break;
    // The ranks whose loads change: out of the ordered set, changed, back in.
    chain = best.move ? std::vector<int>{busiest, best.partner} : best.ranks;
    if (std::find(chain.begin(), chain.end(), busiest) == chain.end()) chain.push_back(busiest);
    double before = 0;
    for (int r : chain) {
      before += cost_of_load(r, load(r));
      by_load_.erase({load(r), r});
    }
    apply_cut(busiest, best);
    for (int r : chain) {
      total += cost_of_load(r, load(r));
      by_load_.insert({load(r), r});
    }
    total -= before;
    balance_cuts_ += uint64_t(best.new_cuts);
  }
}

}  // namespace kilter::balance
