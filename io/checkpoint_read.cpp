// Reading a checkpoint (see checkpoint.h) with every check a resume needs: a file that is not a
// complete kilter checkpoint, a tensor missing, extra or of another shape, a checksum mismatch,
// each an error that names the file and the tensor.
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <set>

#include "io/checkpoint.h"
#include "io/checkpoint_attributes.h"
#include "io/checkpoint_layout.h"
#include "io/base/error.h"
#include "io/hdf5_util.h"
#include "io/text_format.h"

namespace kilter::io {
namespace {

// Opens `path` read-only; a file that HDF5 cannot open is named with its size, as a truncated or
// corrupt file.
h5::Handle open_checkpoint(const std::string& path) {
  struct stat st;
  KILTER_CHECK(::stat(path.c_str(), &st) == 0, "checkpoint " << path << ": " << std::strerror(errno));
  KILTER_CHECK(S_ISREG(st.st_mode), "checkpoint " << path << ": not a regular file");
  h5::silence_errors();
  h5::Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  KILTER_CHECK(file.valid(), "checkpoint " << path << " (" << st.st_size
                                           << " bytes) cannot be opened as HDF5 - truncated or corrupt file\n"
                                           << "  detail: HDF5: " << h5::error_stack());
  return file;
}

// Reads every tensor of `expected` from the group kTensorGroups[g] into out_base (flat, by
// offset), verifying shapes, types and checksums, and that the group holds nothing else.
void read_tensor_group(hid_t file, const std::string& path, int g, const std::vector<CheckpointTensor>& expected,
                       float* out_base) {
  const std::string where = "checkpoint " + path;
  const std::string group_name = kTensorGroups[g];
  KILTER_CHECK(h5::has_link(file, "adam") || g == 0, where << ": group /adam is missing (no optimizer state)");
  KILTER_CHECK(h5::has_link(file, group_name), where << ": group /" << group_name << " is missing");
  const h5::Handle group = h5::open_group(file, group_name, where);
  std::set<std::string> present = h5::member_names(group, where);
  for (const auto& t : expected) {
    const std::string name = tensor_dataset_name(g, t);
    KILTER_CHECK(present.erase(t.name) == 1,
                 where << ": tensor " << name
                       << " is missing (the model has it; was the checkpoint written for another model?)");
    const h5::Handle dataset = h5::open_dataset(group, t.name, where);
    KILTER_CHECK(h5::element_class(dataset) == H5T_FLOAT && h5::element_size(dataset) == 4,
                 where << ": " << name << " is not float32");
    const std::vector<int64_t> shape = h5::dataset_shape(dataset);
    KILTER_CHECK(shape == t.shape, where << ": " << name << " has shape " << shape_text(shape)
                                         << " but the configured model needs " << shape_text(t.shape)
                                         << " (check the model.* keys)");
    float* out = out_base + t.offset;
    h5::read_all(dataset, H5T_NATIVE_FLOAT, out, where, name);
    const uint64_t stored = h5::read_uint_attribute(dataset, "checksum", where + ": " + name);
    KILTER_CHECK(stored == checkpoint_checksum(out, t.size),
                 where << ": " << name << " fails its checksum (the file was damaged after it was written)");
  }
  KILTER_CHECK(present.empty(), where << ": has tensor /" << group_name << "/" << *present.begin()
                                      << " that the configured model does not have (check the model.* keys)");
}

}  // namespace

CheckpointInfo read_checkpoint_info(const std::string& path) {
  const h5::Handle file = open_checkpoint(path);
  return read_checkpoint_attributes(file, "checkpoint " + path);
}

void read_checkpoint_tensors(const std::string& path, const std::vector<CheckpointTensor>& expected,
                             float* params, float* adam_m, float* adam_v) {
  const h5::Handle file = open_checkpoint(path);
  float* buffers[3] = {params, adam_m, adam_v};
  for (int g = 0; g < 3; ++g) read_tensor_group(file, path, g, expected, buffers[g]);
}

void read_checkpoint_params(const std::string& path, const std::vector<CheckpointTensor>& expected, float* params) {
  const h5::Handle file = open_checkpoint(path);
  read_tensor_group(file, path, 0, expected, params);
}

}  // namespace kilter::io
