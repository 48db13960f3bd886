// Fuzz harness (issue 17): raw bytes as a NumPy .npy file (header dict, 1-D integer array), the input of
// `kilter prep --format npy` (io/import_formats.cpp).
#include "fuzz_import.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = kilter::fuzz::scratch_dir() + "/input.npy";
  kilter::fuzz::write_file(path, data, size);
  return kilter::fuzz::run_import_harness(kilter::io::ImportFormat::npy, path);
}
