// assemble_batch (micro_batch.h).
#include "lib/train/micro_batch.h"

#include "io/error.h"

namespace kilter::train {

void assemble_batch(const io::ReadyGroup& group, const balance::MicroBatch& mb, model::Batch& batch) {
  KILTER_CHECK(group.pieces.size() == mb.pieces.size(), "reader delivered " << group.pieces.size()
                                                                            << " pieces for a micro-batch of "
                                                                            << mb.pieces.size());
  batch.clear();
  for (size_t p = 0; p < group.pieces.size(); ++p) {
    const uint32_t len = group.pieces[p].len;
    KILTER_CHECK(mb.padded_len == 0 || len <= mb.padded_len,
                 "piece of document " << group.pieces[p].doc << " is longer (" << len
                                      << ") than its naive micro-batch row (" << mb.padded_len << ")");
    const int32_t* tokens = group.tokens + group.offsets[p];
    const int padding = mb.padded_len == 0 ? 0 : int(mb.padded_len - len);
    // A later part of a cut piece continues its piece's positions.
    batch.append_piece(tokens, tokens + 1, int(len), padding, int(mb.pieces[p].offset));
  }
}

}  // namespace kilter::train
