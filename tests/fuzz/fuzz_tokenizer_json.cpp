// Fuzz harness (issue 17): raw bytes as a Hugging Face tokenizer.json (io/tokenizer_hf.cpp,
// through load_tokenizer as index.h5 and checkpoints rebuild it), then encode and decode with it.
#include "fuzz_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return kilter::fuzz::fuzz_tokenizer_file(data, size, "hf-bpe", "fuzz.json");
}
