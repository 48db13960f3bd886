// A KvExchange (lib/model/kv_exchange.h) between models running in std::threads of one process,
// for tests: each thread is a "rank", the K/V rows and dK/dV of cut pieces go through mailboxes
// guarded by one mutex and condition variable. It is the reference the MPI exchange is compared
// with: the same contract, no transport. It also checks the contract's order of calls per rank
// (forward_send then forward_wait for layers 0..L-1, then backward_send then backward_wait_add
// for layers L-1..0; prefix_kv only between forward_wait and backward_wait_add of its layer) and
// records every violation in errors().
// cut_batches() splits a packed batch of whole pieces into the ranks' micro-batches and the cut
// pieces' parts the hub needs.
#pragma once
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "io/base/error.h"
#include "lib/model/gemm.h"
#include "lib/model/kv_exchange.h"
#include "lib/model/model.h"

namespace kilter::model::testing {

// One part of a cut piece: rows [first_row, first_row + len) of `rank`'s micro-batch, its piece
// `local_piece` there, tokens [offset, offset + len) of the cut piece.
struct CutPartSpec {
  int rank = 0;
  int local_piece = 0;
  int first_row = 0;
  int offset = 0;
  int len = 0;
};

class ThreadKvHub {
 public:
  // cuts: per cut piece, its parts in token order (offsets contiguous from 0). Waits give up
  // after `timeout` (a broken contract would otherwise hang the test) and throw kilter::Error.
  // rows: where K and V sit in the backends' q|k|v rows (model::kv_row_layout).
  ThreadKvHub(int ranks, int n_layer, model::KvRowLayout rows, std::vector<std::vector<CutPartSpec>> cuts,
              std::chrono::milliseconds timeout = std::chrono::seconds(120))
      : n_layer_(n_layer), rows_(rows), cuts_(std::move(cuts)), timeout_(timeout) {
    const size_t row = static_cast<size_t>(rows_.kv_width);
    for (size_t c = 0; c < cuts_.size(); ++c) {
      const std::vector<CutPartSpec>& parts = cuts_[c];
      KILTER_CHECK(parts.size() >= 2, "ThreadKvHub: cut " << c << " has fewer than 2 parts");
      int tokens = 0;
      for (size_t k = 0; k < parts.size(); ++k) {
        KILTER_CHECK(parts[k].offset == tokens && parts[k].len > 0,
                     "ThreadKvHub: cut " << c << " part " << k << " is not contiguous with the ones before");
        tokens += parts[k].len;
      }
      Cut cut;
      cut.kv.assign(n_layer, std::vector<float>(static_cast<size_t>(tokens) * row, 0.0f));
      cut.dkv.resize(parts.size());
      for (size_t k = 1; k < parts.size(); ++k)
        cut.dkv[k].assign(n_layer, std::vector<float>(static_cast<size_t>(parts[k].offset) * row, 0.0f));
      cut.kv_posted.assign(parts.size(), std::vector<char>(n_layer, 0));
      cut.dkv_posted.assign(parts.size(), std::vector<char>(n_layer, 0));
      cuts_state_.push_back(std::move(cut));
    }
    for (int r = 0; r < ranks; ++r) endpoints_.push_back(std::make_unique<Endpoint>(this, r));
  }

  // The exchange rank `rank`'s micro-batch uses (Batch::exchange).
  KvExchange* endpoint(int rank) { return endpoints_.at(rank).get(); }

  // Contract violations seen, "rank r: what" (empty when every rank kept the order).
  std::vector<std::string> errors() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return errors_;
  }

 private:
  struct Cut {
    std::vector<std::vector<float>> kv;                // per layer: tokens x (k | v)
    std::vector<std::vector<std::vector<float>>> dkv;  // per part > 0, per layer: offset x (dk | dv)
    std::vector<std::vector<char>> kv_posted;          // per part, per layer
    std::vector<std::vector<char>> dkv_posted;         // per part > 0, per layer
  };

