// Writing a checkpoint by slices, for a sharded optimizer (see checkpoint.h and docs/checkpoints.md
// "Sharded checkpoints"): one process makes the temp file with every dataset allocated, any
// processes pwrite() their floats at their places, and one process reads the tensors back to
// write their checksums, then publishes the file as the whole writer does.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "io/checkpoint.h"
#include "io/checkpoint_checksum.h"
#include "io/checkpoint_layout.h"
#include "io/checkpoint_storage.h"
#include "io/base/error.h"
#include "io/hdf5_util.h"

namespace kilter::io {
namespace {

namespace storage = checkpoint_storage;

// Floats read back per piece by finish_checkpoint_file (16 MiB).
constexpr size_t kReadBackPiece = size_t(1) << 22;

// The tensor holding flat position `at` (tensors in layout order), or tensors.size() if none
// holds it (padding beyond, or a gap).
size_t tensor_at(const std::vector<CheckpointTensor>& tensors, size_t at) {
  auto it = std::upper_bound(tensors.begin(), tensors.end(), at,
                             [](size_t x, const CheckpointTensor& t) { return x < t.offset; });
  if (it == tensors.begin()) return tensors.size();
  --it;
  return at < it->offset + it->size ? size_t(it - tensors.begin()) : tensors.size();
}

void check_offsets(const std::string& final_path, const std::vector<CheckpointTensor>& tensors,
                   const CheckpointFileOffsets& offsets) {
  KILTER_CHECK(offsets.size() == 3 * tensors.size(), "checkpoint " << final_path << ": " << offsets.size()
                                                                   << " file offsets for " << tensors.size()
                                                                   << " tensors");
}

// Reads `count` bytes at `offset` of `fd` (the temp file `tmp`) into `out`.
void pread_all(int fd, char* out, size_t count, uint64_t offset, const std::string& final_path,
               const std::string& tmp) {
  size_t got = 0;
  while (got < count) {
    ssize_t r = ::pread(fd, out + got, count - got, off_t(offset + got));
    if (r < 0 && errno == EINTR) continue;
    KILTER_CHECK(r > 0, "checkpoint " << final_path << ": reading back " << tmp << " failed: "
                                      << (r < 0 ? std::strerror(errno) : "unexpected end of file"));
    got += size_t(r);
  }
}

// Each tensor's checksum (CheckpointFileOffsets order), from its bytes as they are in the temp
// file, read in bounded pieces.
std::vector<uint64_t> checksums_in_file(const std::string& final_path, const std::string& tmp,
                                        const std::vector<CheckpointTensor>& tensors,
                                        const CheckpointFileOffsets& offsets) {
  std::vector<uint64_t> checksums(offsets.size());
  const int fd = ::open(tmp.c_str(), O_RDONLY);
  KILTER_CHECK(fd >= 0, "checkpoint " << final_path << ": cannot open temp file " << tmp << ": "
                                      << std::strerror(errno));
  std::vector<char> piece;
  try {
    for (size_t k = 0; k < offsets.size(); ++k) {
      const CheckpointTensor& t = tensors[k % tensors.size()];
      StreamHash hash(t.size);
      for (size_t done = 0; done < t.size;) {
        const size_t n = std::min(kReadBackPiece, t.size - done);
        piece.resize(n * sizeof(float));
        pread_all(fd, piece.data(), piece.size(), offsets[k] + done * sizeof(float), final_path, tmp);
        hash.update(piece.data(), piece.size());
        done += n;
      }
      checksums[k] = hash.finish();
    }
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return checksums;
}

// Writes the checksums into the tensors' attributes, in place: the file keeps its layout.
void write_checksums(const std::string& final_path, const std::string& tmp,
                     const std::vector<CheckpointTensor>& tensors, const std::vector<uint64_t>& checksums) {
  const std::string where = "checkpoint " + final_path;
  h5::Handle file = h5::open_file(tmp, /*writable=*/true);
  for (size_t k = 0; k < checksums.size(); ++k) {
    const std::string name = tensor_dataset_name(int(k / tensors.size()), tensors[k % tensors.size()]);
    h5::Handle dataset = h5::open_dataset(file, name, where);
    h5::overwrite_attribute(dataset, "checksum", checksums[k], where + ": " + name);
  }
  KILTER_CHECK(file.close() >= 0, where << ": closing temp file " << tmp << " failed: " << h5::error_stack());
}

}  // namespace

CheckpointFileOffsets create_checkpoint_file(const std::string& final_path, const CheckpointInfo& info,
                                             const std::vector<CheckpointTensor>& tensors) {
  size_t floats = 0;
  for (const auto& t : tensors) floats = std::max(floats, t.offset + t.size);
  const size_t sizes[3] = {floats, floats, floats};
  check_tensors(final_path, tensors, sizes);
  KILTER_CHECK(std::is_sorted(tensors.begin(), tensors.end(),
                              [](const CheckpointTensor& a, const CheckpointTensor& b) { return a.offset < b.offset; }),
               "checkpoint " << final_path << ": tensors are not in layout order");
  uint64_t data_floats = 0;
  for (const auto& t : tensors) data_floats += 3 * t.size;
  const uint64_t needed = checkpoint_bytes_needed(data_floats, info, tensors.size());
  storage::check_free_space(final_path, needed);
  const std::string tmp = checkpoint_temp_path(final_path);
  ::unlink(tmp.c_str());  // a leftover of a writer that died
  CheckpointFileOffsets offsets;
  try {
    storage::with_storage_faults(final_path, needed, [&] {
      offsets = create_checkpoint_temp_file(final_path, tmp, info, tensors, nullptr);
    });
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  return offsets;
}

CheckpointSliceWriter::CheckpointSliceWriter(const std::string& final_path, const std::vector<CheckpointTensor>& tensors,
                                             CheckpointFileOffsets offsets)
    : final_path_(final_path), tmp_(checkpoint_temp_path(final_path)), tensors_(tensors), offsets_(std::move(offsets)) {
  check_offsets(final_path_, tensors_, offsets_);
  storage::with_storage_faults(final_path_, 0, [&] { fd_ = storage::open_for_writing(tmp_, final_path_); });
}

CheckpointSliceWriter::~CheckpointSliceWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void CheckpointSliceWriter::write(int group, size_t first, const float* data, size_t count) {
  KILTER_CHECK(group >= 0 && group < 3 && fd_ >= 0, "checkpoint " << final_path_ << ": slice write to group "
                                                                  << group << " of a closed writer");
  storage::with_storage_faults(final_path_, 0, [&] {
    const size_t end = first + count;
    size_t at = first;
    while (at < end) {
      const size_t i = tensor_at(tensors_, at);
      if (i == tensors_.size()) {  // padding or a gap: skip to the next tensor's start, if any
        auto next = std::upper_bound(tensors_.begin(), tensors_.end(), at,
                                     [](size_t x, const CheckpointTensor& t) { return x < t.offset; });
        if (next == tensors_.end()) break;
        at = std::max(at + 1, next->offset);
        continue;
      }
      const CheckpointTensor& t = tensors_[i];
      const size_t n = std::min(end, t.offset + t.size) - at;
      const uint64_t file_offset = offsets_[size_t(group) * tensors_.size() + i] + (at - t.offset) * sizeof(float);
      storage::pwrite_all(fd_, reinterpret_cast<const char*>(data + (at - first)), n * sizeof(float),
                          off_t(file_offset), tmp_);
      at += n;
    }
  });
}

void CheckpointSliceWriter::close() {
  if (fd_ < 0) return;
  const int fd = fd_;
  fd_ = -1;
  storage::with_storage_faults(final_path_, 0, [&] { storage::close_checked(fd, tmp_, final_path_); });
}

void finish_checkpoint_file(const std::string& final_path, const std::vector<CheckpointTensor>& tensors,
                            const CheckpointFileOffsets& offsets) {
  const std::string tmp = checkpoint_temp_path(final_path);
  check_offsets(final_path, tensors, offsets);
  try {
    storage::with_storage_faults(final_path, 0, [&] {
      write_checksums(final_path, tmp, tensors, checksums_in_file(final_path, tmp, tensors, offsets));
      // Every process's data and the attributes reach the disk, then publish atomically.
      const int fd = storage::open_for_writing(tmp, final_path);
      storage::sync_close_and_rename(fd, tmp, final_path);
    });
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  storage::fsync_directory(storage::parent_dir(final_path));
}

void abandon_checkpoint_file(const std::string& final_path) { ::unlink(checkpoint_temp_path(final_path).c_str()); }

}  // namespace kilter::io
