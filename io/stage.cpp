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
#include "io/error.h"

namespace kilter::io {

namespace fs = std::filesystem;

namespace {

// Copies `from` to `to` with read/write and fsyncs `to`. Returns the bytes copied.
uint64_t copy_file_synced(const std::string& from, const std::string& to) {
  int in = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
  KILTER_CHECK(in >= 0, from << ": cannot open for staging (" << std::strerror(errno) << ")");
  int out = ::open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) {
    int saved = errno;
    ::close(in);
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
        failure = to + ": write failed (" + std::strerror(errno) + ")";
        break;
      }
      done += w;
    }
    total += uint64_t(n);
  }
  if (failure.empty() && ::fsync(out) != 0)
    failure = to + ": fsync failed (" + std::strerror(errno) + ")";
  ::close(in);
  ::close(out);
  KILTER_CHECK(failure.empty(), failure);
  return total;
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
  KILTER_CHECK(!stage_dir.empty(), "data.stage_dir is empty");
  std::error_code ec;
  KILTER_CHECK(!fs::equivalent(index.dir, stage_dir, ec),
               "data.stage_dir " << stage_dir << " is the dataset directory itself");
  fs::create_directories(stage_dir, ec);
  KILTER_CHECK(!ec && fs::is_directory(stage_dir),
               "data.stage_dir " << stage_dir << ": cannot create the directory ("
                                 << ec.message() << ")");
  StageReport report;
  report.dir = stage_dir;

  for (uint32_t s = 0; s < index.shards.size(); ++s) {
    const ShardInfo& info = index.shards[s];
    const std::string source = (fs::path(index.dir) / info.file).string();
    const std::string target = (fs::path(stage_dir) / info.file).string();
    bool present = fs::exists(target);
    if (present && existing_shard_hash(target) == info.hash) {
      ++report.shards_reused;
      continue;
    }
    const std::string temp = target + ".tmp-" + std::to_string(::getpid());
    try {
      report.bytes_copied += copy_file_synced(source, temp);
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
    report.bytes_copied += copy_file_synced(index_source, temp);
    fs::rename(temp, index_target);
  }
  fsync_directory(stage_dir);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace kilter::io
