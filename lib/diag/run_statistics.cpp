// Run statistics over every rank's step records (see run_statistics.h). The rules are written
// out in docs/diagnostics.md; keep the two in step.
#include "lib/diag/run_statistics.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "io/base/error.h"

namespace kilter::diag {

namespace {
// Fewer steps than this and no straggler is named: a share of 3 out of 4 says little.
constexpr int64_t kMinStepsForVerdict = 5;
// A recurring stall period must explain this share of the gaps between consecutive stalls.
constexpr double kPeriodAgreement = 0.6;
constexpr size_t kMaxStallsListed = 100;
}  // namespace

const char* component_name(int component) {
  switch (component) {
    case kCompOther: return "other";
    case kCompOutside: return "outside";
    default: return phase_name(component);
  }
}

double component_seconds(const StepRecord& r, int component) {
  if (component == kCompOutside) return r.outside;
  if (component == kCompOther) {
    double named = 0;
    for (int p = 0; p < kStepTotal; ++p) named += r.phase[p];
    return std::max(0.0, r.phase[kStepTotal] - named);
  }
  return r.phase[component];
}

double percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  double pos = q / 100.0 * double(values.size() - 1);
  size_t lo = size_t(std::floor(pos));
  size_t hi = std::min(lo + 1, values.size() - 1);
  double frac = pos - double(lo);
  return values[lo] + (values[hi] - values[lo]) * frac;
}

double median(std::vector<double> values) { return percentile(std::move(values), 50); }

LastArrival find_last_arrival(const StepRecord* ranks, int world_size) {
  LastArrival out;
  if (world_size < 2) return out;
  int last = 0;
  for (int r = 1; r < world_size; ++r)
    if (ranks[r].arrival > ranks[last].arrival) last = r;
  std::vector<double> others, totals;
  for (int r = 0; r < world_size; ++r) {
    totals.push_back(ranks[r].phase[kStepTotal]);
    if (r != last) others.push_back(ranks[r].arrival);
  }
  out.rank = last;
  out.lag = ranks[last].arrival - median(others);
  out.noise = std::max(kLagNoiseFloorSeconds, kLagNoiseFraction * median(totals));
  out.significant = out.lag > out.noise;
  return out;
}

int slowest_component(const std::vector<double>& sums, int world_size, int rank, double* excess) {
  int best = -1;
  double best_excess = 0;
  for (int c = 0; c < kNumComponents; ++c) {
    if (waits_for_all_ranks(c)) continue;
    std::vector<double> others;
    for (int r = 0; r < world_size; ++r)
      if (r != rank) others.push_back(sums[size_t(r) * kNumComponents + c]);
    double e = sums[size_t(rank) * kNumComponents + c] - (others.empty() ? 0 : median(others));
    if (e > best_excess) {
      best_excess = e;
      best = c;
    }
  }
  if (excess) *excess = best_excess;
  return best;
}

int most_common_peer(const std::map<int, int64_t>& counts) {
  int best = -1;
  int64_t best_count = 0;
  for (const auto& [peer, count] : counts)
    if (count > best_count) {
      best = peer;
      best_count = count;
    }
  return best;
}

RunStatistics::RunStatistics(int world_size, double stall_factor)
    : world_size_(world_size),
      stall_factor_(stall_factor),
      component_sums_(size_t(world_size) * kNumComponents, 0.0),
      compute_sums_(world_size, 0.0),
      last_counts_(world_size, 0),
      last_lag_sums_(world_size, 0.0),
      peak_rss_(world_size, 0),
      device_peak_(world_size, 0),
      kv_wait_peers_(size_t(world_size)) {
  KILTER_CHECK(world_size >= 1, "diagnostics: world size " << world_size << " must be positive");
}

