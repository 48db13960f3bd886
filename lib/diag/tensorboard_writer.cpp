// TensorBoard event files (see tensorboard_writer.h): the CRC, the few protobuf fields of
// `Event` that scalars need, the TFRecord framing, and a reader of the same fields so a resumed
// run knows which steps its folder already holds.
#include "lib/diag/tensorboard_writer.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "io/base/error.h"

namespace kilter::diag {

namespace {

struct Crc32cTable {
  uint32_t entry[256];
  Crc32cTable() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      entry[i] = c;
    }
  }
};

// Protobuf wire format: a field's key is (number << 3) | wire type; 0 varint, 1 fixed64,
// 2 length-delimited, 5 fixed32.
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char(uint8_t(v) | 0x80));
    v >>= 7;
  }
  out.push_back(char(v));
}
void put_key(std::string& out, int field, int wire_type) { put_varint(out, uint64_t(field) << 3 | uint64_t(wire_type)); }
void put_fixed(std::string& out, const void* bytes, size_t n) {  // little-endian hosts only (x86-64, aarch64)
  out.append(static_cast<const char*>(bytes), n);
}
void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
}
std::string event_header(double wall_time, int64_t step) {
  std::string out;
  put_key(out, 1, 1);
  put_fixed(out, &wall_time, 8);
  if (step != 0) {
    put_key(out, 2, 0);
    put_varint(out, uint64_t(step));
  }
  return out;
}

// A protobuf message read field by field; false at the end or on a malformed field.
struct FieldReader {
  const uint8_t* p;
  const uint8_t* end;
  int field = 0, wire_type = 0;
  uint64_t varint = 0;
  const uint8_t* bytes = nullptr;
  size_t length = 0;

  bool get_varint(uint64_t& v) {
    v = 0;
    for (int shift = 0; p < end && shift < 64; shift += 7) {
      const uint8_t b = *p++;
      v |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return true;
    }
    return false;
  }
  bool next() {
    if (p >= end) return false;
    uint64_t key = 0;
    if (!get_varint(key)) return false;
    field = int(key >> 3);
    wire_type = int(key & 7);
    switch (wire_type) {
      case 0: return get_varint(varint);
      case 1: length = 8; break;
      case 5: length = 4; break;
      case 2: {
        uint64_t n = 0;
        if (!get_varint(n)) return false;
        length = size_t(n);
        break;
      }
      default: return false;
    }
    if (size_t(end - p) < length) return false;
    bytes = p;
    p += length;
    return true;
  }
};

// The step and the scalar tags of one Event record.
void read_event(const std::string& data, std::map<std::string, int64_t>& steps) {
  FieldReader event{reinterpret_cast<const uint8_t*>(data.data()), reinterpret_cast<const uint8_t*>(data.data()) + data.size()};
  int64_t step = 0;
  std::vector<std::string> tags;
  while (event.next()) {
    if (event.field == 2 && event.wire_type == 0) step = int64_t(event.varint);
    if (event.field != 5 || event.wire_type != 2) continue;
    FieldReader summary{event.bytes, event.bytes + event.length};
    while (summary.next()) {
      if (summary.field != 1 || summary.wire_type != 2) continue;
      FieldReader value{summary.bytes, summary.bytes + summary.length};
      std::string tag;
      bool scalar = false;
      while (value.next()) {
        if (value.field == 1 && value.wire_type == 2) tag.assign(reinterpret_cast<const char*>(value.bytes), value.length);
        if (value.field == 2 && value.wire_type == 5) scalar = true;
      }
      if (scalar && !tag.empty()) tags.push_back(tag);
    }
  }
  for (const std::string& tag : tags) {
    auto [it, inserted] = steps.emplace(tag, step);
    if (!inserted && it->second < step) it->second = step;
  }
}

