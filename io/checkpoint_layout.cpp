// The layout of a checkpoint file (see checkpoint_layout.h): the temp file with every tensor
// dataset allocated, its checksum attributes and the root attributes.
#include "io/checkpoint_layout.h"

#include "io/checkpoint_attributes.h"
#include "io/base/error.h"
#include "io/hdf5_util.h"
#include "io/text_format.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "checkpoint tensors are pwrite()n as float32 little-endian host bytes");

namespace kilter::io {
namespace {

// A file whose H5Fclose failed (its metadata flush met a full disk or a quota) stays in HDF5's
// tables, and HDF5 1.10's clean-up at exit then crashes closing it again (H5F__close_cb, seen
// with a file size limit). kilter closes every file it opens itself, so that clean-up has nothing
// else to do: it is switched off before HDF5 starts (a no-op if HDF5 already has).
[[maybe_unused]] const bool kHdf5ExitCleanupOff = H5dont_atexit() >= 0;

}  // namespace

const char* const kTensorGroups[3] = {"params", "adam/m", "adam/v"};

std::string tensor_dataset_name(int group, const CheckpointTensor& tensor) {
  return std::string("/") + kTensorGroups[group] + "/" + tensor.name;
}

void check_tensors(const std::string& final_path, const std::vector<CheckpointTensor>& tensors,
                   const size_t buffer_sizes[3]) {
  for (const auto& t : tensors) {
    int64_t elements = 1;
    for (int64_t d : t.shape) elements *= d;
    KILTER_CHECK(size_t(elements) == t.size && t.size > 0,
                 "checkpoint " << final_path << ": tensor " << t.name << " has shape " << shape_text(t.shape)
                               << " but size " << t.size);
    for (int g = 0; g < 3; ++g)
      KILTER_CHECK(t.offset + t.size <= buffer_sizes[g],
                   "checkpoint " << final_path << ": tensor " << t.name << " lies outside the "
                                 << kTensorGroups[g] << " buffer (" << buffer_sizes[g] << " floats)");
  }
}

// The two texts, /document_starts (two uint64 a row), and HDF5's metadata: the superblock and
// groups (16 kB covers them) and an object header with a checksum attribute per dataset (under
// 1 kB each).
uint64_t checkpoint_bytes_needed(uint64_t floats, const CheckpointInfo& info, size_t n_tensors) {
  return floats * sizeof(float) + info.tokenizer_data.size() + info.config.size() + info.document_starts.size() * 16 +
         16 * 1024 + 3 * n_tensors * 1024;
}

CheckpointFileOffsets create_checkpoint_temp_file(const std::string& final_path, const std::string& tmp,
                                                  const CheckpointInfo& info,
                                                  const std::vector<CheckpointTensor>& tensors,
                                                  const float* const buffers[3]) {
  const std::string where = "checkpoint " + final_path;
  CheckpointFileOffsets offsets;
  offsets.reserve(3 * tensors.size());
  h5::Handle file = h5::create_file(tmp);
  for (int g = 0; g < 3; ++g) {
    h5::Handle group = h5::create_group(file, kTensorGroups[g], where);
    for (const auto& t : tensors) {
      const std::vector<uint64_t> dims(t.shape.begin(), t.shape.end());
      h5::Handle dataset = h5::create_contiguous(group, t.name, H5T_IEEE_F32LE, dims, where);
      const uint64_t checksum = buffers ? checkpoint_checksum(buffers[g] + t.offset, t.size) : 0;
      h5::write_attribute(dataset, "checksum", checksum, where);
      offsets.push_back(h5::file_offset(dataset, where, tensor_dataset_name(g, t)));
    }
  }
  write_checkpoint_attributes(file, info, where);
  KILTER_CHECK(file.close() >= 0, where << ": closing temp file " << tmp << " failed: " << h5::error_stack());
  return offsets;
}

}  // namespace kilter::io
