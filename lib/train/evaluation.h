// Held-out evaluation during training: the first train.eval_batches steps of the eval split's
// plan (world-size independent), forward only, summed over every rank.
#pragma once
#include <cstdint>
#include <string>

#include "io/dataset.h"
#include "io/reader.h"
#include "lib/train/plan_cursor.h"
#include "lib/train/train_step.h"

namespace kilter::train {

// The token-mean loss over those steps (NaN when they hold no target). Collective: every rank
// calls it at the same step. Reads with its own reader so the training prefetch is untouched.
double evaluate(StepContext& ctx, PlanCache& eval_plans, const io::DatasetIndex& index, const std::string& data_dir,
                io::ReaderOptions reader_options, int64_t eval_steps, int64_t step_index);

}  // namespace kilter::train
