#include "io/dataset_output.h"

#include <fcntl.h>
#include <unistd.h>

#include "io/base/error.h"
#include "io/prep.h"

namespace kilter::io {

namespace fs = std::filesystem;

namespace {

void fsync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  KILTER_CHECK(fd >= 0, path << ": cannot open for fsync");
  int rc = ::fsync(fd);
  ::close(fd);
  KILTER_CHECK(rc == 0, path << ": fsync failed");
}

}  // namespace

AtomicDirectory::AtomicDirectory(const std::string& out, bool force) {
  KILTER_USER_CHECK(!out.empty(), "--out: no output directory given");
  fs::path target = fs::absolute(out).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();
  std::error_code ec;
  if (fs::exists(target, ec)) {
    KILTER_USER_CHECK(fs::is_directory(target), "--out " << out << " exists and is not a directory");
    KILTER_USER_CHECK(force || fs::is_empty(target),
                 "--out " << out << " exists and is not empty (pass --force to replace it)");
  }
  fs::create_directories(target.parent_path());
  target_ = target;
  temp_ = target.parent_path() / (target.filename().string() + ".tmp-" + std::to_string(::getpid()));
  fs::remove_all(temp_);
  fs::create_directory(temp_);
}

AtomicDirectory::~AtomicDirectory() {
  std::error_code ec;
  if (!committed_) fs::remove_all(temp_, ec);
}

void AtomicDirectory::commit() {
  for (const fs::directory_entry& entry : fs::directory_iterator(temp_)) fsync_path(entry.path().string());
  fsync_path(temp_.string());
  std::error_code ec;
  fs::path old;  // an existing dataset (--force) is moved aside first, removed once replaced
  if (fs::exists(target_)) {
    if (fs::is_empty(target_)) {
      fs::remove(target_);
    } else {
      old = target_.parent_path() / (target_.filename().string() + ".old-" + std::to_string(::getpid()));
      fs::rename(target_, old);
    }
  }
  fs::rename(temp_, target_);
  committed_ = true;
  if (!old.empty()) fs::remove_all(old, ec);
  fsync_path(target_.parent_path().string());
}

ShardBuilder::ShardBuilder(AtomicDirectory& out, DatasetIndex& index, const std::vector<uint32_t>& lengths,
                           uint32_t num_shards)
    : out_(out), index_(index), lengths_(lengths), first_(assign_shards(lengths, num_shards)) {
  open_shard();
}

void ShardBuilder::end_document() {
  writer_->end_document();
  ++doc_;
  if (doc_ == first_[shard_ + 1]) {
    index_.shards.back().hash = writer_->finish();
    writer_.reset();
    if (++shard_ + 1 < first_.size()) open_shard();
  }
}

void ShardBuilder::open_shard() {
  std::vector<uint32_t> shard_lengths(lengths_.begin() + first_[shard_], lengths_.begin() + first_[shard_ + 1]);
  ShardInfo info;
  info.file = shard_file_name(shard_);
  info.num_docs = shard_lengths.size();
  for (uint32_t length : shard_lengths) info.num_tokens += length;
  info.first_doc = first_[shard_];
  index_.shards.push_back(info);
  ShardHeader header{index_.vocab_size, index_.eos_id, index_.tokenizer, shard_, uint32_t(first_.size() - 1)};
  writer_ = std::make_unique<ShardWriter>(out_.file(info.file), header, shard_lengths);
}

}  // namespace kilter::io
