// The K/V exchange of cut pieces over MPI (issue 23; docs/comm.md, "K/V exchange"): what one
// micro-batch sends and receives each layer (KvSchedule, built from the plan by
// lib/train/cut_schedule.h) and MpiKvExchange, the model::KvExchange a backend calls layer by
// layer (lib/model/kv_exchange.h), on a communicator of its own, nonblocking, with every wait
// bounded by comm.timeout_s.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lib/model/kv_exchange.h"

namespace kilter::comm {

// A run of consecutive rows of one piece of this micro-batch that travels to or from one peer.
struct KvRun {
  int32_t piece = 0;  // the batch piece (index into Batch::cu_seqlens segments)
  int32_t row = 0;    // KvSchedule::later: first row of the batch (0..N); earlier: first row of the piece's prefix
  int32_t rows = 0;
};

// One peer rank and the runs exchanged with it, in the order both sides list them (the step's
// cut pieces in order, one run per piece at most): its messages are those runs concatenated.
struct KvPeer {
  int rank = 0;
  std::vector<KvRun> runs;
  int64_t rows() const;
};

// Where a batch piece lies in its document (for messages and diagnostics).
struct KvPieceInfo {
  uint64_t doc = 0;
  uint32_t piece_start = 0;  // the whole piece's first token in the document
  uint32_t offset = 0;       // this part's first token in its piece (= its prefix rows)
  uint32_t len = 0;
  bool cut = false;          // a part of a piece cut between ranks
};

// What one micro-batch exchanges each layer (the same every layer).
struct KvSchedule {
  int64_t step = 0;   // the optimizer step (messages)
  uint32_t slot = 0;  // the local micro-batch index, the same on every rank holding a part
  // Ranks holding later parts of this micro-batch's pieces: the forward sends them the k|v of
  // these own rows, the backward receives their dk|dv for the same rows and adds it.
  std::vector<KvPeer> later;
  // Ranks holding earlier parts of this micro-batch's later parts: the forward receives their
  // k|v into each piece's prefix, the backward sends the prefix's dk|dv back to them.
  std::vector<KvPeer> earlier;
  std::vector<KvPieceInfo> pieces;  // per batch piece
  bool empty() const { return later.empty() && earlier.empty(); }
  // Earlier tokens whose K/V this micro-batch receives (the sum of its pieces' offsets): the
  // metrics' kv_tokens.
  int64_t kv_tokens() const;
  // Rows of this micro-batch's own K/V sent per layer (a row counts once per receiving peer).
  int64_t sent_rows() const;
  // Floats received into the prefixes per layer and direction: kv_tokens() x 2C.
  // Bytes that cross the link per step, both directions, all layers: what docs/comm.md sizes.
  int64_t bytes_per_step(int n_layer, int n_embd) const;
  // "document D, tokens [a, b) (part at offset s of the piece at token T)" of batch piece p.
  std::string describe_piece(int piece) const;
};

// A wait of the exchange, as reported to diagnostics: [begin_ns, end_ns) on the steady clock,
// the layer, the direction, and the peer (and one of the pieces) that arrived last.
struct KvWaitEvent {
  int layer = 0;
  bool backward = false;
  int64_t begin_ns = 0;
  int64_t end_ns = 0;
  int last_rank = -1;   // the peer whose message completed the wait (-1: nothing to wait for)
  int last_piece = -1;  // a batch piece that peer's message carried
};

struct KvExchangeOptions {
  int n_layer = 0;
  int n_embd = 0;
  double timeout_s = 300;  // [comm] timeout_s; <= 0: wait forever
  std::function<void(const KvWaitEvent&)> on_wait;  // optional
};

// One micro-batch's exchange. Every call of kv_exchange.h's order posts or waits; the receives
// of a layer are posted together with its sends, so every rank posts before it waits. Messages
// go one per (peer, layer, direction), tagged (slot, layer, direction) within MPI_TAG_UB. The
// prefix K/V of every layer are kept from its forward_wait to its backward_wait_add (docs/comm.md
// gives the memory). A wait longer than timeout_s throws kilter::Error naming the ranks that did
// not deliver, the layer, the step and the pieces.
class MpiKvExchange final : public model::KvExchange {
 public:
  // `comm`: the exchange's own communicator (the trainer's duplicate of the training one),
  // ranks as in the schedule.
  MpiKvExchange(MPI_Comm comm, KvSchedule schedule, const KvExchangeOptions& opts);
  // Requests still open (an error unwinds) are cancelled where they are receives and otherwise
  // left to the abort that follows.
  ~MpiKvExchange() override;
  MpiKvExchange(const MpiKvExchange&) = delete;
  MpiKvExchange& operator=(const MpiKvExchange&) = delete;

  void forward_send(int layer, const float* qkv) override;
  void forward_wait(int layer) override;
  const float* prefix_kv(int layer, int piece) override;
  float* prefix_dkv(int layer, int piece) override;
  void backward_send(int layer) override;
  void backward_wait_add(int layer, float* dqkv) override;
  // Waits (bounded) for this micro-batch's sends still in flight; call after the last layer's
  // backward_wait_add, before the buffers the backend gave may change.
  void finish();

  const KvSchedule& schedule() const { return schedule_; }
  // Seconds spent blocked in forward_wait / backward_wait_add so far.
  double wait_seconds() const { return wait_seconds_; }

 private:
  struct Impl;
  KvSchedule schedule_;
  std::unique_ptr<Impl> impl_;
  double wait_seconds_ = 0;
};

// MPI tags of the exchange: (slot mod slots_per_tag_range, layer, direction) packed under
// MPI_TAG_UB of `comm`. Throws when 2 x n_layer tags do not fit.
int kv_exchange_tag(MPI_Comm comm, uint32_t slot, int layer, bool backward, int n_layer);

}  // namespace kilter::comm
