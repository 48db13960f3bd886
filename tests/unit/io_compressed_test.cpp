// io/compressed_input (issue 26): plain, gzip and zstd streams give the same lines (long lines
// that outgrow the buffer, NULs, a last line without '\n'), count the file bytes consumed, and a
// damaged stream is an error naming the file.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io/compressed_input.h"
#include "io/base/error.h"

namespace kilter::io {
namespace {

namespace fs = std::filesystem;

std::string scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("kilter-compressed-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return (dir / name).string();
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}

std::string gzip(const std::string& text) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&z, uLong(text.size())), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  z.avail_in = uInt(text.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = uInt(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

std::string zstd(const std::string& text) {
  std::string out(ZSTD_compressBound(text.size()), '\0');
  const size_t n = ZSTD_compress(out.data(), out.size(), text.data(), text.size(), 3);
  EXPECT_FALSE(ZSTD_isError(n));
  out.resize(n);
  return out;
}

std::vector<std::string> lines_of(const std::string& path, uint64_t* file_bytes = nullptr) {
  StreamLineReader reader(path);
  std::vector<std::string> lines;
  const unsigned char* data = nullptr;
  size_t size = 0;
  uint64_t bytes = 0;
  while (reader.next(data, size)) {
    lines.emplace_back(reinterpret_cast<const char*>(data), size);
    bytes += reader.take_file_bytes();
  }
  bytes += reader.take_file_bytes();
  if (file_bytes) *file_bytes = bytes;
  return lines;
}

TEST(CompressedInput, PlainGzipAndZstdGiveTheSameLines) {
  const std::string a = "first\n" + std::string(200000, 'x') + "\n" + std::string("nul\0inside\n", 11);
  const std::string b = "second member\nlast line without newline";
  const std::vector<std::string> want = {"first\n", std::string(200000, 'x') + "\n", std::string("nul\0inside\n", 11),
                                         "second member\n", "last line without newline"};
  write_file(scratch("plain"), a + b);
  write_file(scratch("gz"), gzip(a) + gzip(b));  // two members, as `cat x.gz y.gz` makes
  write_file(scratch("zst"), zstd(a) + zstd(b));  // two frames
  for (const char* name : {"plain", "gz", "zst"}) {
    uint64_t bytes = 0;
    EXPECT_EQ(lines_of(scratch(name), &bytes), want) << name;
    EXPECT_EQ(bytes, fs::file_size(scratch(name))) << name;  // progress reaches the size on disk
  }
  EXPECT_STREQ(InputStream(scratch("gz")).kind(), "gzip");
  EXPECT_STREQ(InputStream(scratch("zst")).kind(), "zstd");
  EXPECT_STREQ(InputStream(scratch("plain")).kind(), "plain");
  EXPECT_TRUE(lines_of(scratch("plain")).size() == 5);
  write_file(scratch("empty"), "");
  EXPECT_TRUE(lines_of(scratch("empty")).empty());
}

TEST(CompressedInput, DamagedStreamsNameTheFile) {
  const std::string text(100000, 'y');
  for (const std::string& name : {std::string("cut.gz"), std::string("cut.zst")}) {
    const std::string packed = name == "cut.gz" ? gzip(text) : zstd(text);
    write_file(scratch(name), packed.substr(0, packed.size() - 6));
    try {
      lines_of(scratch(name));
      ADD_FAILURE() << name << " read without error";
    } catch (const Error& e) {
      EXPECT_NE(e.message().find(scratch(name)), std::string::npos) << e.message();
      EXPECT_NE(e.message().find("ends early"), std::string::npos) << e.message();
    }
  }
  std::string garbage = gzip(text);
  garbage[20] = char(garbage[20] ^ 0xff);
  garbage[21] = char(garbage[21] ^ 0xff);
  write_file(scratch("bad.gz"), garbage);
  EXPECT_THROW(lines_of(scratch("bad.gz")), Error);
  fs::remove_all(fs::path(scratch("x")).parent_path());
}

}  // namespace
}  // namespace kilter::io
