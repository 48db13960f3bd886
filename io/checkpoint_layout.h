// The layout of a checkpoint file (internal to io/checkpoint_*.cpp): three groups of float32
// tensors (/params, /adam/m, /adam/v), every tensor a contiguous dataset allocated when the file
// is made, so its bytes have a file offset from the start and are written with pwrite(), by one
// process (checkpoint_write.cpp) or by many at once (checkpoint_slices.cpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "io/checkpoint.h"

namespace kilter::io {

// The three tensor groups, in file order; flat buffer g of a writer or reader fills group g.
extern const char* const kTensorGroups[3];

// "/adam/m/transformer.wte.weight"
std::string tensor_dataset_name(int group, const CheckpointTensor& tensor);

// Checks the tensors' shapes and sizes against the flat buffers' sizes (floats each).
void check_tensors(const std::string& final_path, const std::vector<CheckpointTensor>& tensors,
                   const size_t buffer_sizes[3]);

// Bytes a checkpoint file takes, rounded up: `floats` of tensor data in all three groups, the
// texts and datasets of `info`, and HDF5's metadata.
uint64_t checkpoint_bytes_needed(uint64_t floats, const CheckpointInfo& info, size_t n_tensors);

// Makes the temp file `tmp` of `final_path` with every dataset allocated and every attribute
// written, and closes it. Each tensor's checksum comes from buffers[group] (nullptr: 0, for
// finish_checkpoint_file to fill). Returns each tensor's file offset (CheckpointFileOffsets
// order). The caller removes the temp file on failure.
CheckpointFileOffsets create_checkpoint_temp_file(const std::string& final_path, const std::string& tmp,
                                                  const CheckpointInfo& info,
                                                  const std::vector<CheckpointTensor>& tensors,
                                                  const float* const buffers[3]);

}  // namespace kilter::io
