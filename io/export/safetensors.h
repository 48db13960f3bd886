// The safetensors format (Hugging Face), written and read by kilter itself (issue 26): an 8-byte
// little-endian header length N, N bytes of JSON ({"name": {"dtype", "shape", "data_offsets":
// [begin, end]}, "__metadata__": {...}}, padded with spaces to a multiple of 8), then the raw
// little-endian tensor bytes, offsets relative to the end of the header. What `kilter export
// --format hf` writes and `train.init_from` reads. Knows POSIX and JSON only.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kilter::io {

// One tensor to write: float32 values in row-major order, stored as `dtype` ("F32" or "BF16",
// bf16 rounded to nearest even).
struct SafetensorsTensor {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;  // product(shape) floats
};

// Writes `tensors` (in this order in the data section) to `path`; throws kilter::Error naming
// the file when it cannot be written. `metadata` goes to "__metadata__" (string values).
void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors, const std::string& dtype,
                       const std::map<std::string, std::string>& metadata = {});

// One tensor read back: its stored dtype and shape, and its values widened to float32
// (F32, BF16 and F16 are read; other dtypes are refused naming the tensor).
struct LoadedTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// The tensors of a safetensors file by name. A reader never trusts a file: a header length past
// the end of the file, JSON that does not parse, offsets out of range or overlapping, a size that
// does not match dtype x shape — each is an error naming the file (and the tensor).
std::map<std::string, LoadedTensor> read_safetensors(const std::string& path);

// float32 -> bf16 bits, round to nearest even (NaN stays NaN); and back.
uint16_t float_to_bf16(float value);
float bf16_to_float(uint16_t bits);

}  // namespace kilter::io
