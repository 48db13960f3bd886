// A checkpoint's CheckpointInfo in its file (internal to io/checkpoint_*.cpp): the root attributes
// and the two datasets that travel with them, /tokenizer_data and /document_starts. Every key is
// written and read in checkpoint_attributes.cpp, from one table for both, so a new key is one line
// there (kRunKeys) and a field of CheckpointInfo; a model setting is one line of
// io/model_settings.h.
#pragma once
#include <hdf5.h>

#include <string>

#include "io/checkpoint.h"

namespace kilter::io {

// Writes `info` into the root group `root` of a new checkpoint file. `where` names the file in
// messages ("checkpoint PATH").
void write_checkpoint_attributes(hid_t root, const CheckpointInfo& info, const std::string& where);

// Reads the root attributes of a checkpoint file, checking format and format_version first;
// keys that older checkpoints lack read as CheckpointInfo's defaults.
CheckpointInfo read_checkpoint_attributes(hid_t root, const std::string& where);

}  // namespace kilter::io
