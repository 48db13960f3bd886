// The storage side of writing a checkpoint file (internal to io/checkpoint_*.cpp): the POSIX
// calls of the atomic publish (temp file, fsync, rename, fsync of the folder), the free-space
// check before a write, and the storage faults (full, quota, read-only, file size limit, I/O
// error) turned into a first line that says what happened and what to do.
#pragma once
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace kilter::io::checkpoint_storage {

// The folder of `path` ("." when it has none).
std::string parent_dir(const std::string& path);

// Opens the temp file `tmp` of `final_path` for writing (it exists: made by HDF5).
int open_for_writing(const std::string& tmp, const std::string& final_path);
// Writes all `bytes` at `offset` of `fd`, the temp file `tmp`.
void pwrite_all(int fd, const char* data, size_t bytes, off_t offset, const std::string& tmp);
// Closes `fd`, the temp file `tmp` of `final_path`, checking the close.
void close_checked(int fd, const std::string& tmp, const std::string& final_path);
// fsync()s and closes `fd`, the temp file `tmp` of `final_path`, and renames it to final_path.
void sync_close_and_rename(int fd, const std::string& tmp, const std::string& final_path);
// fsync()s a folder, so that a rename in it survives a power loss.
void fsync_directory(const std::string& dir);

// Refuses a write of `needed` bytes that cannot fit in the free space of final_path's folder.
void check_free_space(const std::string& final_path, uint64_t needed);

// Runs `write`; a storage fault it meets (from the calls above, or in HDF5's messages: "errno =
// 28") is rethrown leading with what happened and what to do, the failing call and HDF5's own
// messages following once as the detail. `needed`: the file's size estimate (0: not said).
void with_storage_faults(const std::string& final_path, uint64_t needed, const std::function<void()>& write);

}  // namespace kilter::io::checkpoint_storage
