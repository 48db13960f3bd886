// The model a checkpoint holds, as the model description (lib/model/spec.h) gives it: the root
// attributes io/checkpoint.h writes (the shape and the architecture's keys) to and from a
// ModelSpec. A checkpoint from before the architecture keys reads as gpt2.
#pragma once
#include "io/checkpoint.h"
#include "lib/model/spec.h"

namespace kilter::train {

model::ModelSpec spec_of(const io::CheckpointInfo& info);
void set_model_keys(io::CheckpointInfo& info, const model::ModelSpec& spec);

}  // namespace kilter::train
