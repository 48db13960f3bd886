// Writing a whole checkpoint from memory (write_checkpoint_file, see checkpoint.h): HDF5 makes
// the temp file's metadata with every dataset allocated, the tensor bytes go straight to their
// places with pwrite(), then fsync and rename publish the file atomically.
#include <unistd.h>

#include <chrono>
#include <thread>

#include "io/checkpoint.h"
#include "io/checkpoint_layout.h"
#include "io/checkpoint_storage.h"

namespace kilter::io {
namespace {

namespace storage = checkpoint_storage;

// One tensor's bytes and where they go in the temp file.
struct PendingWrite {
  const float* data;
  size_t count;
  uint64_t file_offset;
};

// Writes every pending tensor into `fd`, the temp file `tmp`, sleeping `delay_midway_s` halfway
// (the test hook of CheckpointWriteOptions).
void write_tensor_bytes(int fd, const std::vector<PendingWrite>& pending, double delay_midway_s,
                        const std::string& tmp) {
  size_t total = 0, written = 0;
  for (const auto& p : pending) total += p.count;
  bool delayed = delay_midway_s <= 0;
  for (const auto& p : pending) {
    storage::pwrite_all(fd, reinterpret_cast<const char*>(p.data), p.count * sizeof(float), off_t(p.file_offset),
                        tmp);
    written += p.count;
    if (!delayed && written * 2 >= total) {
      delayed = true;
      std::this_thread::sleep_for(std::chrono::duration<double>(delay_midway_s));
    }
  }
}

void write_checkpoint_file_unchecked(const std::string& final_path, const CheckpointContents& c,
                                     const CheckpointWriteOptions& opts) {
  const std::string tmp = checkpoint_temp_path(final_path);
  const float* buffers[3] = {c.params.data(), c.adam_m.data(), c.adam_v.data()};
  const size_t buffer_sizes[3] = {c.params.size(), c.adam_m.size(), c.adam_v.size()};
  check_tensors(final_path, c.tensors, buffer_sizes);
  ::unlink(tmp.c_str());  // a leftover of a writer that died
  try {
    // 1. Metadata with HDF5: every dataset contiguous and allocated now (no fill values written),
    //    so its file offset is known and the bytes can be written without HDF5 afterwards.
    const CheckpointFileOffsets offsets = create_checkpoint_temp_file(final_path, tmp, c.info, c.tensors, buffers);
    std::vector<PendingWrite> pending;
    for (int g = 0; g < 3; ++g)
      for (size_t i = 0; i < c.tensors.size(); ++i) {
        const CheckpointTensor& t = c.tensors[i];
        pending.push_back({buffers[g] + t.offset, t.size, offsets[g * c.tensors.size() + i]});
      }
    // 2. The tensor bytes, straight into the allocated space.
    const int fd = storage::open_for_writing(tmp, final_path);
    try {
      write_tensor_bytes(fd, pending, opts.delay_midway_s, tmp);
    } catch (...) {
      ::close(fd);
      throw;
    }
    // 3. Publish atomically.
    storage::sync_close_and_rename(fd, tmp, final_path);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  storage::fsync_directory(storage::parent_dir(final_path));
}

}  // namespace

uint64_t checkpoint_size_estimate(const CheckpointContents& c) {
  return checkpoint_bytes_needed(c.params.size() + c.adam_m.size() + c.adam_v.size(), c.info, c.tensors.size());
}

void write_checkpoint_file(const std::string& final_path, const CheckpointContents& c,
                           const CheckpointWriteOptions& opts) {
  const uint64_t needed = checkpoint_size_estimate(c);
  storage::check_free_space(final_path, needed);
  storage::with_storage_faults(final_path, needed, [&] { write_checkpoint_file_unchecked(final_path, c, opts); });
}

}  // namespace kilter::io
