// Fuzz harness (issue 17): raw bytes as a Megatron-LM indexed dataset, the input of
// `kilter prep --format megatron` (io/import_formats.cpp). The first 4 bytes (little-endian,
// modulo what is left) give the length of the .idx file; it takes the bytes after them, the .bin
// file the rest.
#include "fuzz_import.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kilter::fuzz::Input in(data, size);
  const uint32_t idx_bytes = uint32_t(in.u32() % (in.left() + 1));
  const size_t head = size - in.left();
  const std::string prefix = kilter::fuzz::scratch_dir() + "/input";
  kilter::fuzz::write_file(prefix + ".idx", data + head, idx_bytes);
  kilter::fuzz::write_file(prefix + ".bin", data + head + idx_bytes, size - head - idx_bytes);
  return kilter::fuzz::run_import_harness(kilter::io::ImportFormat::megatron, prefix);
}
