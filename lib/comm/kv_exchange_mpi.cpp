// MpiKvExchange (kv_exchange_mpi.h). Per layer and direction each peer gets one
// message: forward, the k|v of our rows that its later parts need (packed from qkv's k and v
// columns) and, from each earlier peer, its rows received straight into the pieces' prefixes (an
// indexed datatype over the prefix buffer); backward, the prefixes' dk|dv sent back with the
// same datatype and the later peers' dk|dv for our rows received packed, then added into dqkv in
// peer order (ascending rank), so the sums do not depend on arrival order.
#include "lib/comm/kv_exchange_mpi.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <sstream>
#include <thread>

#include "io/base/error.h"
#include "io/base/mpi_check.h"

namespace kilter::comm {

int kv_exchange_tag(MPI_Comm comm, uint32_t slot, int layer, bool backward, int n_layer) {
  int* tag_ub = nullptr;
  int flag = 0;
  KILTER_MPI_CHECK(MPI_Comm_get_attr(comm, MPI_TAG_UB, &tag_ub, &flag), "MPI_Comm_get_attr(MPI_TAG_UB)");
  // The standard guarantees at least 32767.
  const long upper = flag && tag_ub != nullptr ? long(*tag_ub) : 32767L;
  const long per_slot = 2L * n_layer;
  KILTER_CHECK(n_layer > 0 && per_slot <= upper + 1,
               "K/V exchange: " << n_layer << " layers need " << per_slot << " MPI tags, beyond MPI_TAG_UB = " << upper);
  KILTER_CHECK(layer >= 0 && layer < n_layer, "K/V exchange: layer " << layer << " of " << n_layer);
  // Slots only wrap far beyond any rank's micro-batches of one step; MPI's non-overtaking order
  // per (peer, tag) keeps wrapped ones apart anyway.
  const long slots = (upper + 1) / per_slot;
  return int((long(slot) % slots * n_layer + layer) * 2 + (backward ? 1 : 0));
}

namespace {

using Clock = std::chrono::steady_clock;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

int mpi_int(int64_t n, const char* what) {
  KILTER_CHECK(n >= 0 && n <= INT_MAX, "K/V exchange: " << what << " of " << n << " exceeds MPI's int count");
  return int(n);
}

// Send buffers whose requests were still open when an exchange was destroyed (an error unwinds
// and MPI_Abort follows): MPI may still read them, so they stay allocated. Only the training
// thread creates and destroys exchanges.
std::vector<std::vector<float>>& abandoned_send_buffers() {
  static std::vector<std::vector<float>> buffers;
  return buffers;
}

}  // namespace

struct MpiKvExchange::Impl {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int n_layer = 0;
  int64_t row_width = 0, kv_offset = 0, kv_width = 0;  // the q|k|v rows (model::KvRowLayout)
  double timeout_s = 0;
  std::function<void(const KvWaitEvent&)> on_wait;

  std::vector<int64_t> prefix_base;  // per batch piece: its first row in a layer's prefix buffer
  int64_t prefix_rows = 0;
  std::vector<MPI_Datatype> earlier_types;  // per earlier peer: its runs inside a prefix buffer
  std::vector<int64_t> later_offset;        // per later peer: its first row in a packed buffer
  int64_t later_rows = 0;

  struct Layer {
    std::vector<float> prefix_kv, prefix_dkv;   // prefix_rows x 2C
    std::vector<float> send_kv, recv_dkv;       // later_rows x 2C, packed per later peer
    std::vector<MPI_Request> fwd_recv, fwd_send, bwd_send, bwd_recv;
    bool forward_posted = false, forward_done = false, backward_posted = false, backward_done = false;
  };
  std::vector<Layer> layers;

