// safetensors writing and reading (see safetensors.h).
#include "io/export/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <set>

#include "io/base/error.h"
#include "io/text_format.h"

namespace kilter::io {

namespace {

// The header of any real model is a few hundred kB; a larger length is a damaged file.
constexpr uint64_t kMaxHeaderBytes = uint64_t(100) << 20;

uint64_t element_count(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= uint64_t(d);
  return n;
}

void write_all(int fd, const void* data, size_t bytes, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    KILTER_CHECK(n > 0, path << ": write failed: " << std::strerror(errno));
    p += n;
    bytes -= size_t(n);
  }
}

void read_all(int fd, void* data, size_t bytes, uint64_t offset, const std::string& path) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, p, bytes, off_t(offset));
    if (n < 0 && errno == EINTR) continue;
    KILTER_CHECK(n > 0, path << ": read failed at byte " << offset << ": " << (n == 0 ? "end of file" : std::strerror(errno)));
    p += n;
    bytes -= size_t(n);
    offset += uint64_t(n);
  }
}

uint16_t load_u16(const unsigned char* p) { return uint16_t(p[0] | (p[1] << 8)); }

float f16_to_float(uint16_t h) {
  const int sign = h >> 15, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  float v;
  if (exponent == 0) v = std::ldexp(float(mantissa), -24);
  else if (exponent == 31) v = mantissa ? NAN : INFINITY;
  else v = std::ldexp(float(mantissa | 0x400), exponent - 25);
  return sign ? -v : v;
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

uint16_t float_to_bf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);  // quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

