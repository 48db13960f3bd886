// Why a write failed, in words a user can act on: a full file system, a quota, a
// read-only or unwritable folder, a file size limit. Checkpoints and node-local staging turn an
// errno (or the errno HDF5's file driver recorded) into the first line of their error message,
// so that "no space left on device in runs/x/checkpoints" leads, and HDF5's stack follows once.
#pragma once
#include <cstdint>
#include <string>

namespace kilter::io {

// Bytes an unprivileged writer may still write on the file system holding `path` (statvfs
// f_bavail), or -1 when it cannot be asked. Quotas are not visible here.
int64_t free_bytes(const std::string& path);

// The OS errno that HDF5's file driver recorded in its error text ("..., errno = 28, ..."), or 0.
int errno_in_hdf5_text(const std::string& text);

// True for the errors a user fixes on the storage side rather than in kilter: ENOSPC, EDQUOT,
// EFBIG, EROFS, EACCES, EPERM, EIO.
bool is_storage_errno(int err);

// What happened to a write into `dir`, as a phrase: "no space left on the file system of DIR",
// "disk quota exceeded in DIR", "DIR is on a read-only file system", ...
std::string describe_write_errno(int err, const std::string& dir);

// What to do about it: free space, or point `key` (the config key or option that chose `dir`)
// at another file system.
std::string write_errno_advice(int err, const std::string& dir, const std::string& key);

// HDF5's error text made one line: newlines folded, repeated messages (HDF5 repeats its file
// driver's message at every level of a flush) kept once.
std::string compact_hdf5_text(const std::string& text);

}  // namespace kilter::io
