// The term phase of a step's division (see divide.h): after the whole-piece division, pairs of
// ranks trade pieces so that attention work (sum of L^2) takes about the same share of every
// rank's time, without adding a micro-batch to either and without raising either load above the
// busier of the two or 0.1% above the step's even level. Why: a division that evens a·tokens +
// b·ΣL² + c·micro-batches can still give one rank the long pieces and another the short ones
// (best fit does, step after step: on a skewed corpus one rank of two held 3.4M of ΣL² in 7.5k
// tokens, the other 1.3M in 8.9k). Such a division is even only for the b it was made with:
// where the hardware's attention costs 10% more than b says, one rank of that step runs 1.5%
// longer than the other. Evened term by term, the same division holds for any b.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "lib/balance/divide.h"

namespace kilter::balance {

namespace {

// Exchanges tried per pair of ranks (each one that goes in lowers the pair's attention gap).
constexpr int kTermRounds = 32;
// Passes over the ranks, paired anew by their attention share each time (until a pass changes
// nothing: on two ranks, the same pair).
constexpr int kTermPasses = 3;
// A pair is even enough once b x its attention gap is within this share of its busier load: a b
// 30% off then moves the pair by 0.06%, below what a step's time can tell.
constexpr double kTermsEvenEnough = 2e-3;

}  // namespace

double StepDivider::squared_len(uint32_t item) const { return double(pieces_[item].len) * double(pieces_[item].len); }

double StepDivider::attention_of(const Share& share) const {
  double attn = 0;
  for (uint32_t item : share.items) attn += squared_len(item);
  for (const Part& p : share.parts) {
    const double s = double(p.offset), e = double(p.offset) + double(p.len);
    attn += e * e - s * s;
  }
  return attn;
}

// The pair of ranks a and b as it stands, into p (its buffer reused): h is the one whose time
// holds more attention (it gives), t the other; their loads with the micro-batches each share
// packs into, the load neither may exceed (the busier of the two, or `ceiling` where that is
// higher), and prefix sums of t's items (longest first) for runs of them.
void StepDivider::term_pair(int a, int b, double ceiling, TermPair& p) {
  const double attn_a = attention_of(shares_[a]), attn_b = attention_of(shares_[b]);
  const bool a_gives = speed_[a] * attn_a >= speed_[b] * attn_b;
  const int h = a_gives ? a : b, t = a_gives ? b : a;
  p.h = h, p.t = t;
  p.speed_h = speed_[h], p.speed_t = speed_[t];
  p.bins_h = assign_bins(h);
  p.bins_t = assign_bins(t);
  p.attn_h = a_gives ? attn_a : attn_b;
  p.attn_t = a_gives ? attn_b : attn_a;
  p.top = std::max({rank_load(h, shares_[h].piece_cost, shares_[h].tokens, p.bins_h),
                    rank_load(t, shares_[t].piece_cost, shares_[t].tokens, p.bins_t), ceiling});
  const std::vector<uint32_t>& items = shares_[t].items;
  p.prefix.assign(items.size() + 1, TermSums{});
  for (size_t i = 0; i < items.size(); ++i) {
    p.prefix[i + 1] = TermSums{p.prefix[i].cost + piece_cost_[items[i]], p.prefix[i].attn + squared_len(items[i]),
                               p.prefix[i].tokens + double(pieces_[items[i]].len)};
  }
}

// The attention gap of the pair in time (b x it is what a b that is off makes uneven), once h's
// attention has fallen by dq.
double StepDivider::TermPair::gap(double dq) const { return std::abs(speed_h * (attn_h - dq) - speed_t * (attn_t + dq)); }

// The cost window of what h takes for its item x: within [w_lo, w_hi], neither load of the pair
// rises above p.top (the micro-batches as they pack now; try_exchange checks the exact loads).
void StepDivider::TermPair::window(double w_x, const Share& sh, const Share& st, double c, double& w_lo,
                                   double& w_hi) const {
  // h's cost falls by dc = w_x - w(taken): dc >= dc_lo keeps h under the top, dc <= dc_hi keeps t.
  const double dc_lo = sh.piece_cost + c * double(bins_h) - top / speed_h;
  const double dc_hi = top / speed_t - st.piece_cost - c * double(bins_t);
  w_lo = w_x - dc_hi, w_hi = w_x - dc_lo;
}

// Prices the exchange: h gives its item xi and takes t's items [begin, end) and `extra` (-1:
// none). Feasible where neither load of the pair rises above p.top; better than `best` where the
// attention gap is smaller.
void StepDivider::try_exchange(const TermPair& p, const TermExchange& ex, TermExchange& best) const {
  const Share& sh = shares_[p.h];
  const Share& st = shares_[p.t];
  const uint32_t x = sh.items[ex.xi];
  const TermSums& a = p.prefix[size_t(ex.begin)];
  const TermSums& b = p.prefix[size_t(ex.end)];
  double dc = piece_cost_[x] - (b.cost - a.cost);
  double dq = squared_len(x) - (b.attn - a.attn);
  double dtok = double(pieces_[x].len) - (b.tokens - a.tokens);
  if (ex.extra >= 0) {
    const uint32_t y = st.items[size_t(ex.extra)];
    dc -= piece_cost_[y], dq -= squared_len(y), dtok -= double(pieces_[y].len);
  }
  const double gap = p.gap(dq);
  if (!(gap < best.gap)) return;
  const double load_h = rank_load(p.h, sh.piece_cost - dc, uint64_t(double(sh.tokens) - dtok), p.bins_h);
  const double load_t = rank_load(p.t, st.piece_cost + dc, uint64_t(double(st.tokens) + dtok), p.bins_t);
  if (std::max(load_h, load_t) > p.top) return;
  best = ex;
  best.gap = gap;
}

// h's item xi for t's item `first` and one more after it: among those whose cost keeps both
// loads under p.top (a run of t's items, which are longest first, so cost and attention fall
// along them), the two whose attention is nearest what evens the gap.
void StepDivider::scan_pairs(const TermPair& p, size_t xi, long first, TermExchange& best) const {
  const Share& st = shares_[p.t];
  const uint32_t x = shares_[p.h].items[xi];
  const uint32_t y1 = st.items[size_t(first)];
  double w_lo, w_hi;
  p.window(piece_cost_[x] - piece_cost_[y1], shares_[p.h], st, cost_.c, w_lo, w_hi);
  // dq that evens the pair: speed_h (attn_h - dq) = speed_t (attn_t + dq).
  const double want_q = squared_len(x) - squared_len(y1) - (p.speed_h * p.attn_h - p.speed_t * p.attn_t) / (p.speed_h + p.speed_t);
  const auto begin = st.items.begin() + (first + 1);
  const auto lo = std::partition_point(begin, st.items.end(), [&](uint32_t y) { return piece_cost_[y] > w_hi; });
  const auto hi = std::partition_point(lo, st.items.end(), [&](uint32_t y) { return piece_cost_[y] >= w_lo; });
  if (lo == hi) return;
  const auto at = std::partition_point(lo, hi, [&](uint32_t y) { return squared_len(y) > want_q; });
  for (auto y = (at == lo ? at : at - 1); y != hi && y <= at; ++y) {
    const long j = long(y - st.items.begin());
    try_exchange(p, TermExchange{0, xi, j, j + 1, first}, best);
  }
}

// h's item xi for a run of t's items [i, j) (one or more pieces of about one length): for each
// start, the longest run whose cost stays within the window (two pointers: costs are positive).
void StepDivider::scan_runs(const TermPair& p, size_t xi, TermExchange& best) const {
  const size_t k = shares_[p.t].items.size();
  double w_lo, w_hi;
  p.window(piece_cost_[shares_[p.h].items[xi]], shares_[p.h], shares_[p.t], cost_.c, w_lo, w_hi);
  size_t j = 0;
  for (size_t i = 0; i < k; ++i) {
    j = std::max(j, i);
    while (j < k && p.prefix[j + 1].cost - p.prefix[i].cost <= w_hi) ++j;
    if (j > i && p.prefix[j].cost - p.prefix[i].cost >= w_lo) try_exchange(p, TermExchange{0, xi, long(i), long(j), -1}, best);
  }
}

// The best exchange of one round: h moves an item to t, or swaps it for a run of t's items, or
// for two of them.
StepDivider::TermExchange StepDivider::best_exchange(const TermPair& p, const std::vector<uint32_t>& banned) const {
  const Share& sh = shares_[p.h];
  const Share& st = shares_[p.t];
  TermExchange best;
  best.gap = p.gap(0) * (1 - 1e-9);
  for (size_t xi = 0; xi < sh.items.size(); ++xi) {
    const uint32_t x = sh.items[xi];
    if (xi > 0 && pieces_[sh.items[xi - 1]].len == pieces_[x].len) continue;  // the same exchanges
    if (std::find(banned.begin(), banned.end(), x) != banned.end()) continue;
    try_exchange(p, TermExchange{0, xi, 0, 0, -1}, best);
    scan_runs(p, xi, best);
    for (size_t y1 = 0; y1 + 1 < st.items.size(); ++y1) {
      if (pieces_[st.items[y1]].len >= pieces_[x].len) continue;
      if (y1 > 0 && pieces_[st.items[y1 - 1]].len == pieces_[st.items[y1]].len) continue;
      scan_pairs(p, xi, long(y1), best);
    }
  }
  return best;
}

// Moves `items` from share `from` to share `to` (both stay longest first).
void StepDivider::move_items(int from, int to, const std::vector<uint32_t>& items) {
  Share& src = shares_[from];
  Share& dst = shares_[to];
  for (uint32_t item : items) {
    src.items.erase(std::find(src.items.begin(), src.items.end(), item));
    src.piece_cost -= piece_cost_[item], src.tokens -= pieces_[item].len;
    dst.piece_cost += piece_cost_[item], dst.tokens += pieces_[item].len;
    insert_sorted(dst.items, item);
  }
}

// Exchanges between ranks a and b until their attention is even enough or no exchange both lowers the
// gap and keeps the loads and the micro-batches. Each one goes in only where both shares still
// pack into as many micro-batches as before (else it is undone and its item left alone). Returns
// whether any went in.
bool StepDivider::even_pair(int a, int b, double ceiling) {
  TermPair& p = term_scratch_;
  std::vector<uint32_t>& banned = term_banned_;
  std::vector<uint32_t>& give = term_give_;
  std::vector<uint32_t>& take = term_take_;
  banned.clear();
  bool changed = false;
  for (int round = 0; round < kTermRounds; ++round) {
    term_pair(a, b, ceiling, p);  // after an exchange that overshot, the other one gives
    const int h = p.h, t = p.t;
    if (cost_.b * p.gap(0) <= kTermsEvenEnough * p.top) break;
    const TermExchange ex = best_exchange(p, banned);
    if (ex.xi == SIZE_MAX) break;
    const std::vector<uint32_t>& t_items = shares_[t].items;
    give.assign(1, shares_[h].items[ex.xi]);
    take.assign(t_items.begin() + ex.begin, t_items.begin() + ex.end);
    if (ex.extra >= 0) take.push_back(t_items[size_t(ex.extra)]);
    const double cost_h = shares_[h].piece_cost, cost_t = shares_[t].piece_cost;
    const uint64_t tokens_h = shares_[h].tokens, tokens_t = shares_[t].tokens;
    move_items(h, t, give);
    move_items(t, h, take);
    if (assign_bins(h) > p.bins_h || assign_bins(t) > p.bins_t) {
      move_items(t, h, give);
      move_items(h, t, take);
      shares_[h].piece_cost = cost_h, shares_[t].piece_cost = cost_t;  // exactly as they were
      shares_[h].tokens = tokens_h, shares_[t].tokens = tokens_t;
      banned.push_back(give[0]);
    } else {
      changed = true;
    }
  }
  return changed;
}

// Pairs the rank whose time holds the largest share of attention with the one holding the
// smallest, the second with the second, ..., and evens each pair. A pair's loads may rise to the
// busiest rank's or to kGoodEnoughImbalance above the even level (what the whole-piece division
// itself takes as even), whichever is higher: within that, a b that is off costs more than the
// loads' last 0.1%.
void StepDivider::even_terms() {
  if (world_size_ < 2 || cost_.b <= 0) return;
  std::vector<double> share(static_cast<size_t>(world_size_));
  std::vector<int> ranks(static_cast<size_t>(world_size_));
  double ceiling = 0;
  for (int pass = 0; pass < kTermPasses; ++pass) {
    double total_cost = 0;
    for (int r = 0; r < world_size_; ++r) {
      const size_t bins = assign_bins(r);
      const double load = rank_load(r, shares_[r].piece_cost, shares_[r].tokens, bins);
      total_cost += shares_[r].piece_cost + cost_.c * double(bins);
      share[size_t(r)] = load > 0 ? speed_[r] * cost_.b * attention_of(shares_[r]) / load : 0;
    }
    if (pass == 0) ceiling = level_of(total_cost) * (1 + kGoodEnoughImbalance);
    std::iota(ranks.begin(), ranks.end(), 0);
    std::stable_sort(ranks.begin(), ranks.end(), [&](int x, int y) { return share[size_t(x)] > share[size_t(y)]; });
    if (share[size_t(ranks.front())] - share[size_t(ranks.back())] <= kTermsEvenEnough) return;
    bool changed = false;
    for (size_t i = 0; i < ranks.size() / 2; ++i) changed |= even_pair(ranks[i], ranks[ranks.size() - 1 - i], ceiling);
    if (!changed) return;  // the same pairs would come again
  }
}

}  // namespace kilter::balance
