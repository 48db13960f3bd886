// The body of the tokenizer harnesses: a tokenizer built from fuzzed file bytes (or a fixed one)
// must encode and decode without crashing, give ids below its vocab_size, an eos_id below it,
// and decode any id (out of range ones to "").
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_common.h"
#include "io/tokenizer/tokenizer.h"

namespace kilter::fuzz {

inline void exercise_tokenizer(const io::Tokenizer& tokenizer, std::string_view text) {
  KILTER_FUZZ_EXPECT(tokenizer.vocab_size() > 0, "a tokenizer with vocab_size 0 was accepted");
  KILTER_FUZZ_EXPECT(tokenizer.eos_id() < tokenizer.vocab_size(), "eos_id is not below vocab_size");
  std::vector<uint32_t> ids;
  tokenizer.encode(text, ids);
  for (uint32_t id : ids) KILTER_FUZZ_EXPECT(id < tokenizer.vocab_size(), "an encoded id is out of range");
  if (!text.empty()) KILTER_FUZZ_EXPECT(!ids.empty(), "a non-empty text encoded to no ids");
  (void)tokenizer.decode(ids.data(), ids.size());
  // Every id decodes, those past the vocabulary included.
  std::vector<uint32_t> all;
  const uint32_t limit = std::min<uint32_t>(tokenizer.vocab_size(), 4096) + 2;
  for (uint32_t id = 0; id < limit; ++id) all.push_back(id);
  all.push_back(tokenizer.vocab_size());
  all.push_back(UINT32_MAX);
  (void)tokenizer.decode(all.data(), all.size());
}

// Text that reaches the pre-tokenizers' and normalizers' branches: words, spaces, digits,
// punctuation, contractions, newlines, multi-byte UTF-8, invalid UTF-8 and a NUL.
constexpr std::string_view kSampleText(
    "Hello world, it's 2024: 12345 tokens!\n\n  tabs\tand  spaces   \xc3\xa9t\xc3\xa9 "
    "\xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80 <|endoftext|> </s> \xff\xfe invalid \x00 nul",
    sizeof("Hello world, it's 2024: 12345 tokens!\n\n  tabs\tand  spaces   \xc3\xa9t\xc3\xa9 "
           "\xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80 <|endoftext|> </s> \xff\xfe invalid \x00 nul") - 1);

// The file harnesses' body: fuzzed bytes as a tokenizer file of `kind`. A refusal is the expected
// outcome; a tokenizer that loads must pass exercise_tokenizer on the sample text.
inline int fuzz_tokenizer_file(const uint8_t* data, size_t size, const char* kind, const char* name) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  std::unique_ptr<io::Tokenizer> tokenizer;
  try {
    tokenizer = io::load_tokenizer(kind, bytes, name);
  } catch (const Error&) {
    return 0;  // refused cleanly
  }
  try {
    exercise_tokenizer(*tokenizer, kSampleText);
  } catch (const Error&) {
  }
  return 0;
}

}  // namespace kilter::fuzz