  ~Impl() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
      for (Layer& l : layers) {
        for (auto* receives : {&l.fwd_recv, &l.bwd_recv})
          for (MPI_Request& r : *receives)
            if (r != MPI_REQUEST_NULL) {
              MPI_Cancel(&r);
              MPI_Request_free(&r);
            }
        bool open_sends = false;
        for (auto* sends : {&l.fwd_send, &l.bwd_send})
          for (MPI_Request& r : *sends)
            if (r != MPI_REQUEST_NULL) {
              int done = 0;
              MPI_Test(&r, &done, MPI_STATUS_IGNORE);
              if (!done) {
                MPI_Request_free(&r);
                open_sends = true;
              }
            }
        if (open_sends) {
          abandoned_send_buffers().push_back(std::move(l.send_kv));
          abandoned_send_buffers().push_back(std::move(l.prefix_dkv));
        }
      }
      for (MPI_Datatype& t : earlier_types)
        if (t != MPI_DATATYPE_NULL) MPI_Type_free(&t);
    }
  }

  int tag(uint32_t slot, int layer, bool backward) const {
    return kv_exchange_tag(comm, slot, layer, backward, n_layer);
  }

  // Frees what completed sends held (drives MPI's progress too); never waits.
  void reap_sends() {
    for (Layer& l : layers) {
      if (!l.fwd_send.empty() && test_all(l.fwd_send)) {
        l.fwd_send.clear();
        std::vector<float>().swap(l.send_kv);
      }
      if (!l.bwd_send.empty() && test_all(l.bwd_send)) {
        l.bwd_send.clear();
        std::vector<float>().swap(l.prefix_dkv);
      }
    }
  }

  static bool test_all(std::vector<MPI_Request>& requests) {
    int done = 0;
    KILTER_MPI_CHECK(MPI_Testall(int(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE),
                     "MPI_Testall (K/V exchange)");
    return done != 0;
  }
};

MpiKvExchange::MpiKvExchange(MPI_Comm comm, KvSchedule schedule, const KvExchangeOptions& opts)
    : schedule_(std::move(schedule)), impl_(new Impl) {
  Impl& d = *impl_;
  KILTER_CHECK(comm != MPI_COMM_NULL, "K/V exchange: MPI_COMM_NULL given");
  check_kv_options(opts);
  d.comm = comm;
  KILTER_MPI_CHECK(MPI_Comm_rank(comm, &d.rank), "MPI_Comm_rank (K/V exchange)");
  d.n_layer = opts.n_layer;
  d.row_width = opts.rows.row_width;
  d.kv_offset = opts.rows.kv_offset;
  d.kv_width = opts.rows.kv_width;
  d.timeout_s = opts.timeout_s;
  d.on_wait = opts.on_wait;
  d.tag(schedule_.slot, 0, true);  // refuses a model whose tags do not fit, before any message

  d.prefix_base.resize(schedule_.pieces.size(), 0);
  for (size_t p = 0; p < schedule_.pieces.size(); ++p) {
    d.prefix_base[p] = d.prefix_rows;
    d.prefix_rows += schedule_.pieces[p].offset;
  }
  const int64_t row_floats = d.kv_width;
  for (const KvPeer& peer : schedule_.earlier) {
    std::vector<int> lengths, displacements;
    for (const KvRun& run : peer.runs) {
      KILTER_CHECK(run.piece >= 0 && size_t(run.piece) < schedule_.pieces.size() && run.rows > 0 && run.row >= 0 &&
                       uint32_t(run.row + run.rows) <= schedule_.pieces[size_t(run.piece)].offset,
                   "K/V exchange: rows " << run.row << "+" << run.rows << " from rank " << peer.rank
                                         << " lie outside the prefix of piece " << run.piece);
      lengths.push_back(mpi_int(run.rows * row_floats, "a run"));
      displacements.push_back(mpi_int((d.prefix_base[size_t(run.piece)] + run.row) * row_floats, "a prefix offset"));
    }
    MPI_Datatype type = MPI_DATATYPE_NULL;
    KILTER_MPI_CHECK(MPI_Type_indexed(int(lengths.size()), lengths.data(), displacements.data(), MPI_FLOAT, &type),
                     "MPI_Type_indexed (K/V exchange)");
    d.earlier_types.push_back(type);
    KILTER_MPI_CHECK(MPI_Type_commit(&d.earlier_types.back()), "MPI_Type_commit (K/V exchange)");
  }
  for (const KvPeer& peer : schedule_.later) {
    d.later_offset.push_back(d.later_rows);
    d.later_rows += peer.rows();
  }
  d.layers.resize(size_t(opts.n_layer));
}

