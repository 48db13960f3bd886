// ModelSpec <-> a checkpoint's model attributes (checkpoint_model.h).
#include "lib/train/checkpoint_model.h"

namespace kilter::train {

model::ModelSpec spec_of(const io::CheckpointInfo& info) {
  model::ModelSpec spec;
  io::copy_model_settings(info, spec);
  return spec;
}

void set_model_keys(io::CheckpointInfo& info, const model::ModelSpec& spec) { io::copy_model_settings(spec, info); }

}  // namespace kilter::train
