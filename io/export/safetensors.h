// The safetensors format (Hugging Face), written and read by kilter itself: an 8-byte
// little-endian header length N, N bytes of JSON ({"name": {"dtype", "shape", "data_offsets":
// [begin, end]}, "__metadata__": {...}}, padded with spaces to a multiple of 8), then the raw
// little-endian tensor bytes, offsets relative to the end of the header. What `kilter export
// --format hf` writes and `train.init_from` reads: both one tensor at a time, so neither holds a
// second copy of a model. Knows POSIX and JSON only.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace kilter::io {

// One tensor to write: float32 values in row-major order, stored as `dtype` ("F32" or "BF16",
// bf16 rounded to nearest even). The values are `data`, or, where data is null, what `fill`
// writes into a scratch buffer of product(shape) floats just before the tensor is written (a
// transposed copy made one tensor at a time).
struct SafetensorsTensor {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;  // product(shape) floats
  std::function<void(float* out)> fill;
};

// Writes `tensors` (in this order in the data section) to `path`; throws kilter::Error naming
// the file when it cannot be written. `metadata` goes to "__metadata__" (string values).
void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors, const std::string& dtype,
                       const std::map<std::string, std::string>& metadata = {});

// One tensor of a file as its header describes it; begin and end are byte offsets in the file.
struct SafetensorsEntry {
  std::string dtype;  // F32 | BF16 | F16
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
  uint64_t elements() const;
};

// A safetensors file opened for reading tensor by tensor. The constructor reads and checks the
// whole header: a header length past the end of the file, JSON that does not parse, a dtype other
// than F32, BF16 or F16, offsets out of range or overlapping, a size that does not match
// dtype x shape - each is an error naming the file (and the tensor). read() then pread()s one
// tensor straight into the caller's floats (F32 without a copy, BF16 and F16 widened exactly
// through a bounded buffer).
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  // Tensor `name`'s values as float32 into out[0, elements); throws naming the file and tensor.
  void read(const std::string& name, float* out) const;

 private:
  std::string path_;
  int fd_ = -1;
  std::map<std::string, SafetensorsEntry> entries_;
};

// One tensor read back: its stored dtype and shape, and its values widened to float32
// (F32, BF16 and F16 are read; other dtypes are refused naming the tensor).
struct LoadedTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// The tensors of a safetensors file by name, all in memory (SafetensorsFile's checks; for tests
// and tools: a model is read tensor by tensor with SafetensorsFile).
std::map<std::string, LoadedTensor> read_safetensors(const std::string& path);

// float32 -> bf16 bits, round to nearest even (NaN stays NaN); and back.
uint16_t float_to_bf16(float value);
float bf16_to_float(uint16_t bits);

}  // namespace kilter::io