MpiKvExchange::~MpiKvExchange() = default;

namespace {

// Polls `requests` (one per peer) until all completed or timeout_s passed; returns the
// index of the peer whose request completed last (-1 when there was none).
int wait_bounded(std::vector<MPI_Request>& requests, double timeout_s,
                 const std::function<std::string(const std::vector<int>&)>& describe_missing) {
  const Clock::time_point start = Clock::now();
  std::vector<int> indices(requests.size());
  int remaining = 0, last = -1;
  for (const MPI_Request& r : requests) remaining += r != MPI_REQUEST_NULL;
  for (long spins = 0; remaining > 0; ++spins) {
    int count = 0;
    KILTER_MPI_CHECK(MPI_Testsome(int(requests.size()), requests.data(), &count, indices.data(), MPI_STATUSES_IGNORE),
                     "MPI_Testsome (K/V exchange)");
    if (count != MPI_UNDEFINED && count > 0) {
      remaining -= count;
      last = indices[size_t(count) - 1];
      continue;
    }
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    if (timeout_s > 0 && waited > timeout_s) {
      std::vector<int> missing;
      for (size_t i = 0; i < requests.size(); ++i)
        if (requests[i] != MPI_REQUEST_NULL) missing.push_back(int(i));
      KILTER_FAIL(describe_missing(missing));
    }
    // Spin briefly (a message due now), then give the core back: ranks often share cores.
    if (spins > 64) std::this_thread::sleep_for(std::chrono::microseconds(spins > 4096 ? 200 : 20));
  }
  return last;
}

}  // namespace

void MpiKvExchange::forward_send(int layer, const float* qkv) {
  Impl& d = *impl_;
  KILTER_CHECK(layer >= 0 && layer < d.n_layer, "K/V exchange: forward_send of layer " << layer);
  Impl::Layer& l = d.layers[size_t(layer)];
  KILTER_CHECK(!l.forward_posted, "K/V exchange: forward_send(" << layer << ") called twice");
  l.forward_posted = true;
  const int tag = d.tag(schedule_.slot, layer, false);
  const int64_t row_floats = d.kv_width;
  // Receives first: our earlier peers' rows land in the prefixes.
  if (!schedule_.earlier.empty()) {
    l.prefix_kv.assign(size_t(d.prefix_rows * row_floats), 0.0f);
    l.fwd_recv.assign(schedule_.earlier.size(), MPI_REQUEST_NULL);
    for (size_t i = 0; i < schedule_.earlier.size(); ++i)
      KILTER_MPI_CHECK(MPI_Irecv(l.prefix_kv.data(), 1, d.earlier_types[i], schedule_.earlier[i].rank, tag, d.comm,
                                 &l.fwd_recv[i]),
                       "MPI_Irecv (K/V exchange, layer " << layer << ")");
  }
  if (!schedule_.later.empty()) {
    KILTER_CHECK(qkv != nullptr, "K/V exchange: forward_send(" << layer << ") without qkv");
    l.send_kv.resize(size_t(d.later_rows * row_floats));
    l.fwd_send.assign(schedule_.later.size(), MPI_REQUEST_NULL);
    for (size_t i = 0; i < schedule_.later.size(); ++i) {
      float* out = l.send_kv.data() + d.later_offset[i] * row_floats;
      for (const KvRun& run : schedule_.later[i].runs)
        for (int32_t r = 0; r < run.rows; ++r, out += row_floats)
          std::memcpy(out, qkv + (int64_t(run.row) + r) * d.row_width + d.kv_offset, size_t(row_floats) * sizeof(float));
      KILTER_MPI_CHECK(MPI_Isend(l.send_kv.data() + d.later_offset[i] * row_floats,
                                 mpi_int(schedule_.later[i].rows() * row_floats, "a message"), MPI_FLOAT,
                                 schedule_.later[i].rank, tag, d.comm, &l.fwd_send[i]),
                       "MPI_Isend (K/V exchange, layer " << layer << ")");
    }
  }
  d.reap_sends();
}

