// Input files as `kilter prep` reads them: plain, gzip (.gz, zlib) or zstd (.zst,
// libzstd), told apart by their magic bytes and decompressed while they stream, with no temporary
// copy. Concatenated gzip members and zstd frames are read as one stream, as gzip -d and zstd -d
// do. A truncated or damaged file is an error naming it. The bytes consumed from the file (the
// compressed bytes) are what prep's progress counts against the files' sizes on disk.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace kilter::io {

class InputStream {
 public:
  explicit InputStream(const std::string& path);  // throws naming the file when it cannot be opened
  ~InputStream();
  InputStream(const InputStream&) = delete;
  InputStream& operator=(const InputStream&) = delete;

  // Up to `size` decompressed bytes into `data`; 0 only at the end of the file.
  size_t read(unsigned char* data, size_t size);
  // Bytes consumed from the file so far (compressed bytes for .gz/.zst).
  uint64_t file_bytes() const { return file_bytes_; }
  // "plain" | "gzip" | "zstd"
  const char* kind() const;
  const std::string& path() const { return path_; }

 private:
  size_t fill_raw();  // refills raw_ from the file; returns the bytes read

  enum class Kind { plain, gzip, zstd };
  struct Codec;
  std::string path_;
  FILE* file_ = nullptr;
  Kind kind_ = Kind::plain;
  std::unique_ptr<Codec> codec_;
  std::vector<unsigned char> raw_;
  size_t raw_begin_ = 0, raw_end_ = 0;
  bool raw_eof_ = false;
  uint64_t file_bytes_ = 0;
};

// Lines of an InputStream: each line with its '\n' (the last may lack one), any bytes (NULs
// included), the buffer reused; 1-based line numbers for error messages.
class StreamLineReader {
 public:
  explicit StreamLineReader(const std::string& path) : stream_(path) {}
  // The next line; false at the end of the file. The pointer is valid until the next call.
  bool next(const unsigned char*& data, size_t& size);
  uint64_t line_number() const { return line_number_; }
  // File bytes consumed since the last call (for progress).
  uint64_t take_file_bytes();

 private:
  InputStream stream_;
  std::vector<unsigned char> buffer_ = std::vector<unsigned char>(size_t(64) << 10);
  size_t begin_ = 0, end_ = 0;
  bool eof_ = false;
  uint64_t line_number_ = 0;
  uint64_t reported_ = 0;
};

}  // namespace kilter::io
