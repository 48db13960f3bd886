// Guards of a training run (see guards.h): cross-rank agreement on config and version, config
// key differences, and the fault-injection test hook.
#include "lib/train/guards.h"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include <thread>
#include <utility>

#include "io/base/error.h"
#include "io/text_format.h"
#include "lib/core/config.h"
#include "lib/train/signals.h"

namespace kilter::train {
namespace {

// "section.key" -> value, in file order, from a resolved INI text.
using IniEntries = std::vector<std::pair<std::string, std::string>>;

IniEntries parse_ini_entries(const std::string& text) { return ini_entries(text); }

std::string render_ini(const IniEntries& entries) {
  std::string text, section;
  for (const auto& [key, value] : entries) {
    auto dot = key.find('.');
    std::string sec = key.substr(0, dot);
    if (sec != section) {
      text += "[" + sec + "]\n";
      section = sec;
    }
    text += key.substr(dot + 1) + " = " + value + "\n";
  }
  return text;
}

const std::string* find_value(const IniEntries& entries, const std::string& key) {
  for (const auto& e : entries)
    if (e.first == key) return &e.second;
  return nullptr;
}

struct RankIdentity {
  uint64_t config_hash;
  char version[56];
};

}  // namespace

std::vector<std::string> config_differences(const std::string& ini_a, const std::string& ini_b, bool only_hashed) {
  const IniEntries a = parse_ini_entries(ini_a), b = parse_ini_entries(ini_b);
  bool can_hash = only_hashed;
  uint64_t hash_a = 0;
  if (can_hash) {
    try {
      hash_a = config_from_ini_text(ini_a).hash();
    } catch (const Error&) {
      can_hash = false;  // a text this kilter cannot parse (another version): list every difference
    }
  }
  std::vector<std::string> lines;
  auto consider = [&](const std::string& key, const std::string* va, const std::string* vb) {
    if (va && vb && *va == *vb) return;
    if (can_hash && va && vb) {
      // The key matters when giving `a` b's value for it changes a's hash.
      IniEntries changed = a;
      for (auto& e : changed)
        if (e.first == key) e.second = *vb;
      // train.shard_optimizer is train.shard's alias: the pair changes together (alone, one of
      // them would contradict the other and the text would not parse).
      const bool sharded = key == "train.shard" ? *vb != "none" : (*vb == "1" || *vb == "true");
      for (auto& e : changed) {
        if (key == "train.shard" && e.first == "train.shard_optimizer") e.second = sharded ? "1" : "0";
        if (key == "train.shard_optimizer" && e.first == "train.shard" && sharded != (e.second != "none"))
          e.second = sharded ? "optimizer" : "none";
      }
      try {
        if (config_from_ini_text(render_ini(changed)).hash() == hash_a) return;
      } catch (const Error&) {
      }
    }
    lines.push_back(key + " = " + (va ? *va : "(absent)") + " vs " + (vb ? *vb : "(absent)"));
  };
  for (const auto& [key, value] : a) consider(key, &value, find_value(b, key));
  for (const auto& [key, value] : b)
    if (!find_value(a, key)) consider(key, nullptr, &value);
  return lines;
}

void check_consistent_across_ranks(MPI_Comm world, uint64_t config_hash, const std::string& version,
                                   const std::string& config_ini) {
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  RankIdentity mine{};
  mine.config_hash = config_hash;
  std::snprintf(mine.version, sizeof(mine.version), "%s", version.c_str());
  std::vector<RankIdentity> all(size_t(size), RankIdentity{});
  MPI_Allgather(&mine, sizeof(RankIdentity), MPI_BYTE, all.data(), sizeof(RankIdentity), MPI_BYTE, world);

  // Which config texts to compare: gathered only when the caller passed one (every rank must
  // make the same choice, which it does when all run the same trainer code).
  std::vector<std::string> texts;
  if (!config_ini.empty()) {
    int length = int(config_ini.size());
    std::vector<int> lengths(static_cast<size_t>(size)), displs(static_cast<size_t>(size));
    MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, world);
    int total = 0;
    for (int r = 0; r < size; ++r) {
      displs[size_t(r)] = total;
      total += lengths[size_t(r)];
    }
    std::string joined(size_t(total), '\0');
    MPI_Allgatherv(config_ini.data(), length, MPI_CHAR, joined.data(), lengths.data(), displs.data(), MPI_CHAR, world);
    for (int r = 0; r < size; ++r) texts.push_back(joined.substr(size_t(displs[size_t(r)]), size_t(lengths[size_t(r)])));
  }

