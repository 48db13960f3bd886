// Tokenizers as the dataset records them (docs/design.md, "Dataset format": index.h5 holds the kind
// and the tokenizer file's bytes): one interface for prep (encode), `kilter sample` and the
// training samples (decode). The byte tokenizer is built in; "sentencepiece" and "hf-bpe" load
// from the recorded file bytes; "imported" corpora may carry either, or none (ids only).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kilter::io {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // "byte" | "sentencepiece" | "hf-bpe" | "imported" (as index.h5's `tokenizer` attribute).
  virtual std::string kind() const = 0;
  virtual uint32_t vocab_size() const = 0;
  // The id that ends every document (the reader supplies it after a document's last token).
  virtual uint32_t eos_id() const = 0;
  // The id that begins a sequence where the tokenizer defines one (Llama's <s>,
  // <|begin_of_text|>), -1 where it does not: what `kilter prep --bos` puts before every document.
  virtual int64_t bos_id() const { return -1; }
  // Appends the ids of `text` to `out` (no EOS is added).
  virtual void encode(std::string_view text, std::vector<uint32_t>& out) const = 0;
  // The text of `ids`; ids that have no text (EOS, ids out of range) decode to "".
  virtual std::string decode(const uint32_t* ids, size_t count) const = 0;
  // The bytes index.h5 and checkpoints record to rebuild this tokenizer (empty for "byte").
  virtual const std::string& file_bytes() const = 0;
};

// The built-in byte tokenizer: id = byte value, vocab 257, EOS 256.
std::unique_ptr<Tokenizer> make_byte_tokenizer();

// The EOS rule for tokenizers that name none (a SentencePiece model trained with eos_id=-1, a
// tokenizer.json without <|endoftext|>, <|end_of_text|>, </s> or <eos>): kilter appends one id
// past the tokenizer's own, so eos_id = the tokenizer's vocabulary size and vocab_size is one
// larger. The extra id decodes to "" like every EOS.

// A SentencePiece model (the bytes of a `*.model` file, a serialized ModelProto).
std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const std::string& model_bytes,
                                                        const std::string& where);
// A Hugging Face tokenizer.json whose model is a byte-level BPE (see io/tokenizer_hf.cpp for
// the components it reads); anything else is refused naming the unsupported component.
std::unique_ptr<Tokenizer> make_hf_bpe_tokenizer(const std::string& json_bytes,
                                                 const std::string& where);

// Reads a tokenizer file and recognises its kind by content: a JSON object is a tokenizer.json,
// anything else must parse as a SentencePiece model. Throws naming `path`.
std::unique_ptr<Tokenizer> load_tokenizer_file(const std::string& path);

// Rebuilds a recorded tokenizer from its kind and file bytes, as index.h5 and checkpoints store
// them. Throws kilter::Error naming `where` (a file and key) when the kind is unknown or the
// bytes do not parse.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& kind, const std::string& file_bytes,
                                          const std::string& where);

}  // namespace kilter::io