void MpiKvExchange::forward_wait(int layer) {
  Impl& d = *impl_;
  KILTER_CHECK(layer >= 0 && layer < d.n_layer && d.layers[size_t(layer)].forward_posted,
               "K/V exchange: forward_wait(" << layer << ") before forward_send");
  Impl::Layer& l = d.layers[size_t(layer)];
  const int64_t begin = now_ns();
  const int last = wait_bounded(l.fwd_recv, d.timeout_s, [&](const std::vector<int>& missing) {
    return describe_missing_kv(schedule_, d.rank, layer, false, missing, d.timeout_s);
  });
  l.fwd_recv.clear();
  l.forward_done = true;
  const int64_t end = now_ns();
  wait_seconds_ += double(end - begin) * 1e-9;
  // A direction with no peer is no wait (no slice without a piece in the trace), as in NCCL's.
  if (d.on_wait && !schedule_.earlier.empty())
    d.on_wait(kv_wait_event(layer, false, begin, end, schedule_.earlier, last));
}

const float* MpiKvExchange::prefix_kv(int layer, int piece) {
  Impl& d = *impl_;
  KILTER_CHECK(layer >= 0 && layer < d.n_layer && d.layers[size_t(layer)].forward_done,
               "K/V exchange: prefix_kv(" << layer << ", " << piece << ") before forward_wait");
  KILTER_CHECK(piece >= 0 && size_t(piece) < schedule_.pieces.size() && schedule_.pieces[size_t(piece)].offset > 0,
               "K/V exchange: piece " << piece << " has no prefix");
  Impl::Layer& l = d.layers[size_t(layer)];
  KILTER_CHECK(!l.prefix_kv.empty(), "K/V exchange: prefix_kv(" << layer << ") after backward_wait_add");
  return l.prefix_kv.data() + d.prefix_base[size_t(piece)] * d.kv_width;
}

float* MpiKvExchange::prefix_dkv(int layer, int piece) {
  Impl& d = *impl_;
  KILTER_CHECK(layer >= 0 && layer < d.n_layer && !d.layers[size_t(layer)].backward_posted,
               "K/V exchange: prefix_dkv(" << layer << ", " << piece << ") after backward_send");
  KILTER_CHECK(piece >= 0 && size_t(piece) < schedule_.pieces.size() && schedule_.pieces[size_t(piece)].offset > 0,
               "K/V exchange: piece " << piece << " has no prefix");
  Impl::Layer& l = d.layers[size_t(layer)];
  if (l.prefix_dkv.empty()) l.prefix_dkv.assign(size_t(d.prefix_rows * d.kv_width), 0.0f);
  return l.prefix_dkv.data() + d.prefix_base[size_t(piece)] * d.kv_width;
}

void MpiKvExchange::backward_send(int layer) {
  Impl& d = *impl_;
  KILTER_CHECK(layer >= 0 && layer < d.n_layer && d.layers[size_t(layer)].forward_done,
               "K/V exchange: backward_send(" << layer << ") before its forward_wait");
  Impl::Layer& l = d.layers[size_t(layer)];
  KILTER_CHECK(!l.backward_posted, "K/V exchange: backward_send(" << layer << ") called twice");
  l.backward_posted = true;
  const int tag = d.tag(schedule_.slot, layer, true);
  const int64_t row_floats = d.kv_width;
  if (!schedule_.later.empty()) {
    l.recv_dkv.assign(size_t(d.later_rows * row_floats), 0.0f);
    l.bwd_recv.assign(schedule_.later.size(), MPI_REQUEST_NULL);
    for (size_t i = 0; i < schedule_.later.size(); ++i)
      KILTER_MPI_CHECK(MPI_Irecv(l.recv_dkv.data() + d.later_offset[i] * row_floats,
                                 mpi_int(schedule_.later[i].rows() * row_floats, "a message"), MPI_FLOAT,
                                 schedule_.later[i].rank, tag, d.comm, &l.bwd_recv[i]),
                       "MPI_Irecv (K/V exchange, layer " << layer << ")");
  }
  if (!schedule_.earlier.empty()) {
    // A backend that wrote no gradient into a prefix still sends zeros: the owner waits for it.
    if (l.prefix_dkv.empty()) l.prefix_dkv.assign(size_t(d.prefix_rows * row_floats), 0.0f);
    l.bwd_send.assign(schedule_.earlier.size(), MPI_REQUEST_NULL);
    for (size_t i = 0; i < schedule_.earlier.size(); ++i)
      KILTER_MPI_CHECK(MPI_Isend(l.prefix_dkv.data(), 1, d.earlier_types[i], schedule_.earlier[i].rank, tag, d.comm,
                                 &l.bwd_send[i]),
                       "MPI_Isend (K/V exchange, layer " << layer << ")");
  }
  d.reap_sends();
}

