// Fuzz harness (issue 26): raw bytes as a model.safetensors file, read as `train.init_from` reads
// an HF directory's weights (io/export/safetensors.h). Refusals must be kilter::Error; a file
// that reads must give every tensor as many values as its shape holds.
#include <cstdint>
#include <string>

#include "fuzz_common.h"
#include "io/export/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = kilter::fuzz::scratch_dir() + "/model.safetensors";
  kilter::fuzz::write_file(path, data, size);
  try {
    for (const auto& [name, tensor] : kilter::io::read_safetensors(path)) {
      uint64_t n = 1;
      for (int64_t d : tensor.shape) n *= uint64_t(d);
      KILTER_FUZZ_EXPECT(tensor.values.size() == n, "tensor " + name + ": values do not match its shape");
    }
  } catch (const kilter::Error&) {
    // the expected, clean refusal
  }
  return 0;
}