bool is_event_file(const std::filesystem::path& p) {
  return p.filename().string().find("tfevents") != std::string::npos;
}

}  // namespace

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
  static const Crc32cTable table;
  const uint8_t* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) crc = table.entry[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string encode_file_version_event(double wall_time) {
  std::string out = event_header(wall_time, 0);
  put_bytes(out, 3, "brain.Event:2");
  return out;
}

std::string encode_scalars_event(double wall_time, int64_t step, const Scalars& values) {
  std::string summary;
  for (const auto& [tag, value] : values) {
    std::string v;
    put_bytes(v, 1, tag);
    const float f = float(value);
    put_key(v, 2, 5);
    put_fixed(v, &f, 4);
    put_bytes(summary, 1, v);
  }
  std::string out = event_header(wall_time, step);
  put_bytes(out, 5, summary);
  return out;
}

std::string frame_record(const std::string& data) {
  std::string out;
  const uint64_t length = data.size();
  put_fixed(out, &length, 8);
  const uint32_t length_crc = masked_crc32c(&length, 8);
  put_fixed(out, &length_crc, 4);
  out += data;
  const uint32_t data_crc = masked_crc32c(data.data(), data.size());
  put_fixed(out, &data_crc, 4);
  return out;
}

std::map<std::string, int64_t> scalar_steps_in(const std::string& dir) {
  std::map<std::string, int64_t> steps;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (!entry.is_regular_file() || !is_event_file(entry.path())) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    while (in) {
      uint64_t length = 0;
      uint32_t length_crc = 0, data_crc = 0;
      if (!in.read(reinterpret_cast<char*>(&length), 8) || !in.read(reinterpret_cast<char*>(&length_crc), 4)) break;
      if (masked_crc32c(&length, 8) != length_crc || length > (uint64_t(1) << 30)) break;
      std::string data(size_t(length), '\0');
      if (!in.read(data.data(), std::streamsize(length)) || !in.read(reinterpret_cast<char*>(&data_crc), 4)) break;
      if (masked_crc32c(data.data(), data.size()) != data_crc) break;
      read_event(data, steps);
    }
  }
  return steps;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, bool resume) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  KILTER_CHECK(std::filesystem::is_directory(dir), "cannot create TensorBoard folder " << dir << ": " << ec.message());
  written_ = scalar_steps_in(dir);
  KILTER_USER_CHECK(resume || written_.empty(),
                    "TensorBoard folder " << dir << " already holds scalars of another run; it is kept: remove it, "
                    "train into another output.dir, or pass --force to move the old run aside");
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  host[sizeof host - 1] = '\0';
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  // TensorFlow's name (seconds, host) and the process, so two writers never share a file.
  for (int n = 0;; ++n) {
    path_ = dir + "/events.out.tfevents." + std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now).count()) +
            "." + host + "." + std::to_string(getpid()) + "." + std::to_string(n);
    if (!std::filesystem::exists(path_)) break;
  }
  file_ = std::fopen(path_.c_str(), "wb");
  KILTER_CHECK(file_, "cannot create TensorBoard event file " << path_ << ": " << std::strerror(errno));
  write_record(encode_file_version_event(std::chrono::duration<double>(now).count()));
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::add_scalars(int64_t step, const Scalars& values) {
  Scalars fresh;
  for (const auto& [tag, value] : values) {
    if (!std::isfinite(value)) continue;
    auto it = written_.find(tag);
    if (it != written_.end() && it->second >= step) continue;
    written_[tag] = step;
    fresh.emplace_back(tag, value);
  }
  if (fresh.empty()) return;
  const double wall_time = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  write_record(encode_scalars_event(wall_time, step, fresh));
}

void TensorBoardWriter::write_record(const std::string& data) {
  const std::string record = frame_record(data);
  KILTER_CHECK(std::fwrite(record.data(), 1, record.size(), file_) == record.size(),
               "cannot write TensorBoard event file " << path_ << ": " << std::strerror(errno));
}

void TensorBoardWriter::flush() {
  KILTER_CHECK(std::fflush(file_) == 0, "cannot write TensorBoard event file " << path_ << ": " << std::strerror(errno));
}

}  // namespace kilter::diag