  class Endpoint final : public KvExchange {
   public:
    Endpoint(ThreadKvHub* hub, int rank) : hub_(hub), rank_(rank) {
      for (size_t c = 0; c < hub->cuts_.size(); ++c)
        for (size_t k = 0; k < hub->cuts_[c].size(); ++k)
          if (hub->cuts_[c][k].rank == rank) parts_.push_back({static_cast<int>(c), static_cast<int>(k)});
    }

    void forward_send(int layer, const float* qkv) override {
      expect("forward_send", layer, Stage::forward_send);
      const model::KvRowLayout& rows = hub_->rows_;
      for (const PartRef& ref : parts_) {
        const CutPartSpec& part = hub_->cuts_[ref.cut][ref.part];
        float* kv = hub_->cuts_state_[ref.cut].kv[layer].data() + static_cast<size_t>(part.offset) * rows.kv_width;
        for (int i = 0; i < part.len; ++i)
          std::memcpy(kv + static_cast<size_t>(i) * rows.kv_width,
                      qkv + static_cast<size_t>(part.first_row + i) * rows.row_width + rows.kv_offset,
                      sizeof(float) * rows.kv_width);
      }
      std::lock_guard<std::mutex> lock(hub_->mutex_);
      for (const PartRef& ref : parts_) hub_->cuts_state_[ref.cut].kv_posted[ref.part][layer] = 1;
      hub_->changed_.notify_all();
    }

    void forward_wait(int layer) override {
      expect("forward_wait", layer, Stage::forward_wait);
      hub_->wait_for(rank_, "forward_wait", layer, [&] {
        for (const PartRef& ref : parts_)
          for (int j = 0; j < ref.part; ++j)
            if (!hub_->cuts_state_[ref.cut].kv_posted[j][layer]) return false;
        return true;
      });
    }

    const float* prefix_kv(int layer, int piece) override {
      const PartRef ref = later_part(layer, piece, "prefix_kv");
      return hub_->cuts_state_[ref.cut].kv[layer].data();
    }

    float* prefix_dkv(int layer, int piece) override {
      const PartRef ref = later_part(layer, piece, "prefix_dkv");
      // Written by the layer's attention backward, before its backward_send.
      const bool before_send = layer == hub_->n_layer_ - 1 ? (stage_ == Stage::forward_wait && layer_ == layer)
                                                           : (stage_ == Stage::backward_wait_add && layer_ == layer + 1);
      if (!before_send) hub_->error(rank_, "prefix_dkv(" + std::to_string(layer) + ") outside its layer's backward");
      return hub_->cuts_state_[ref.cut].dkv[ref.part][layer].data();
    }

    void backward_send(int layer) override {
      expect("backward_send", layer, Stage::backward_send);
      std::lock_guard<std::mutex> lock(hub_->mutex_);
      for (const PartRef& ref : parts_)
        if (ref.part > 0) hub_->cuts_state_[ref.cut].dkv_posted[ref.part][layer] = 1;
      hub_->changed_.notify_all();
    }

    void backward_wait_add(int layer, float* dqkv) override {
      expect("backward_wait_add", layer, Stage::backward_wait_add);
      hub_->wait_for(rank_, "backward_wait_add", layer, [&] {
        for (const PartRef& ref : parts_)
          for (size_t j = ref.part + 1; j < hub_->cuts_[ref.cut].size(); ++j)
            if (!hub_->cuts_state_[ref.cut].dkv_posted[j][layer]) return false;
        return true;
      });
      // Each later part's dK/dV of this part's tokens, added in part order.
      const model::KvRowLayout& rows = hub_->rows_;
      for (const PartRef& ref : parts_) {
        const std::vector<CutPartSpec>& parts = hub_->cuts_[ref.cut];
        const CutPartSpec& mine = parts[ref.part];
        for (size_t j = ref.part + 1; j < parts.size(); ++j) {
          const float* dkv = hub_->cuts_state_[ref.cut].dkv[j][layer].data();
          for (int i = 0; i < mine.len; ++i) {
            const float* src = dkv + static_cast<size_t>(mine.offset + i) * rows.kv_width;
            float* dst = dqkv + static_cast<size_t>(mine.first_row + i) * rows.row_width + rows.kv_offset;
            for (int c = 0; c < rows.kv_width; ++c) dst[c] += src[c];
          }
        }
      }
    }

