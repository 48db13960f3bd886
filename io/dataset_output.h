// Internal to io/ (`kilter prep`, `kilter prep synth`, the importers of io/import.cpp): the
// output directory of a dataset, built under a temporary sibling and renamed into place, and the
// builder that cuts documents into shards and fills the index's shard entries.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "io/dataset.h"
#include "io/shard_writer.h"

namespace kilter::io {

// The output directory, built under a temporary sibling name and renamed when complete, so a
// crash or an error never leaves a half-written dataset under the requested name. An existing
// non-empty --out is refused unless `force`; on commit() it is moved aside, then removed.
class AtomicDirectory {
 public:
  AtomicDirectory(const std::string& out, bool force);
  ~AtomicDirectory();
  AtomicDirectory(const AtomicDirectory&) = delete;
  AtomicDirectory& operator=(const AtomicDirectory&) = delete;

  std::string file(const std::string& name) const { return (temp_ / name).string(); }
  // A scratch file beside the temporary directory (same file system, never committed).
  std::string scratch(const std::string& name) const {
    return (temp_.parent_path() / (temp_.filename().string() + "." + name)).string();
  }
  // fsyncs every file and the directory, then renames it into place.
  void commit();

 private:
  std::filesystem::path target_;
  std::filesystem::path temp_;
  bool committed_ = false;
};

// Writes the shards of a dataset in document order: the documents of `lengths` are cut into
// `num_shards` shards (assign_shards), each shard's entry is appended to `index.shards` when it
// is opened and gets its hash when it is complete. `index` must hold vocab_size, eos_id and
// tokenizer already; it and `lengths` must outlive the builder.
class ShardBuilder {
 public:
  ShardBuilder(AtomicDirectory& out, DatasetIndex& index, const std::vector<uint32_t>& lengths,
               uint32_t num_shards);

  // The open shard's writer; none (false) once every document has ended.
  bool writing() const { return writer_ != nullptr; }
  ShardWriter& writer() { return *writer_; }
  uint64_t documents() const { return doc_; }  // documents ended so far
  uint64_t shard_first_doc(uint32_t s) const { return first_[s]; }
  uint64_t shard_end_doc(uint32_t s) const { return first_[s + 1]; }

  // Ends the current document; after a shard's last one the shard is finished (its hash goes
  // into the index) and the next one opened.
  void end_document();

 private:
  void open_shard();

  AtomicDirectory& out_;
  DatasetIndex& index_;
  const std::vector<uint32_t>& lengths_;
  std::vector<uint64_t> first_;
  std::unique_ptr<ShardWriter> writer_;
  uint32_t shard_ = 0;
  uint64_t doc_ = 0;
};

}  // namespace kilter::io