void MpiKvExchange::backward_wait_add(int layer, float* dqkv) {
  Impl& d = *impl_;
  KILTER_CHECK(layer >= 0 && layer < d.n_layer && d.layers[size_t(layer)].backward_posted,
               "K/V exchange: backward_wait_add(" << layer << ") before backward_send");
  Impl::Layer& l = d.layers[size_t(layer)];
  KILTER_CHECK(!l.backward_done, "K/V exchange: backward_wait_add(" << layer << ") called twice");
  const int64_t begin = now_ns();
  const int last = wait_bounded(l.bwd_recv, d.timeout_s, [&](const std::vector<int>& missing) {
    return describe_missing_kv(schedule_, d.rank, layer, true, missing, d.timeout_s);
  });
  l.bwd_recv.clear();
  l.backward_done = true;
  const int64_t end = now_ns();
  wait_seconds_ += double(end - begin) * 1e-9;
  if (!schedule_.later.empty()) {
    KILTER_CHECK(dqkv != nullptr, "K/V exchange: backward_wait_add(" << layer << ") without dqkv");
    const int64_t row_floats = d.kv_width;
    const float* in = l.recv_dkv.data();
    for (const KvPeer& peer : schedule_.later)
      for (const KvRun& run : peer.runs)
        for (int32_t r = 0; r < run.rows; ++r, in += row_floats) {
          float* out = dqkv + (int64_t(run.row) + r) * d.row_width + d.kv_offset;
          for (int64_t j = 0; j < row_floats; ++j) out[j] += in[j];
        }
  }
  std::vector<float>().swap(l.recv_dkv);
  std::vector<float>().swap(l.prefix_kv);  // valid until now (kv_exchange.h)
  if (d.on_wait && !schedule_.later.empty()) d.on_wait(kv_wait_event(layer, true, begin, end, schedule_.later, last));
  d.reap_sends();
}

void MpiKvExchange::progress() {
  Impl& d = *impl_;
  // Completed sends free their buffers; the probe runs MPI's progress engine once more, which
  // pushes the next fragments of the open sends and answers the peers' rendezvous requests for the
  // open receives (the requests themselves stay with forward_wait and backward_wait_add).
  d.reap_sends();
  int flag = 0;
  KILTER_MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, d.comm, &flag, MPI_STATUS_IGNORE),
                   "MPI_Iprobe (K/V exchange progress)");
}

void MpiKvExchange::finish() {
  Impl& d = *impl_;
  for (int layer = 0; layer < d.n_layer; ++layer) {
    Impl::Layer& l = d.layers[size_t(layer)];
    KILTER_CHECK(!l.forward_posted || l.backward_done,
                 "K/V exchange: finish() before backward_wait_add(" << layer << ")");
    for (auto* sends : {&l.fwd_send, &l.bwd_send}) {
      const bool backward = sends == &l.bwd_send;
      const std::vector<KvPeer>& peers = backward ? schedule_.earlier : schedule_.later;
      wait_bounded(*sends, d.timeout_s, [&](const std::vector<int>& missing) {
        std::ostringstream os;
        os << "K/V exchange: step " << schedule_.step << ", micro-batch " << schedule_.slot << ", layer " << layer
           << ": rank " << d.rank << " waited " << d.timeout_s << " s (comm.timeout_s) for rank(s)";
        for (int i : missing) os << " " << peers[size_t(i)].rank;
        os << " to receive its " << (backward ? "dK/dV" : "K/V") << "; check those ranks' logs";
        return os.str();
      });
      sends->clear();
    }
    std::vector<float>().swap(l.send_kv);
    std::vector<float>().swap(l.prefix_dkv);
  }
}

}  // namespace kilter::comm
