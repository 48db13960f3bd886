// Fuzz harness (issue 17): raw bytes as a Hugging Face tokenizer.json (io/tokenizer_hf.cpp,
// through load_tokenizer as index.h5 and checkpoints rebuild it), then encode and decode with it.
#include "fuzz_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  std::unique_ptr<kilter::io::Tokenizer> tokenizer;
  try {
    tokenizer = kilter::io::load_tokenizer("hf-bpe", bytes, "fuzz.json");
  } catch (const kilter::Error&) {
    return 0;  // refused cleanly
  }
  try {
    kilter::fuzz::exercise_tokenizer(*tokenizer, kilter::fuzz::kSampleText);
  } catch (const kilter::Error&) {
  }
  return 0;
}