void RunStatistics::add_step(const StepRecord* ranks) {
  StepAggregate agg;
  agg.step = ranks[0].step;
  double compute_max = 0, compute_sum = 0, last_arrival = ranks[0].arrival;
  for (int r = 0; r < world_size_; ++r) {
    const StepRecord& rec = ranks[r];
    double compute = compute_seconds(rec);
    compute_max = std::max(compute_max, compute);
    compute_sum += compute;
    compute_sums_[r] += compute;
    agg.wall = std::max(agg.wall, rec.phase[kStepTotal] + rec.outside);
    for (int c = 0; c < kNumComponents; ++c) {
      double s = component_seconds(rec, c);
      component_sums_[size_t(r) * kNumComponents + c] += s;
      agg.component_max[c] = std::max(agg.component_max[c], s);
    }
    last_arrival = std::max(last_arrival, rec.arrival);
    step_total_seconds_ += rec.phase[kStepTotal];
    peak_rss_[r] = std::max(peak_rss_[r], rec.peak_rss_bytes);
    if (rec.kv_wait_peer >= 0) kv_wait_peers_[size_t(r)][rec.kv_wait_peer] += 1;
    kv_tokens_ += rec.kv_tokens;
    kv_bytes_ += rec.kv_bytes;
    kv_wait_seconds_ += rec.phase[kKvWait];
    gather_wait_seconds_ += rec.phase[kGatherWait];
    scatter_wait_seconds_ += rec.phase[kScatterWait];
    device_peak_[r] = std::max(device_peak_[r], rec.device_peak_bytes);
  }
  double step_wait = 0, step_total = 0;
  for (int r = 0; r < world_size_; ++r) {
    step_wait += last_arrival - ranks[r].arrival;
    step_total += ranks[r].phase[kStepTotal];
  }
  wait_seconds_ += step_wait;
  agg.sync_wait_share = step_total > 0 ? step_wait / step_total : 0.0;
  double compute_mean = compute_sum / world_size_;
  agg.imbalance = compute_mean > 0 ? compute_max / compute_mean : 1.0;
  LastArrival last = find_last_arrival(ranks, world_size_);
  if (last.significant) {
    last_counts_[last.rank] += 1;
    last_lag_sums_[last.rank] += last.lag;
  }
  steps_.push_back(agg);
}

double RunStatistics::step_time_imbalance_percentile(double q) const {
  std::vector<double> v;
  for (const auto& s : steps_) v.push_back(s.imbalance);
  return percentile(v, q);
}

double RunStatistics::sync_wait_fraction() const {
  return step_total_seconds_ > 0 ? wait_seconds_ / step_total_seconds_ : 0;
}

// The straggler rule. Each step, the rank that arrives last at the gradient collective counts
// when its lag behind the other ranks' median arrival is beyond noise (find_last_arrival). With
// no systematic straggler the last rank is any of P with probability 1/P, so the count of one
// rank is about Binomial(steps, 1/P). A rank is named when its share of steps is at least
// max(1/2, 1/P + 3 sigma), sigma = sqrt((1/P)(1 - 1/P) / steps): last in most steps, and more
// often than chance explains. At least kMinStepsForVerdict steps are needed.
StragglerVerdict RunStatistics::straggler() const {
  StragglerVerdict v;
  const int64_t n = steps();
  if (world_size_ < 2 || n == 0) return v;
  int cand = int(std::max_element(last_counts_.begin(), last_counts_.end()) - last_counts_.begin());
  if (last_counts_[cand] == 0) return v;
  double p0 = 1.0 / world_size_;
  v.candidate = cand;
  v.steps_last = last_counts_[cand];
  v.share = double(v.steps_last) / double(n);
  v.threshold = std::max(0.5, p0 + 3.0 * std::sqrt(p0 * (1 - p0) / double(n)));
  v.mean_lag_seconds = last_lag_sums_[cand] / double(v.steps_last);
  double excess = 0;
  int comp = slowest_component(component_sums_, world_size_, cand, &excess);
  v.phase = comp >= 0 ? component_name(comp) : "";
  v.phase_excess_seconds = excess / double(n);
  if (comp == kCompKvWait) v.kv_wait_for_rank = most_common_peer(kv_wait_peers_[size_t(cand)]);
  if (n >= kMinStepsForVerdict && v.share >= v.threshold) v.rank = cand;
  return v;
}

