// Fuzz harness (issue 17): raw bytes as one text input file of `kilter prep` (io/corpus.cpp).
#include "fuzz_corpus.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return kilter::fuzz::run_corpus_harness(kilter::io::InputFormat::text, "input.text", data, size);
}
