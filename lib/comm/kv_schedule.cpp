// KvSchedule's counts and the messages of a wait that timed out (kv_schedule.h), shared by the
// MPI and NCCL exchanges.
#include "lib/comm/kv_schedule.h"

#include <sstream>

#include "io/base/error.h"

namespace kilter::comm {

int64_t KvPeer::rows() const {
  int64_t n = 0;
  for (const KvRun& r : runs) n += r.rows;
  return n;
}

int64_t KvSchedule::kv_tokens() const {
  int64_t n = 0;
  for (const KvPieceInfo& p : pieces) n += p.offset;
  return n;
}

int64_t KvSchedule::sent_rows() const {
  int64_t n = 0;
  for (const KvPeer& p : later) n += p.rows();
  return n;
}

int64_t KvSchedule::bytes_per_step(int n_layer, int kv_width) const {
  int64_t rows = sent_rows();
  for (const KvPeer& p : earlier) rows += p.rows();
  // Each row travels forward (k|v) and back (dk|dv): 2 x kv_width floats per layer.
  return rows * 2 * int64_t(kv_width) * int64_t(sizeof(float)) * n_layer;
}

void check_kv_options(const KvExchangeOptions& opts) {
  const model::KvRowLayout& r = opts.rows;
  KILTER_CHECK(opts.n_layer > 0 && r.kv_width > 0 && r.kv_offset >= 0 && r.kv_offset + r.kv_width <= r.row_width,
               "K/V exchange: model shape of " << opts.n_layer << " layers, K|V at columns [" << r.kv_offset << ", "
                                               << r.kv_offset + r.kv_width << ") of rows of " << r.row_width);
}

std::string KvSchedule::describe_piece(int piece) const {
  std::ostringstream os;
  if (piece < 0 || size_t(piece) >= pieces.size()) return "no piece";
  const KvPieceInfo& p = pieces[size_t(piece)];
  const uint64_t first = uint64_t(p.piece_start) + p.offset;
  os << "document " << p.doc << ", tokens " << first << "-" << first + p.len - 1 << " (part at offset " << p.offset
     << " of the piece at token " << p.piece_start << ")";
  return os.str();
}

KvWaitEvent kv_wait_event(int layer, bool backward, int64_t begin_ns, int64_t end_ns, const std::vector<KvPeer>& peers,
                          int last) {
  KvWaitEvent e;
  e.layer = layer;
  e.backward = backward;
  e.begin_ns = begin_ns;
  e.end_ns = end_ns;
  if (last >= 0) {
    e.last_rank = peers[size_t(last)].rank;
    e.last_piece = peers[size_t(last)].runs.front().piece;
  }
  return e;
}

std::string describe_missing_kv(const KvSchedule& schedule, int rank, int layer, bool backward,
                                const std::vector<int>& missing, double timeout_s) {
  std::ostringstream os;
  os << "K/V exchange: step " << schedule.step << ", micro-batch " << schedule.slot << ", layer " << layer
     << (backward ? " (backward)" : " (forward)") << ": rank " << rank << " waited " << timeout_s
     << " s (comm.timeout_s) for the " << (backward ? "dK/dV" : "K/V") << " of";
  const std::vector<KvPeer>& peers = backward ? schedule.later : schedule.earlier;
  for (int i : missing) {
    const KvPeer& peer = peers[size_t(i)];
    os << " rank " << peer.rank << " [";
    for (size_t k = 0; k < peer.runs.size(); ++k) {
      const KvRun& run = peer.runs[k];
      os << (k ? "; " : "");
      if (backward) {
        // The later part's gradient for our own rows of this piece.
        os << schedule.describe_piece(run.piece);
      } else {
        const KvPieceInfo& piece = schedule.pieces[size_t(run.piece)];
        os << "document " << piece.doc << ", tokens " << piece.piece_start + uint64_t(run.row) << "-"
           << piece.piece_start + uint64_t(run.row + run.rows) - 1 << ", needed by " << schedule.describe_piece(run.piece);
      }
    }
    os << "]";
  }
  os << "; that rank holds " << (backward ? "a later" : "the earlier")
     << " part of a cut piece and did not deliver it (it died, hung or is that much slower): check its log; raise "
        "comm.timeout_s only if it is merely slow";
  return os.str();
}

}  // namespace kilter::comm