double RunStatistics::median_step_seconds() const {
  std::vector<double> v;
  for (const auto& s : steps_) v.push_back(s.wall);
  return median(v);
}

std::vector<Stall> RunStatistics::stalls() const {
  std::vector<Stall> out;
  if (steps_.size() < 3) return out;
  double med = median_step_seconds();
  double comp_median[kNumComponents];
  for (int c = 0; c < kNumComponents; ++c) {
    std::vector<double> v;
    for (const auto& s : steps_) v.push_back(s.component_max[c]);
    comp_median[c] = median(v);
  }
  for (const auto& s : steps_) {
    if (!(s.wall > stall_factor_ * med)) continue;
    Stall st;
    st.step = s.step;
    st.seconds = s.wall;
    // comm_exposed (and the sharded units' waits) grows on every rank that waits for a slow one;
    // name it only when nothing the ranks do themselves grew.
    int best = -1;
    double best_excess = 0;
    for (int c = 0; c < kNumComponents; ++c) {
      double e = s.component_max[c] - comp_median[c];
      if (!waits_for_all_ranks(c) && e > best_excess) {
        best_excess = e;
        best = c;
      }
    }
    if (best < 0) {
      best = kCompCommExposed;
      best_excess = s.component_max[kCompCommExposed] - comp_median[kCompCommExposed];
    }
    st.phase = component_name(best);
    st.excess_seconds = best_excess;
    out.push_back(st);
  }
  return out;
}

// Recurring stalls (a checkpoint or a log every N steps): the most common gap between
// consecutive stalls, when it explains at least kPeriodAgreement of the gaps and there are at
// least three stalls. A lone slow first step does not hide the period: it is one gap out of many.
int64_t RunStatistics::stall_period() const {
  std::vector<Stall> s = stalls();
  if (s.size() < 3) return 0;
  std::map<int64_t, int> gap_counts;
  for (size_t i = 1; i < s.size(); ++i) gap_counts[s[i].step - s[i - 1].step] += 1;
  auto best = std::max_element(gap_counts.begin(), gap_counts.end(),
                               [](const auto& a, const auto& b) { return a.second < b.second; });
  int gaps = int(s.size()) - 1;
  if (best->first >= 2 && best->second >= 2 && best->second >= kPeriodAgreement * gaps)
    return best->first;
  return 0;
}

double RunStatistics::component_mean(int rank, int component) const {
  return steps_.empty() ? 0 : component_sums_[size_t(rank) * kNumComponents + component] / double(steps());
}

double RunStatistics::compute_mean(int rank) const {
  return steps_.empty() ? 0 : compute_sums_[rank] / double(steps());
}

