// The one check of a micro-batch against the model, shared by every backend (model.h).
#include <cstddef>

#include "io/error.h"
#include "lib/model/model.h"

namespace kilter::model {

// Ids index embedding tables (on the device, out of bounds without a trace): refuse bad ones here.
void validate_batch(const Batch& batch, const GPTConfig& cfg) {
  const int B = batch.B, T = batch.T, V = cfg.vocab_size;
  KILTER_CHECK(B > 0 && T > 0, "model batch: B and T must be positive, got B=" << B << " T=" << T);
  KILTER_CHECK(T <= cfg.block_size,
               "model batch: T=" << T << " exceeds model.block_size=" << cfg.block_size);
  const size_t BT = static_cast<size_t>(B) * T;
  KILTER_CHECK(batch.inputs.size() == BT && batch.targets.size() == BT && batch.lengths.size() == static_cast<size_t>(B),
               "model batch: expected " << BT << " inputs/targets and " << B << " lengths, got "
                                        << batch.inputs.size() << "/" << batch.targets.size() << " and "
                                        << batch.lengths.size());
  for (int b = 0; b < B; ++b) {
    const int length = batch.lengths[b];
    KILTER_CHECK(length >= 0 && length <= T, "model batch: row " << b << " has length " << length << " outside [0, "
                                                                 << T << "]");
    for (int t = 0; t < T; ++t) {
      const int32_t input = batch.inputs[static_cast<size_t>(b) * T + t];
      const int32_t target = batch.targets[static_cast<size_t>(b) * T + t];
      if (t < length) {
        KILTER_CHECK(input >= 0 && input < V, "model batch: token id " << input << " at row " << b << " position "
                                                                       << t << " is outside the vocabulary [0, " << V
                                                                       << ")");
        KILTER_CHECK(target >= -1 && target < V, "model batch: target " << target << " at row " << b << " position "
                                                                        << t << " is outside [-1, " << V << ")");
      } else {
        KILTER_CHECK(input >= -1 && input < V, "model batch: padding id " << input << " at row " << b << " position "
                                                                          << t << " is outside [-1, " << V << ")");
        KILTER_CHECK(target == -1, "model batch: padded position " << t << " of row " << b << " (length " << length
                                                                   << ") has target " << target << ", expected -1");
      }
    }
  }
}

}  // namespace kilter::model
