// Fuzz harness (issue 17): raw bytes as an llm.c token file (256 int32 header, then uint16/uint32 tokens), the input of
// `kilter prep --format llmc` (io/import_formats.cpp).
#include "fuzz_import.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = kilter::fuzz::scratch_dir() + "/input.bin";
  kilter::fuzz::write_file(path, data, size);
  return kilter::fuzz::run_import_harness(kilter::io::ImportFormat::llmc, path);
}