nlohmann::json RunStatistics::to_json() const {
  using nlohmann::json;
  json j;
  j["step_time_imbalance_p50"] = step_time_imbalance_percentile(50);
  j["step_time_imbalance_p95"] = step_time_imbalance_percentile(95);
  j["step_time_imbalance_max"] = step_time_imbalance_percentile(100);
  j["sync_wait_fraction"] = sync_wait_fraction();
  j["median_step_seconds"] = median_step_seconds();
  // Cut pieces (context parallelism): the share of rank-time blocked in the K/V exchange, and the earlier
  // tokens whose K/V crossed between ranks per step (all ranks).
  j["kv_wait_fraction"] = step_total_seconds_ > 0 ? kv_wait_seconds_ / step_total_seconds_ : 0.0;
  j["kv_tokens_per_step"] = steps_.empty() ? 0.0 : double(kv_tokens_) / double(steps());
  // Every byte is counted by its sender and its receiver.
  j["kv_bytes_per_step"] = steps_.empty() ? 0.0 : double(kv_bytes_) / 2.0 / double(steps());
  // Sharded parameters: the share of rank-time blocked on the units' gathers and reduce-scatters
  // (the ranks meet there at every unit, so imbalance shows here as well as in sync_wait).
  j["gather_wait_fraction"] = step_total_seconds_ > 0 ? gather_wait_seconds_ / step_total_seconds_ : 0.0;
  j["scatter_wait_fraction"] = step_total_seconds_ > 0 ? scatter_wait_seconds_ / step_total_seconds_ : 0.0;

  StragglerVerdict v = straggler();
  j["straggler_rank"] = v.rank;
  json detail;
  detail["candidate"] = v.candidate;
  detail["steps_last"] = v.steps_last;
  detail["share"] = v.share;
  detail["threshold"] = v.threshold;
  detail["mean_lag_seconds"] = v.mean_lag_seconds;
  detail["phase"] = v.phase;
  detail["phase_excess_seconds"] = v.phase_excess_seconds;
  detail["named"] = v.rank >= 0;
  detail["kv_wait_for_rank"] = v.kv_wait_for_rank;
  j["straggler"] = detail;
  json last_share = json::array();
  for (int r = 0; r < world_size_; ++r)
    last_share.push_back(steps_.empty() ? 0.0 : double(last_counts_[r]) / double(steps()));
  j["last_arrival_share"] = last_share;

  json mem;
  json rss = json::array(), dev = json::array();
  uint64_t rss_max = 0, rss_min = UINT64_MAX, dev_max = 0, dev_min = UINT64_MAX;
  for (int r = 0; r < world_size_; ++r) {
    rss.push_back(peak_rss_[r]);
    dev.push_back(device_peak_[r]);
    rss_max = std::max(rss_max, peak_rss_[r]);
    rss_min = std::min(rss_min, peak_rss_[r]);
    dev_max = std::max(dev_max, device_peak_[r]);
    dev_min = std::min(dev_min, device_peak_[r]);
  }
  mem["peak_rss_bytes"] = rss;
  mem["rss_max_min_ratio"] = rss_min > 0 ? double(rss_max) / double(rss_min) : 0.0;
  if (dev_max > 0) {
    mem["device_peak_bytes"] = dev;
    mem["device_max_min_ratio"] = dev_min > 0 ? double(dev_max) / double(dev_min) : 0.0;
  }
  j["memory"] = mem;

  json stall_json;
  std::vector<Stall> st = stalls();
  stall_json["factor"] = stall_factor_;
  stall_json["count"] = st.size();
  stall_json["period"] = stall_period();
  json list = json::array();
  for (size_t i = 0; i < st.size() && i < kMaxStallsListed; ++i)
    list.push_back({{"step", st[i].step}, {"seconds", st[i].seconds}, {"phase", st[i].phase},
                    {"excess_seconds", st[i].excess_seconds}});
  stall_json["steps"] = list;
  j["stalls"] = stall_json;

  json means;
  for (int c = 0; c < kNumComponents; ++c) {
    json per_rank = json::array();
    for (int r = 0; r < world_size_; ++r) per_rank.push_back(component_mean(r, c));
    means[component_name(c)] = per_rank;
  }
  json compute = json::array();
  for (int r = 0; r < world_size_; ++r) compute.push_back(compute_mean(r));
  means["compute"] = compute;
  json step_total = json::array();
  for (int r = 0; r < world_size_; ++r)
    step_total.push_back(compute_mean(r) + component_mean(r, kCompCommExposed) + component_mean(r, kCompKvWait) +
                         component_mean(r, kCompGatherWait) + component_mean(r, kCompScatterWait));
  means["step_total"] = step_total;
  j["phase_means_seconds"] = means;
  return j;
}

}  // namespace kilter::diag
