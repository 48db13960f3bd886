// Fuzz harness (issue 17): raw bytes as the text the byte-level BPE encoder (io/tokenizer_hf.cpp)
// encodes, with a fixed small tokenizer.json from the seed corpus of fuzz_tokenizer_json
// (tests/fuzz/corpus/tokenizer_json/bpe-512.json; KILTER_FUZZ_TOKENIZER overrides the path).
// A byte-level BPE without normalizers must give back any text that holds no added token (those
// encode to their id; EOS decodes to ""): decode(encode(text)) == text.
#include <fstream>
#include <iterator>

#include "fuzz_tokenizer.h"

namespace {

const kilter::io::Tokenizer& fixed_tokenizer() {
  static std::unique_ptr<kilter::io::Tokenizer> tokenizer = [] {
    const char* env = std::getenv("KILTER_FUZZ_TOKENIZER");
    const std::string path = env ? env : KILTER_FUZZ_SEED_DIR "/tokenizer_json/bpe-512.json";
    std::ifstream in(path, std::ios::binary);
    if (!in) kilter::fuzz::finding("harness: cannot read the fixed tokenizer " + path);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return kilter::io::make_hf_bpe_tokenizer(bytes, path);
  }();
  return *tokenizer;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const kilter::io::Tokenizer& tokenizer = fixed_tokenizer();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    std::vector<uint32_t> ids;
    tokenizer.encode(text, ids);
    for (uint32_t id : ids) KILTER_FUZZ_EXPECT(id < tokenizer.vocab_size(), "an encoded id is out of range");
    const std::string back = tokenizer.decode(ids.data(), ids.size());
    if (text.find("<|endoftext|>") == std::string_view::npos)
      KILTER_FUZZ_EXPECT(back == text, "decode(encode(text)) differs from the text");
  } catch (const kilter::Error&) {
  }
  return 0;
}