   private:
    enum class Stage { none, forward_send, forward_wait, backward_send, backward_wait_add };
    struct PartRef {
      int cut = 0, part = 0;
    };

    // Checks that `call` of `layer` comes next in the contract's order and moves there.
    void expect(const char* call, int layer, Stage stage) {
      const int L = hub_->n_layer_;
      bool ok = false;
      switch (stage) {
        case Stage::forward_send:
          ok = layer == 0 ? (stage_ == Stage::none) : (stage_ == Stage::forward_wait && layer == layer_ + 1);
          break;
        case Stage::forward_wait:
        case Stage::backward_wait_add:
          ok = stage_ == (stage == Stage::forward_wait ? Stage::forward_send : Stage::backward_send) && layer == layer_;
          break;
        case Stage::backward_send:
          ok = layer == L - 1 ? (stage_ == Stage::forward_wait && layer_ == L - 1)
                              : (stage_ == Stage::backward_wait_add && layer == layer_ - 1);
          break;
        case Stage::none:
          break;
      }
      if (!ok) {
        std::ostringstream what;
        what << call << "(" << layer << ") out of order (after stage " << static_cast<int>(stage_) << " of layer "
             << layer_ << ")";
        hub_->error(rank_, what.str());
      }
      stage_ = stage;
      layer_ = layer;
    }

    PartRef later_part(int layer, int piece, const char* call) {
      for (const PartRef& ref : parts_)
        if (hub_->cuts_[ref.cut][ref.part].local_piece == piece && ref.part > 0) {
          // Valid from forward_wait(layer) until backward_wait_add(layer) returns.
          const bool valid = (stage_ == Stage::forward_wait && layer_ >= layer) ||
                             (stage_ == Stage::forward_send && layer_ > layer) ||
                             (stage_ == Stage::backward_send && layer_ >= layer) ||
                             (stage_ == Stage::backward_wait_add && layer_ > layer);
          if (!valid) hub_->error(rank_, std::string(call) + "(" + std::to_string(layer) + ") read outside its validity");
          return ref;
        }
      hub_->error(rank_, std::string(call) + " of piece " + std::to_string(piece) + ", which is no later part");
      KILTER_FAIL("ThreadKvHub: rank " << rank_ << " " << call << " of piece " << piece << ", which is no later part");
    }

    ThreadKvHub* hub_;
    int rank_;
    std::vector<PartRef> parts_;
    Stage stage_ = Stage::none;
    int layer_ = -1;
  };

  template <typename Ready>
  void wait_for(int rank, const char* call, int layer, Ready ready) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!changed_.wait_for(lock, timeout_, ready)) {
      const std::string what = std::string(call) + "(" + std::to_string(layer) + ") timed out";
      errors_.push_back("rank " + std::to_string(rank) + ": " + what);
      KILTER_FAIL("ThreadKvHub: rank " << rank << " " << what);
    }
  }

  void error(int rank, const std::string& what) {
    std::lock_guard<std::mutex> lock(mutex_);
    errors_.push_back("rank " + std::to_string(rank) + ": " + what);
  }

  int n_layer_;
  model::KvRowLayout rows_;
  std::vector<std::vector<CutPartSpec>> cuts_;
  std::chrono::milliseconds timeout_;
  std::vector<Cut> cuts_state_;
  std::vector<std::unique_ptr<Endpoint>> endpoints_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::string> errors_;
};

// One rank's share of a piece of a whole batch: its tokens [begin, end); end = -1: to the end.
struct RankPart {
  int piece = 0;
  int begin = 0;
  int end = -1;
};

struct CutBatches {
  std::vector<Batch> batches;                   // per rank, exchange not yet set
  std::vector<std::vector<CutPartSpec>> cuts;   // per cut piece, for ThreadKvHub
};

