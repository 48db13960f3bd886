// The storage side of writing a checkpoint (see checkpoint_storage.h).
#include "io/checkpoint_storage.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "io/base/error.h"
#include "io/text_format.h"
#include "io/write_failure.h"

namespace kilter::io::checkpoint_storage {
namespace {

// The OS errno of the last failed POSIX call of this thread's checkpoint write (0: none seen); it
// picks the message's first line. HDF5's failures carry theirs in their message instead.
thread_local int t_write_errno = 0;

}  // namespace

std::string parent_dir(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

int open_for_writing(const std::string& tmp, const std::string& final_path) {
  const int fd = ::open(tmp.c_str(), O_WRONLY);
  if (fd < 0) t_write_errno = errno;
  KILTER_CHECK(fd >= 0, "checkpoint " << final_path << ": cannot open temp file " << tmp << ": "
                                      << std::strerror(t_write_errno));
  return fd;
}

void pwrite_all(int fd, const char* data, size_t bytes, off_t offset, const std::string& tmp) {
  while (bytes > 0) {
    ssize_t n = ::pwrite(fd, data, bytes, offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) t_write_errno = n < 0 ? errno : ENOSPC;
    KILTER_CHECK(n > 0, "checkpoint " << tmp << ": write failed: " << std::strerror(t_write_errno));
    data += n;
    bytes -= size_t(n);
    offset += n;
  }
}

void close_checked(int fd, const std::string& tmp, const std::string& final_path) {
  if (::close(fd) != 0) {
    t_write_errno = errno;
    KILTER_FAIL("checkpoint " << final_path << ": close of " << tmp << " failed: " << std::strerror(t_write_errno));
  }
}

void sync_close_and_rename(int fd, const std::string& tmp, const std::string& final_path) {
  const int synced = ::fsync(fd);
  const int sync_errno = errno;
  const int closed = ::close(fd);
  const int close_errno = errno;
  if (synced != 0) {
    t_write_errno = sync_errno;
    KILTER_FAIL("checkpoint " << final_path << ": fsync of " << tmp << " failed: " << std::strerror(sync_errno));
  }
  if (closed != 0) {
    t_write_errno = close_errno;
    KILTER_FAIL("checkpoint " << final_path << ": close of " << tmp << " failed: " << std::strerror(close_errno));
  }
  KILTER_CHECK(::rename(tmp.c_str(), final_path.c_str()) == 0,
               "checkpoint " << final_path << ": rename from " << tmp << " failed: " << std::strerror(errno));
}

void fsync_directory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  KILTER_CHECK(fd >= 0, "checkpoint folder " << dir << ": cannot open for fsync: " << std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some file systems (and /proc-like mounts) refuse fsync on a directory; the rename is still
  // atomic there, only its durability across power loss is not promised.
  KILTER_CHECK(rc == 0 || err == EINVAL || err == EROFS,
               "checkpoint folder " << dir << ": fsync failed: " << std::strerror(err));
}

// A write that cannot fit is refused before it fills the file system: the other files of the
// run (metrics, the next checkpoint) and other jobs keep the space that is left.
void check_free_space(const std::string& final_path, uint64_t needed) {
  const std::string dir = parent_dir(final_path);
  const int64_t available = free_bytes(dir);
  KILTER_CHECK(available < 0 || uint64_t(available) >= needed,
               "checkpoint " << final_path << " not written: " << describe_write_errno(ENOSPC, dir) << " ("
                             << human_bytes(double(needed)) << " needed, " << human_bytes(double(available))
                             << " free); " << write_errno_advice(ENOSPC, dir, "output.dir"));
}

void with_storage_faults(const std::string& final_path, uint64_t needed, const std::function<void()>& write) {
  t_write_errno = 0;
  try {
    write();
  } catch (const Error& e) {
    const int err = t_write_errno != 0 ? t_write_errno : errno_in_hdf5_text(e.message());
    if (!is_storage_errno(err)) throw;
    const std::string dir = parent_dir(final_path);
    std::string space;
    if (err == ENOSPC && needed > 0) {
      const int64_t now_free = free_bytes(dir);
      space = " (" + human_bytes(double(needed)) + " needed" +
              (now_free >= 0 ? ", " + human_bytes(double(now_free)) + " free" : std::string()) + ")";
    }
    KILTER_FAIL("checkpoint " << final_path << " not written: " << describe_write_errno(err, dir) << space << "; "
                              << write_errno_advice(err, dir, "output.dir") << "\n  detail: " << e.message());
  }
}

}  // namespace kilter::io::checkpoint_storage
