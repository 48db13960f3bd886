// Node-local staging, copy-and-verify (see stage.h). A copy is verified by recomputing the
// content hash from the copy itself (read back from the page cache just filled), so a copy
// is only ever renamed into place when it matches the index.
#include "io/stage.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "io/content_hash.h"
#include "io/base/error.h"
#include "io/text_format.h"
#include "io/write_failure.h"

namespace kilter::io {

namespace fs = std::filesystem;

namespace {

// The errno of the last failed write into the stage folder (0: none), for the first line.
thread_local int t_stage_write_errno = 0;

// Copies `from` to `to` with read/write and fsyncs `to`. Returns the bytes copied.
uint64_t copy_file_synced(const std::string& from, const std::string& to) {
  int in = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
  KILTER_CHECK(in >= 0, from << ": cannot open for staging (" << std::strerror(errno) << ")");
  int out = ::open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) {
    int saved = errno;
    ::close(in);
    t_stage_write_errno = saved;
    KILTER_FAIL(to << ": cannot create (" << std::strerror(saved) << ")");
  }
  std::vector<char> buffer(size_t(4) << 20);
  uint64_t total = 0;
  std::string failure;
  while (failure.empty()) {
    ssize_t n = ::read(in, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      failure = from + ": read failed (" + std::strerror(errno) + ")";
      break;
    }
    if (n == 0) break;
    for (ssize_t done = 0; done < n;) {
      ssize_t w = ::write(out, buffer.data() + done, size_t(n - done));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) {
        t_stage_write_errno = errno;
        failure = to + ": write failed (" + std::strerror(errno) + ")";
        break;
      }
      done += w;
    }
    total += uint64_t(n);
  }
  if (failure.empty() && ::fsync(out) != 0) {
    t_stage_write_errno = errno;
    failure = to + ": fsync failed (" + std::strerror(errno) + ")";
  }
  ::close(in);
  ::close(out);
  KILTER_CHECK(failure.empty(), failure);
  return total;
}

// copy_file_synced into the stage folder; a storage fault there (full, quota, read-only, ...)
// leads with the folder, the cause and what to do, the failing call following as the detail.
uint64_t copy_into_stage(const std::string& source, const std::string& temp, const std::string& name,
                         const std::string& stage_dir, const std::string& in_place) {
  t_stage_write_errno = 0;
  try {
    return copy_file_synced(source, temp);
  } catch (const Error& e) {
    const int err = t_stage_write_errno;
    if (!is_storage_errno(err)) throw;
    KILTER_FAIL("data.stage_dir " << stage_dir << ": " << describe_write_errno(err, stage_dir) << " while copying "
                                  << name << "; " << write_errno_advice(err, stage_dir, "data.stage_dir") << in_place
                                  << "\n  detail: " << e.message());
  }
}

// Byte-wise FNV-1a of a whole file: compares index.h5 copies (they carry no hash of their own).
std::string file_hash(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  KILTER_CHECK(fd >= 0, path << ": cannot open (" << std::strerror(errno) << ")");
  std::vector<char> buffer(size_t(1) << 20);
  Fnv1a64 hash;
  ssize_t n;
  while ((n = ::read(fd, buffer.data(), buffer.size())) > 0) hash.update(buffer.data(), size_t(n));
  ::close(fd);
  KILTER_CHECK(n == 0, path << ": read failed");
  return hash.hex();
}

// Hash of the shard file at `path`, or "" when it cannot be read as a shard at all.
std::string existing_shard_hash(const std::string& path) {
  try {
    return shard_content_hash(path);
  } catch (const Error&) {
    return "";
  }
}

void fsync_directory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

StageReport stage_shards(const DatasetIndex& index, const std::string& stage_dir) {
  auto start = std::chrono::steady_clock::now();
  KILTER_USER_CHECK(!stage_dir.empty(), "data.stage_dir is empty");
  std::error_code ec;
  KILTER_USER_CHECK(!fs::equivalent(index.dir, stage_dir, ec),
               "data.stage_dir " << stage_dir << " is the dataset directory itself");
  const std::string in_place = "; or leave data.stage_dir empty to read " + index.dir + " in place";
  fs::create_directories(stage_dir, ec);
  KILTER_USER_CHECK(!ec && fs::is_directory(stage_dir),
               "data.stage_dir " << stage_dir << ": cannot create the directory ("
                                 << (ec ? ec.message() : std::string("a file of that name is in the way"))
                                 << "); set data.stage_dir to a writable node-local folder" << in_place);
  StageReport report;
  report.dir = stage_dir;

  // Which shards need a copy (a verified copy from an earlier job stays), and the room they need:
  // a stage folder too small is refused before a byte is copied.
  std::vector<bool> reuse(index.shards.size(), false);
  uint64_t needed = fs::file_size(fs::path(index.dir) / kIndexFileName, ec);
  for (uint32_t s = 0; s < index.shards.size(); ++s) {
    const ShardInfo& info = index.shards[s];
    const std::string target = (fs::path(stage_dir) / info.file).string();
    reuse[s] = fs::exists(target) && existing_shard_hash(target) == info.hash;
    if (!reuse[s]) {
      uint64_t size = fs::file_size(fs::path(index.dir) / info.file, ec);
      needed += ec ? 0 : size;
      if (fs::exists(target)) {  // a stale copy makes room when replaced
        uint64_t stale = fs::file_size(target, ec);
        needed -= ec ? 0 : std::min(stale, needed);
      }
    }
  }
  const int64_t available = free_bytes(stage_dir);
  KILTER_USER_CHECK(available < 0 || uint64_t(available) >= needed,
               "data.stage_dir " << stage_dir << " is too small: staging needs " << human_bytes(double(needed)) << ", "
                                 << human_bytes(double(available)) << " free; free space there, or set "
                                 << "data.stage_dir to a larger node-local disk" << in_place);

  for (uint32_t s = 0; s < index.shards.size(); ++s) {
    const ShardInfo& info = index.shards[s];
    const std::string source = (fs::path(index.dir) / info.file).string();
    const std::string target = (fs::path(stage_dir) / info.file).string();
    bool present = fs::exists(target);
    if (reuse[s]) {
      ++report.shards_reused;
      continue;
    }
    const std::string temp = target + ".tmp-" + std::to_string(::getpid());
    try {
      report.bytes_copied += copy_into_stage(source, temp, info.file, stage_dir, in_place);
      std::string copied_hash = existing_shard_hash(temp);
      KILTER_CHECK(copied_hash == info.hash,
                   source << ": the copy in " << stage_dir << " has content hash "
                          << (copied_hash.empty() ? "(unreadable)" : copied_hash)
                          << ", the index says " << info.hash
                          << " (is the source shard corrupted? run `kilter prep validate "
                          << index.dir << "`)");
      fs::rename(temp, target);
    } catch (...) {
      fs::remove(temp, ec);
      throw;
    }
    if (present) ++report.shards_replaced; else ++report.shards_copied;
  }

  // The index goes last: a staged directory with an index is a complete one.
  const std::string index_source = (fs::path(index.dir) / kIndexFileName).string();
  const std::string index_target = (fs::path(stage_dir) / kIndexFileName).string();
  if (!fs::exists(index_target) || file_hash(index_target) != file_hash(index_source)) {
    const std::string temp = index_target + ".tmp-" + std::to_string(::getpid());
    try {
      report.bytes_copied += copy_into_stage(index_source, temp, kIndexFileName, stage_dir, in_place);
    } catch (...) {
      fs::remove(temp, ec);
      throw;
    }
    fs::rename(temp, index_target);
  }
  fsync_directory(stage_dir);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace kilter::io
