// Plain descriptions of failed writes (see write_failure.h).
#include "io/write_failure.h"

#include <sys/statvfs.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>
#include <vector>

namespace kilter::io {

int64_t free_bytes(const std::string& path) {
  struct statvfs st;
  if (::statvfs(path.c_str(), &st) != 0) return -1;
  return int64_t(st.f_bavail) * int64_t(st.f_frsize);
}

int errno_in_hdf5_text(const std::string& text) {
  const std::string key = "errno = ";
  const size_t at = text.find(key);
  if (at == std::string::npos) return 0;
  return std::atoi(text.c_str() + at + key.size());
}

bool is_storage_errno(int err) {
  switch (err) {
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
    case EROFS:
    case EACCES:
    case EPERM:
    case EIO:
      return true;
    default:
      return false;
  }
}

std::string describe_write_errno(int err, const std::string& dir) {
  switch (err) {
    case ENOSPC: return "no space left on the file system of " + dir;
    case EDQUOT: return "disk quota exceeded in " + dir;
    case EFBIG: return "file size limit reached in " + dir + " (ulimit -f, or the file system's largest file)";
    case EROFS: return dir + " is on a read-only file system";
    case EACCES:
    case EPERM: return dir + " is not writable by this user (" + std::strerror(err) + ")";
    case EIO: return "I/O error on the storage of " + dir;
    default: return "cannot write in " + dir + " (" + std::strerror(err) + ")";
  }
}

std::string write_errno_advice(int err, const std::string& dir, const std::string& key) {
  switch (err) {
    case ENOSPC:
    case EDQUOT:
    case EFBIG: return "free space there, or set " + key + " to a larger file system";
    case EROFS:
    case EACCES:
    case EPERM: return "set " + key + " to a writable folder, or make " + dir + " writable";
    case EIO: return "check the storage (dmesg), or set " + key + " to another file system";
    default: return "check " + dir + ", or set " + key + " to another folder";
  }
}

std::string compact_hdf5_text(const std::string& text) {
  // HDF5 messages are joined by "; " (see h5::error_stack in hdf5_util.cpp).
  std::vector<std::string> parts;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find("; ", begin);
    if (end == std::string::npos) end = text.size();
    std::string part = text.substr(begin, end - begin);
    std::string folded;
    for (char c : part) {
      if (c == '\n' || c == '\r') continue;
      folded += c;
    }
    if (!folded.empty()) parts.push_back(folded);
    begin = end + 2;
  }
  std::set<std::string> seen;
  std::string out;
  for (const auto& p : parts) {
    if (!seen.insert(p).second) continue;
    if (!out.empty()) out += "; ";
    out += p;
  }
  return out;
}

}  // namespace kilter::io
