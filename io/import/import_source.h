// Internal to the importers (io/import*.cpp): a memory-mapped input file, the integer element
// types tokenized corpora use, and the token sources the four formats open. A source checks its
// file's structure when opened (magic, version, counts against the file size, dtype) and then
// hands out its tokens as segments: runs of elements at known byte offsets of a mapped file.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "io/import/import.h"

namespace kilter::io::import_detail {

// A read-only, private mapping of a whole file (nothing is read until touched; the kernel pages
// it in and out as the importer streams through it).
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // throws naming the file
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }
  const unsigned char* data() const { return data_; }
  // Tells the kernel the pages of [offset, offset+bytes) are done with (keeps memory bounded on
  // inputs larger than RAM).
  void release(uint64_t offset, uint64_t bytes) const;

 private:
  std::string path_;
  uint64_t size_ = 0;
  unsigned char* data_ = nullptr;
};

// Little-endian integer element types.
enum class Dtype { u8, i8, u16, i16, u32, i32, u64, i64 };
size_t dtype_bytes(Dtype dtype);
const char* dtype_name(Dtype dtype);  // numpy spelling: "uint16", ...

// A run of `count` elements of `dtype` at byte `offset` of `file`.
struct Segment {
  const MappedFile* file = nullptr;
  uint64_t offset = 0;
  uint64_t count = 0;
  Dtype dtype = Dtype::u16;
  bool ends_document = false;  // a document boundary follows (Megatron's document index)
};

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  // The segments in stream order.
  virtual void for_each_segment(const std::function<void(const Segment&)>& fn) const = 0;
  // The EOT id the format's writers put between documents (GPT-2's 50256, llm.c's LLaMA-3 BOS).
  virtual uint32_t conventional_eot() const = 0;
  virtual uint64_t input_bytes() const = 0;
};

// Opens and checks one input of `format`; throws naming the file and byte offset of a fault.
std::unique_ptr<TokenSource> open_token_source(ImportFormat format, const std::string& path);

}  // namespace kilter::io::import_detail