float bf16_to_float(uint16_t bits) {
  const uint32_t wide = uint32_t(bits) << 16;
  float value;
  std::memcpy(&value, &wide, 4);
  return value;
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors, const std::string& dtype,
                       const std::map<std::string, std::string>& metadata) {
  KILTER_CHECK(dtype == "F32" || dtype == "BF16", "safetensors " << path << ": dtype " << dtype << " is not written (F32 | BF16)");
  static_assert(sizeof(float) == 4, "float32");
  const uint64_t width = dtype == "F32" ? 4 : 2;
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const SafetensorsTensor& t : tensors) {
    const uint64_t bytes = element_count(t.shape) * width;
    header[t.name] = {{"dtype", dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned

  Fd out;
  out.fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  KILTER_CHECK(out.fd >= 0, path << ": cannot create: " << std::strerror(errno));
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(uint64_t(text.size()) >> (8 * i));
  write_all(out.fd, length, 8, path);
  write_all(out.fd, text.data(), text.size(), path);
  // Little-endian values (the machines kilter runs on are little-endian), in chunks.
  std::vector<unsigned char> chunk;
  std::vector<float> scratch;
  for (const SafetensorsTensor& t : tensors) {
    const uint64_t n = element_count(t.shape);
    const float* data = t.data;
    if (!data) {
      KILTER_CHECK(t.fill, "safetensors " << path << ": tensor " << t.name << " has neither data nor fill");
      scratch.resize(size_t(n));
      t.fill(scratch.data());
      data = scratch.data();
    }
    if (dtype == "F32") {
      write_all(out.fd, data, size_t(n * 4), path);
      continue;
    }
    constexpr uint64_t kChunk = 1 << 20;
    for (uint64_t first = 0; first < n; first += kChunk) {
      const uint64_t count = std::min(kChunk, n - first);
      chunk.resize(size_t(count * 2));
      for (uint64_t i = 0; i < count; ++i) {
        const uint16_t b = float_to_bf16(data[first + i]);
        chunk[size_t(2 * i)] = static_cast<unsigned char>(b & 0xff);
        chunk[size_t(2 * i + 1)] = static_cast<unsigned char>(b >> 8);
      }
      write_all(out.fd, chunk.data(), chunk.size(), path);
    }
  }
  KILTER_CHECK(::fsync(out.fd) == 0, path << ": fsync failed: " << std::strerror(errno));
}

uint64_t SafetensorsEntry::elements() const { return element_count(shape); }

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  KILTER_CHECK(fd_ >= 0, path << ": cannot open: " << std::strerror(errno));
  Fd owner;  // closes the file if the header is refused (the destructor does not run then)
  owner.fd = fd_;
  struct stat st {};
  KILTER_CHECK(::fstat(fd_, &st) == 0, path << ": cannot stat: " << std::strerror(errno));
  const uint64_t file_size = uint64_t(st.st_size);
  KILTER_CHECK(file_size >= 8, path << ": not a safetensors file (" << file_size << " bytes, shorter than its 8-byte header length)");
  unsigned char length_bytes[8];
  read_all(fd_, length_bytes, 8, 0, path);
  uint64_t header_size = 0;
  for (int i = 0; i < 8; ++i) header_size |= uint64_t(length_bytes[i]) << (8 * i);
  KILTER_CHECK(header_size <= kMaxHeaderBytes && header_size <= file_size - 8,
               path << ": not a safetensors file, or truncated: its header length " << header_size
                    << " does not fit the file's " << file_size << " bytes");
  std::string text(size_t(header_size), '\0');
  read_all(fd_, text.data(), text.size(), 8, path);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    KILTER_FAIL(path << ": the safetensors header is not JSON (" << e.what() << ")");
  }
  KILTER_CHECK(header.is_object(), path << ": the safetensors header is not a JSON object");
  const uint64_t data_start = 8 + header_size, data_size = file_size - data_start;

  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string where = path + ": tensor " + name;
    SafetensorsEntry t;
    uint64_t begin = 0, end = 0;
    try {
      t.dtype = entry.at("dtype").get<std::string>();
      t.shape = entry.at("shape").get<std::vector<int64_t>>();
      const auto offsets = entry.at("data_offsets").get<std::vector<uint64_t>>();
      KILTER_CHECK(offsets.size() == 2, where << ": data_offsets must hold [begin, end]");
      begin = offsets[0];
      end = offsets[1];
    } catch (const nlohmann::json::exception& e) {
      KILTER_FAIL(where << ": malformed header entry (" << e.what() << ")");
    }
    uint64_t width = 0;
    if (t.dtype == "F32") width = 4;
    else if (t.dtype == "BF16" || t.dtype == "F16") width = 2;
    else KILTER_FAIL(where << ": dtype " << t.dtype << " is not read (F32, BF16 or F16)");
    for (int64_t d : t.shape) KILTER_CHECK(d >= 0 && d < (int64_t(1) << 40), where << ": bad shape " << shape_text(t.shape));
    const uint64_t n = element_count(t.shape);
    KILTER_CHECK(begin <= end && end <= data_size,
                 where << ": data_offsets [" << begin << ", " << end << ") lie outside the data section of "
                       << data_size << " bytes (truncated file?)");
    KILTER_CHECK(end - begin == n * width, where << ": holds " << (end - begin) << " bytes, but " << t.dtype << " "
                                                 << shape_text(t.shape) << " needs " << n * width);
    ranges.emplace_back(begin, end);
    t.begin = data_start + begin;
    t.end = data_start + end;
    entries_.emplace(name, std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    KILTER_CHECK(ranges[i].first >= ranges[i - 1].second, path << ": two tensors' data_offsets overlap at byte "
                                                                 << ranges[i].first << " (damaged file)");
  owner.fd = -1;
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

void SafetensorsFile::read(const std::string& name, float* out) const {
  const auto found = entries_.find(name);
  KILTER_CHECK(found != entries_.end(), path_ << ": no tensor " << name);
  const SafetensorsEntry& t = found->second;
  if (t.dtype == "F32") {
    // Little-endian floats, as on the machines kilter runs on: straight into place.
    if (t.end > t.begin) read_all(fd_, out, size_t(t.end - t.begin), t.begin, path_);
    return;
  }
  // 16-bit values widened through a bounded buffer.
  constexpr uint64_t kChunkElements = uint64_t(1) << 20;
  std::vector<unsigned char> raw;
  const uint64_t n = t.elements();
  for (uint64_t first = 0; first < n; first += kChunkElements) {
    const uint64_t count = std::min(kChunkElements, n - first);
    raw.resize(size_t(2 * count));
    read_all(fd_, raw.data(), raw.size(), t.begin + 2 * first, path_);
    float* dst = out + first;
    if (t.dtype == "BF16") for (uint64_t i = 0; i < count; ++i) dst[i] = bf16_to_float(load_u16(&raw[size_t(2 * i)]));
    else for (uint64_t i = 0; i < count; ++i) dst[i] = f16_to_float(load_u16(&raw[size_t(2 * i)]));
  }
}

std::map<std::string, LoadedTensor> read_safetensors(const std::string& path) {
  const SafetensorsFile file(path);
  std::map<std::string, LoadedTensor> tensors;
  for (const auto& [name, entry] : file.entries()) {
    LoadedTensor t;
    t.dtype = entry.dtype;
    t.shape = entry.shape;
    t.values.resize(size_t(entry.elements()));
    file.read(name, t.values.data());
    tensors.emplace(name, std::move(t));
  }
  return tensors;
}

}  // namespace kilter::io
