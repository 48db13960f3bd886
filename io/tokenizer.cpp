// The byte tokenizer and the one place that rebuilds a recorded tokenizer by kind.
#include "io/tokenizer.h"

#include "io/error.h"
#include "io/prep.h"

namespace kilter::io {

namespace {

class ByteTokenizer final : public Tokenizer {
 public:
  std::string kind() const override { return "byte"; }
  uint32_t vocab_size() const override { return kByteVocabSize; }
  uint32_t eos_id() const override { return kByteEosId; }
  void encode(std::string_view text, std::vector<uint32_t>& out) const override {
    out.reserve(out.size() + text.size());
    for (unsigned char c : text) out.push_back(c);
  }
  std::string decode(const uint32_t* ids, size_t count) const override {
    std::string text;
    text.reserve(count);
    for (size_t i = 0; i < count; ++i)
      if (ids[i] < 256) text.push_back(char(ids[i]));
    return text;
  }
  const std::string& file_bytes() const override { return empty_; }

 private:
  std::string empty_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& kind, const std::string& file_bytes,
                                          const std::string& where) {
  if (kind == "byte") return make_byte_tokenizer();
  (void)file_bytes;
  KILTER_FAIL(where << ": tokenizer kind '" << kind << "' is not supported by this build of kilter"
                    << " (known: byte)");
}

}  // namespace kilter::io