  std::map<uint64_t, std::vector<int>> by_hash;
  std::map<std::string, std::vector<int>> by_version;
  for (int r = 0; r < size; ++r) {
    by_hash[all[size_t(r)].config_hash].push_back(r);
    by_version[all[size_t(r)].version].push_back(r);
  }
  if (by_hash.size() == 1 && by_version.size() == 1) return;

  std::ostringstream msg;
  msg << "ranks disagree on " << (by_hash.size() > 1 ? "the configuration" : "")
      << (by_hash.size() > 1 && by_version.size() > 1 ? " and " : "")
      << (by_version.size() > 1 ? "the kilter version" : "")
      << " (every rank must run the same kilter with the same config and overrides):";
  if (by_hash.size() > 1) {
    for (const auto& [hash, ranks] : by_hash) {
      char hex[24];
      std::snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)hash);
      msg << "\n  config hash " << hex << ": ranks " << io::rank_list_text(ranks);
    }
    if (!texts.empty()) {
      // Each group's first rank against rank 0's group.
      const int reference = 0;
      for (const auto& [hash, ranks] : by_hash) {
        if (hash == all[size_t(reference)].config_hash) continue;
        auto diffs = config_differences(texts[size_t(reference)], texts[size_t(ranks.front())], true);
        msg << "\n  keys where rank " << ranks.front() << " differs from rank " << reference << " (rank " << reference
            << "'s value vs rank " << ranks.front() << "'s):";
        if (diffs.empty()) msg << " none (another kilter build?)";
        for (const auto& d : diffs) msg << "\n    " << d;
      }
    }
  }
  if (by_version.size() > 1)
    for (const auto& [v, ranks] : by_version) msg << "\n  kilter version " << v << ": ranks " << io::rank_list_text(ranks);
  KILTER_FAIL(msg.str());
}

namespace {
// The fault-injection variables, read once.
struct TestHook {
  bool active = false;
  int rank = -1;
  int64_t step = -1;
  std::string mode = "error";
};

const TestHook& test_hook() {
  static const TestHook hook = [] {
    TestHook h;
    const char* r = std::getenv("KILTER_TEST_FAIL_RANK");
    const char* s = std::getenv("KILTER_TEST_FAIL_STEP");
    const char* m = std::getenv("KILTER_TEST_FAIL_MODE");
    if (r && s && *r && *s) {
      h.active = true;
      h.rank = std::atoi(r);
      h.step = std::atoll(s);
      if (m && *m) h.mode = m;
    }
    return h;
  }();
  return hook;
}
}  // namespace

bool nonfinite_gradient_injected_for_test(int rank, int64_t step) {
  const TestHook& hook = test_hook();
  if (!hook.active || hook.mode != "nonfinite" || hook.rank != rank || hook.step != step) return false;
  std::fprintf(stderr, "kilter: rank %d: KILTER_TEST_FAIL_MODE=nonfinite at step %lld: this rank's gradient is made NaN (test hook)\n",
               rank, (long long)step);
  return true;
}

