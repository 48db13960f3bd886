// The K/V exchange of cut pieces, what its implementations share: the schedule of one
// micro-batch (KvSchedule: which rows go to and come from which rank each layer, built from the
// plan by lib/train/cut_schedule.h), the wait events diagnostics time, and CutExchange, the
// model::KvExchange a trainer drives one micro-batch at a time. Implementations:
// kv_exchange_mpi.h (host buffers, MPI point-to-point) and kv_exchange_nccl.h (device buffers,
// NCCL send/recv).
#pragma once
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lib/model/kv_exchange.h"
#include "lib/model/spec.h"

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
  // Bytes that cross the link per step, both directions, all layers, at kv_width floats of K and V
  // per token and layer (model::KvRowLayout): what docs/comm.md sizes.
  int64_t bytes_per_step(int n_layer, int kv_width) const;
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

// The event of a wait over [begin_ns, end_ns); `last`: the index into `peers` of the peer whose
// message completed it (-1: there was nothing to wait for).
KvWaitEvent kv_wait_event(int layer, bool backward, int64_t begin_ns, int64_t end_ns, const std::vector<KvPeer>& peers,
                          int last);

struct KvExchangeOptions {
  int n_layer = 0;
  model::KvRowLayout rows;  // where K and V sit in the backend's q|k|v rows (model::kv_row_layout)
  double timeout_s = 300;  // [comm] timeout_s; <= 0: wait forever
  std::function<void(const KvWaitEvent&)> on_wait;  // optional
};

// Throws kilter::Error unless the options describe a model (layers, and K/V columns inside rows).
void check_kv_options(const KvExchangeOptions& opts);

// The message of a wait that timed out: the step, micro-batch, layer and direction, the ranks
// that did not deliver (`missing`: indices into schedule.earlier for the forward, into
// schedule.later for the backward) and the pieces in document tokens.
std::string describe_missing_kv(const KvSchedule& schedule, int rank, int layer, bool backward,
                                const std::vector<int>& missing, double timeout_s);

// One micro-batch's exchange, as the trainer holds it.
class CutExchange : public model::KvExchange {
 public:
  // Waits (bounded by the timeout) for this micro-batch's sends still in flight; call after the
  // last layer's backward_wait_add, before the buffers the backend gave may change.
  virtual void finish() = 0;
  virtual const KvSchedule& schedule() const = 0;
  // Seconds spent blocked in forward_wait / backward_wait_add so far.
  virtual double wait_seconds() const = 0;
};

using CutExchangeFactory = std::function<std::unique_ptr<CutExchange>(KvSchedule, const KvExchangeOptions&)>;
// The one place that picks the exchange (lib/comm/kv_exchange_select.cpp): "mpi" (host buffers,
// on `comm`) or "nccl" (device buffers: an NCCL communicator made now from `comm`, collectively;
// built only with KILTER_WITH_NCCL). `comm` must outlive the factory.
CutExchangeFactory kv_exchange_factory(const std::string& kind, MPI_Comm comm, double timeout_s);

}  // namespace kilter::comm
