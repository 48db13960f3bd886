// From a planned micro-batch and the tokens the reader delivered to the model's packed Batch
// (lib/model/model.h), and the work it costs (what the metrics record for calibration).
#pragma once
#include <cstdint>

#include "io/reader.h"
#include "lib/balance/plan.h"
#include "lib/model/model.h"

namespace kilter::train {

// padded_len == 0 (the balanced plan): the pieces concatenated, one cu_seqlens segment each.
// padded_len > 0 (the naive baseline): each piece becomes a segment of exactly padded_len tokens,
// its real tokens then padding (input 0, target -1) that is really computed. Targets are the
// next tokens (the reader delivers len + 1 tokens per piece). A part of a cut piece keeps its
// offset as the batch's pos_offset (its positions start there). Token ids were checked against the
// dataset's vocabulary by the reader (and model.vocab_size >= it at start-up).
void assemble_batch(const io::ReadyGroup& group, const balance::MicroBatch& mb, model::Batch& batch);

// One rank's work in one step (metrics columns tokens_computed, attn_work, micro_batches,
// kv_tokens, kv_bytes).
struct StepWork {
  int64_t tokens_computed = 0;  // sum of N: padding included
  double attn_work = 0;         // sum of len^2 over the attention segments
  int32_t micro_batches = 0;
  int64_t kv_tokens = 0;        // earlier tokens of cut pieces whose K/V this rank received
  int64_t kv_bytes = 0;         // bytes of K/V and dK/dV it sent and received
  void add(const model::Batch& batch) {
    tokens_computed += batch.N;
    attn_work += batch.attention_work();
    ++micro_batches;
  }
};

}  // namespace kilter::train
