// The packed micro-batch (model.h): its helpers and the one check of it against the model,
// shared by every backend.
#include <algorithm>
#include <cstddef>

#include "io/base/error.h"
#include "lib/model/model.h"

namespace kilter::model {

// A later part [s, s+len) of a cut piece costs e^2 - s^2 = len * (len + 2 s): its queries also
// attend to the s earlier tokens (the plan's cost model, lib/balance).
double Batch::attention_work() const {
  double work = 0;
  for (int p = 0; p < num_pieces(); ++p)
    work += static_cast<double>(piece_len(p)) * (piece_len(p) + 2.0 * piece_offset(p));
  return work;
}

void Batch::clear() {
  N = 0;
  inputs.clear();
  targets.clear();
  cu_seqlens.assign(1, 0);
  num_targets = 0;
  pos_offset.clear();
  exchange = nullptr;
}

void Batch::append_piece(const int32_t* piece_inputs, const int32_t* piece_targets, int len, int padding,
                         int offset) {
  if (cu_seqlens.empty()) cu_seqlens.push_back(0);
  // pos_offset stays empty until a piece has an offset, then holds one entry per piece.
  if (offset != 0 && pos_offset.size() + 1 < cu_seqlens.size()) pos_offset.resize(cu_seqlens.size() - 1, 0);
  if (!pos_offset.empty() || offset != 0) pos_offset.push_back(offset);
  inputs.insert(inputs.end(), piece_inputs, piece_inputs + len);
  if (piece_targets != nullptr) {
    targets.insert(targets.end(), piece_targets, piece_targets + len);
    num_targets += std::count_if(piece_targets, piece_targets + len, [](int32_t t) { return t >= 0; });
  } else {
    targets.insert(targets.end(), static_cast<size_t>(len), -1);
  }
  inputs.insert(inputs.end(), static_cast<size_t>(padding), 0);
  targets.insert(targets.end(), static_cast<size_t>(padding), -1);
  N += len + padding;
  cu_seqlens.push_back(N);
}

// Ids index embedding tables (on the device, out of bounds without a trace): refuse bad ones here.
void validate_batch(const Batch& batch, const ModelSpec& cfg) {
  const int N = batch.N, V = cfg.vocab_size;
  KILTER_CHECK(N > 0, "model batch: N (tokens) must be positive, got " << N);
  KILTER_CHECK(batch.inputs.size() == static_cast<size_t>(N) && batch.targets.size() == static_cast<size_t>(N),
               "model batch: expected " << N << " inputs and targets, got " << batch.inputs.size() << " and "
                                        << batch.targets.size());
  const int pieces = batch.num_pieces();
  KILTER_CHECK(pieces >= 1 && batch.cu_seqlens.front() == 0 && batch.cu_seqlens.back() == N,
               "model batch: cu_seqlens must start at 0 and end at N=" << N << " (got " << batch.cu_seqlens.size()
                                                                       << " offsets)");
  KILTER_CHECK(batch.pos_offset.empty() || batch.pos_offset.size() == static_cast<size_t>(pieces),
               "model batch: pos_offset must be empty or hold one offset per piece (" << pieces << "), got "
                                                                                    << batch.pos_offset.size());
  int64_t num_targets = 0;
  for (int p = 0; p < pieces; ++p) {
    const int begin = batch.cu_seqlens[p], end = batch.cu_seqlens[p + 1];
    KILTER_CHECK(end > begin, "model batch: piece " << p << " is empty or cu_seqlens decreases there (" << begin
                                                    << " -> " << end << ")");
    const int offset = batch.piece_offset(p);
    if (offset == 0) {
      KILTER_CHECK(end - begin <= cfg.block_size, "model batch: piece " << p << " has " << end - begin
                                                                        << " tokens, more than model.block_size="
                                                                        << cfg.block_size);
    } else {
      // A later part of a cut piece: its positions run offset .. offset+len-1.
      KILTER_CHECK(offset > 0 && static_cast<int64_t>(offset) + (end - begin) <= cfg.block_size,
                   "model batch: piece " << p << " (a part of a cut piece) has offset " << offset << " and "
                                         << end - begin << " tokens, reaching position "
                                         << static_cast<int64_t>(offset) + (end - begin) - 1
                                         << ", past model.block_size=" << cfg.block_size
                                         << " (positions 0.." << cfg.block_size - 1 << ")");
      KILTER_CHECK(batch.exchange != nullptr, "model batch: piece " << p << " has offset " << offset
                                                                    << " (a later part of a cut piece) but the batch "
                                                                       "has no K/V exchange to receive its earlier "
                                                                       "tokens from");
    }
    for (int i = begin; i < end; ++i) {
      const int32_t input = batch.inputs[i];
      const int32_t target = batch.targets[i];
      KILTER_CHECK(input >= 0 && input < V, "model batch: token id " << input << " at piece " << p << " position "
                                                                     << i - begin << " is outside the vocabulary [0, "
                                                                     << V << ")");
      KILTER_CHECK(target >= -1 && target < V, "model batch: target " << target << " at piece " << p << " position "
                                                                      << i - begin << " is outside [-1, " << V << ")");
      num_targets += target >= 0;
    }
  }
  KILTER_CHECK(num_targets == batch.num_targets, "model batch: num_targets=" << batch.num_targets << " but "
                                                                             << num_targets << " targets are set");
}

// A cut piece's parts exchange K/V in the forward and dK/dV in the backward, on every rank that
// holds one (kv_exchange.h): a forward alone would leave the other parts' ranks waiting for the
// backward, so evaluation takes whole pieces only.
void check_evaluation_batch(const Batch& batch) {
  for (int p = 0; p < static_cast<int>(batch.pos_offset.size()); ++p)
    KILTER_CHECK(batch.pos_offset[p] == 0, "forward_loss (evaluation): piece "
                                               << p << " is a later part of a cut piece (offset " << batch.pos_offset[p]
                                               << "); evaluation runs whole pieces only: give it uncut pieces");
  KILTER_CHECK(batch.exchange == nullptr, "forward_loss (evaluation): the batch has a K/V exchange (it holds parts of "
                                          "cut pieces); evaluation runs whole pieces only: give it uncut pieces");
}

}  // namespace kilter::model
