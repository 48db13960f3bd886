// The "sentencepiece" tokenizer: a `*.model` file run by Debian's libsentencepiece, whose
// processor is const and thread-safe, so prep's worker threads share one instance.
#include <sentencepiece_processor.h>

#include "io/base/error.h"
#include "io/tokenizer/tokenizer.h"

namespace kilter::io {

namespace {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& model_bytes, const std::string& where)
      : bytes_(model_bytes) {
    sentencepiece::util::Status status;
    try {
      status = processor_.LoadFromSerializedProto(model_bytes);
    } catch (const std::exception& e) {
      // libsentencepiece throws from its trie builder on some malformed models (e.g. an empty
      // piece: Darts "zero-length key") instead of returning a status.
      KILTER_FAIL(where << ": not a valid SentencePiece model (" << e.what() << ")");
    }
    KILTER_CHECK(status.ok(), where << ": not a SentencePiece model nor a tokenizer.json ("
                                    << status.ToString() << ")");
    const int pieces = processor_.GetPieceSize();
    KILTER_CHECK(pieces > 0, where << ": the SentencePiece model has no pieces");
    pieces_ = uint32_t(pieces);
    // EOS: the model's own </s> when it has one; otherwise one id past its pieces (tokenizer.h).
    if (processor_.eos_id() >= 0) {
      eos_ = uint32_t(processor_.eos_id());
      vocab_ = pieces_;
    } else {
      eos_ = pieces_;
      vocab_ = pieces_ + 1;
    }
  }

  std::string kind() const override { return "sentencepiece"; }
  uint32_t vocab_size() const override { return vocab_; }
  uint32_t eos_id() const override { return eos_; }
  int64_t bos_id() const override { return processor_.bos_id(); }  // -1 when the model has none

  void encode(std::string_view text, std::vector<uint32_t>& out) const override {
    std::vector<int> ids;
    auto status = processor_.Encode(absl::string_view(text.data(), text.size()), &ids);
    KILTER_CHECK(status.ok(), "SentencePiece encode failed: " << status.ToString());
    out.insert(out.end(), ids.begin(), ids.end());
  }

  std::string decode(const uint32_t* ids, size_t count) const override {
    std::vector<int> pieces;
    pieces.reserve(count);
    for (size_t i = 0; i < count; ++i)
      if (ids[i] < pieces_ && ids[i] != eos_) pieces.push_back(int(ids[i]));
    std::string text;
    auto status = processor_.Decode(pieces, &text);
    KILTER_CHECK(status.ok(), "SentencePiece decode failed: " << status.ToString());
    return text;
  }

  const std::string& file_bytes() const override { return bytes_; }

 private:
  std::string bytes_;
  sentencepiece::SentencePieceProcessor processor_;
  uint32_t pieces_ = 0;
  uint32_t vocab_ = 0;
  uint32_t eos_ = 0;
};

}  // namespace

std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const std::string& model_bytes,
                                                        const std::string& where) {
  return std::make_unique<SentencePieceTokenizer>(model_bytes, where);
}

}  // namespace kilter::io