// Splits `whole` (a packed batch of whole pieces) into the ranks' micro-batches: rank r's pieces
// are ranks[r] in that order. A piece given whole to one rank stays uncut; a piece shared among
// ranks becomes a cut piece whose later parts get pos_offset = begin. Every token of `whole`
// must land exactly once.
inline CutBatches cut_batches(const Batch& whole, const std::vector<std::vector<RankPart>>& ranks) {
  CutBatches out;
  std::vector<std::vector<CutPartSpec>> parts_of(whole.num_pieces());
  for (size_t r = 0; r < ranks.size(); ++r) {
    Batch batch;
    batch.clear();
    for (const RankPart& share : ranks[r]) {
      const int len = whole.piece_len(share.piece);
      const int end = share.end < 0 ? len : share.end;
      KILTER_CHECK(share.begin >= 0 && share.begin < end && end <= len, "cut_batches: bad part of piece " << share.piece);
      const int first = whole.cu_seqlens[share.piece] + share.begin;
      CutPartSpec part;
      part.rank = static_cast<int>(r);
      part.local_piece = batch.num_pieces();
      part.first_row = batch.N;
      part.offset = share.begin;
      part.len = end - share.begin;
      parts_of[share.piece].push_back(part);
      batch.append_piece(whole.inputs.data() + first, whole.targets.data() + first, part.len, 0, share.begin);
    }
    out.batches.push_back(std::move(batch));
  }
  for (int p = 0; p < whole.num_pieces(); ++p) {
    std::vector<CutPartSpec>& parts = parts_of[p];
    std::sort(parts.begin(), parts.end(), [](const CutPartSpec& a, const CutPartSpec& b) { return a.offset < b.offset; });
    int tokens = 0;
    for (const CutPartSpec& part : parts) {
      KILTER_CHECK(part.offset == tokens, "cut_batches: piece " << p << " has a gap or an overlap at token " << tokens);
      tokens += part.len;
    }
    KILTER_CHECK(tokens == whole.piece_len(p), "cut_batches: piece " << p << " is not covered");
    if (parts.size() >= 2) out.cuts.push_back(parts);
  }
  return out;
}

// Runs body(rank) on `ranks` threads and joins them; returns each rank's exception message
// ("" where it returned normally).
inline std::vector<std::string> run_ranks(int ranks, const std::function<void(int)>& body) {
  std::vector<std::string> failures(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (const std::exception& e) {
        failures[r] = e.what()[0] != '\0' ? e.what() : "exception";
      }
    });
  for (std::thread& t : threads) t.join();
  return failures;
}

// One forward_backward per rank: models[r] on setup.batches[r] in its own thread (one GEMM
// thread each), joined by a ThreadKvHub. Returns the losses; `problems` receives each rank's
// exception ("rank R: ...") and every violation of the exchange's contract.
template <typename ModelPtr>
std::vector<double> forward_backward_ranks(const std::vector<ModelPtr>& models, const CutBatches& setup,
                                           float loss_scale, std::vector<std::string>& problems) {
  const int ranks = static_cast<int>(setup.batches.size());
  const ModelSpec& cfg = models.at(0)->config();
  ThreadKvHub hub(ranks, cfg.n_layer, kv_row_layout(cfg), setup.cuts);
  std::vector<Batch> batches = setup.batches;
  for (int r = 0; r < ranks; ++r) batches[r].exchange = hub.endpoint(r);
  std::vector<double> losses(ranks, 0.0);
  const std::vector<std::string> failures = run_ranks(ranks, [&](int r) {
    set_gemm_threads(1);
    losses[r] = models[r]->forward_backward(batches[r], loss_scale, {});
  });
  for (int r = 0; r < ranks; ++r)
    if (!failures[r].empty()) problems.push_back("rank " + std::to_string(r) + ": " + failures[r]);
  for (const std::string& error : hub.errors()) problems.push_back("exchange contract: " + error);
  return losses;
}

}  // namespace kilter::model::testing