void maybe_fail_for_test(int rank, int64_t step) {
  const TestHook& hook = test_hook();
  if (!hook.active || hook.rank != rank || hook.step != step) return;
  if (hook.mode == "exit") {
    std::fprintf(stderr, "kilter: rank %d: KILTER_TEST_FAIL_MODE=exit at step %lld: exiting with code 3 (test hook)\n",
                 rank, (long long)step);
    std::fflush(stderr);
    std::_Exit(3);
  }
  if (hook.mode == "sigusr1") {
    // A deterministic preemption: the signal handler's flag is seen in this step's allreduce.
    std::fprintf(stderr, "kilter: rank %d: KILTER_TEST_FAIL_MODE=sigusr1 at step %lld: raising SIGUSR1 (test hook)\n",
                 rank, (long long)step);
    std::fflush(stderr);
    raise_stop_signal_for_test(SIGUSR1);
    return;
  }
  if (hook.mode == "hang") {
    std::fprintf(stderr, "kilter: rank %d: KILTER_TEST_FAIL_MODE=hang at step %lld: this rank stops (test hook)\n",
                 rank, (long long)step);
    std::fflush(stderr);
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  if (hook.mode == "nonfinite") return;  // compute_gradients asks nonfinite_gradient_injected_for_test
  if (hook.mode == "kv_exit" || hook.mode == "kv_hang" || hook.mode == "kv_hang_backward")
    return;  // kv_exchange_for_test
  KILTER_CHECK(hook.mode == "error", "KILTER_TEST_FAIL_MODE=" << hook.mode
                                                              << " is not one of error, exit, hang, sigusr1, nonfinite, "
                                                                 "kv_exit, kv_hang, kv_hang_backward");
  KILTER_FAIL("injected failure at step " << step << " (test hook KILTER_TEST_FAIL_RANK=" << rank
                                          << " KILTER_TEST_FAIL_STEP=" << step << ")");
}

namespace {

// The exchange of kv_exchange_for_test: forwards every call, and fails in forward_send of
// `layer_` (a rank holding an earlier part), or with `backward` in backward_send of `layer_` (a
// rank holding a later part, before it sends the dK/dV of its prefixes).
class FailingKvExchange final : public comm::CutExchange {
 public:
  FailingKvExchange(std::unique_ptr<comm::CutExchange> inner, int rank, int layer, bool exit, bool backward = false)
      : inner_(std::move(inner)), rank_(rank), layer_(layer), exit_(exit), backward_(backward) {}

  void forward_send(int layer, const float* qkv) override {
    if (!backward_ && layer == layer_) fail();
    inner_->forward_send(layer, qkv);
  }
  void forward_wait(int layer) override { inner_->forward_wait(layer); }
  const float* prefix_kv(int layer, int piece) override { return inner_->prefix_kv(layer, piece); }
  float* prefix_dkv(int layer, int piece) override { return inner_->prefix_dkv(layer, piece); }
  void backward_send(int layer) override {
    if (backward_ && layer == layer_) fail();
    inner_->backward_send(layer);
  }
  void backward_wait_add(int layer, float* dqkv) override { inner_->backward_wait_add(layer, dqkv); }
  void finish() override { inner_->finish(); }
  const comm::KvSchedule& schedule() const override { return inner_->schedule(); }
  double wait_seconds() const override { return inner_->wait_seconds(); }

 private:
  [[noreturn]] void fail() const {
    const comm::KvSchedule& s = inner_->schedule();
    std::string sends;
    for (const comm::KvPeer& peer : backward_ ? s.earlier : s.later)
      for (const comm::KvRun& run : peer.runs)
        sends += "; to rank " + std::to_string(peer.rank) + ": " + s.describe_piece(run.piece);
    std::fprintf(stderr,
                 "kilter: rank %d: KILTER_TEST_FAIL_MODE=%s at step %lld, micro-batch %u, layer %d, before sending the "
                 "%s%s: %s (test hook)\n",
                 rank_, backward_ ? "kv_hang_backward" : exit_ ? "kv_exit" : "kv_hang", (long long)s.step, s.slot,
                 layer_, backward_ ? "dK/dV of its later parts' prefixes" : "K/V of its earlier parts", sends.c_str(),
                 exit_ ? "exiting with code 3" : "this rank stops");
    std::fflush(stderr);
    if (exit_) std::_Exit(3);
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }

  std::unique_ptr<comm::CutExchange> inner_;
  int rank_, layer_;
  bool exit_, backward_;
};

}  // namespace

std::unique_ptr<comm::CutExchange> kv_exchange_for_test(std::unique_ptr<comm::CutExchange> exchange, int rank,
                                                        int64_t step, int n_layer) {
  const TestHook& hook = test_hook();
  if (!hook.active || hook.rank != rank || step < hook.step || !exchange) return exchange;
  if (hook.mode == "kv_hang_backward") {
    if (exchange->schedule().earlier.empty()) return exchange;  // no later part here
    return std::make_unique<FailingKvExchange>(std::move(exchange), rank, n_layer / 2, false, true);
  }
  if ((hook.mode != "kv_exit" && hook.mode != "kv_hang") || exchange->schedule().later.empty()) return exchange;
  return std::make_unique<FailingKvExchange>(std::move(exchange), rank, n_layer / 2, hook.mode == "kv_exit");
}

}  // namespace kilter::train
