// The byte tokenizer and the one place that rebuilds a recorded tokenizer by kind.
#include "io/tokenizer/tokenizer.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "io/base/error.h"
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

// A tokenizer.json is a JSON object; a SentencePiece model is a protobuf, which never starts
// with '{' (field 1 of ModelProto is a repeated message: tag byte 0x0a).
bool looks_like_json(const std::string& bytes) {
  for (char c : bytes) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;
    return c == '{';
  }
  return false;
}

}  // namespace

std::unique_ptr<Tokenizer> make_byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& kind, const std::string& file_bytes,
                                          const std::string& where) {
  if (kind == "byte") return make_byte_tokenizer();
  if (kind == "sentencepiece") return make_sentencepiece_tokenizer(file_bytes, where);
  if (kind == "hf-bpe") return make_hf_bpe_tokenizer(file_bytes, where);
  if (kind == "imported") {
    // An imported corpus records the tokenizer file attached to it, if any, whatever its kind.
    KILTER_CHECK(!file_bytes.empty(), where << ": the imported corpus records no tokenizer file "
                                            << "(attach one with kilter prep --tokenizer FILE)");
    return looks_like_json(file_bytes) ? make_hf_bpe_tokenizer(file_bytes, where)
                                       : make_sentencepiece_tokenizer(file_bytes, where);
  }
  KILTER_FAIL(where << ": tokenizer kind '" << kind << "' is not supported by this build of kilter"
                    << " (known: byte, sentencepiece, hf-bpe, imported)");
}

std::unique_ptr<Tokenizer> load_tokenizer_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  KILTER_USER_CHECK(file, "--tokenizer " << path << ": cannot open (" << std::strerror(errno) << ")");
  std::ostringstream bytes;
  bytes << file.rdbuf();
  KILTER_USER_CHECK(!file.bad(), "--tokenizer " << path << ": read error");
  std::string data = bytes.str();
  KILTER_USER_CHECK(!data.empty(), "--tokenizer " << path << ": the file is empty");
  if (looks_like_json(data)) return make_hf_bpe_tokenizer(data, path);
  return make_sentencepiece_tokenizer(data, path);
}

}  // namespace kilter::io
