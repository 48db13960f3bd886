// Streaming shard writer (see shard_writer.h).
#include "io/shard_writer.h"

#include <cstring>

#include "io/dataset.h"
#include "io/base/error.h"

namespace kilter::io {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the content hash is defined over little-endian bytes; add a byte swap");

constexpr size_t kBufferTokens = size_t(1) << 20;  // 2-4 MiB per H5Dwrite

ShardWriter::ShardWriter(const std::string& path, const ShardHeader& header,
                         const std::vector<uint32_t>& doc_lengths)
    : path_(path), header_(header), doc_lengths_(doc_lengths) {
  KILTER_CHECK(header.eos_id < header.vocab_size, path << ": eos_id " << header.eos_id
                                                       << " is not below vocab_size "
                                                       << header.vocab_size);
  token_bytes_ = token_bytes_for_vocab(header.vocab_size);
  std::vector<uint64_t> offsets(doc_lengths.size() + 1, 0);
  for (size_t i = 0; i < doc_lengths.size(); ++i) offsets[i + 1] = offsets[i] + doc_lengths[i];
  total_tokens_ = offsets.back();

  file_ = h5::create_file(path);
  h5::write_attribute(file_, "format", std::string(kShardFormat));
  h5::write_attribute(file_, "format_version", uint64_t(kFormatVersion));
  h5::write_attribute(file_, "vocab_size", uint64_t(header.vocab_size));
  h5::write_attribute(file_, "tokenizer", header.tokenizer);
  h5::write_attribute(file_, "eos_id", uint64_t(header.eos_id));
  h5::write_attribute(file_, "shard_index", uint64_t(header.shard_index));
  h5::write_attribute(file_, "num_shards", uint64_t(header.num_shards));

  tokens_ = h5::create_contiguous_1d(file_, "tokens",
                                     token_bytes_ == 2 ? H5T_STD_U16LE : H5T_STD_U32LE,
                                     total_tokens_, path);
  h5::Handle offsets_ds =
      h5::create_contiguous_1d(file_, "offsets", H5T_STD_U64LE, offsets.size(), path);
  h5::write_range(offsets_ds, H5T_NATIVE_UINT64, 0, offsets.size(), offsets.data(), path,
                  "/offsets");
  buffer_.resize(kBufferTokens * token_bytes_);
}

ShardWriter::~ShardWriter() = default;

template <typename T>
void ShardWriter::append_as(const T* tokens, size_t count) {
  KILTER_CHECK(doc_ < doc_lengths_.size(),
               path_ << ": more documents written than the " << doc_lengths_.size() << " announced");
  KILTER_CHECK(doc_tokens_ + count <= doc_lengths_[doc_],
               path_ << ": document " << doc_ << " is longer than its announced "
                     << doc_lengths_[doc_] << " tokens (did the input change between passes?)");
  doc_tokens_ += count;
  while (count > 0) {
    size_t take = std::min(count, kBufferTokens - buffered_);
    if (token_bytes_ == 2) {
      auto* out = reinterpret_cast<uint16_t*>(buffer_.data()) + buffered_;
      for (size_t i = 0; i < take; ++i) {
        KILTER_CHECK(tokens[i] < header_.vocab_size,
                     path_ << ": token " << uint64_t(tokens[i]) << " is not below vocab_size");
        out[i] = uint16_t(tokens[i]);
      }
    } else {
      auto* out = reinterpret_cast<uint32_t*>(buffer_.data()) + buffered_;
      for (size_t i = 0; i < take; ++i) {
        KILTER_CHECK(tokens[i] < header_.vocab_size,
                     path_ << ": token " << uint64_t(tokens[i]) << " is not below vocab_size");
        out[i] = uint32_t(tokens[i]);
      }
    }
    buffered_ += take;
    tokens += take;
    count -= take;
    if (buffered_ == kBufferTokens) flush();
  }
}

void ShardWriter::append(const uint32_t* tokens, size_t count) { append_as(tokens, count); }

void ShardWriter::append_bytes(const unsigned char* bytes, size_t count) {
  append_as(bytes, count);
}

void ShardWriter::end_document() {
  KILTER_CHECK(doc_ < doc_lengths_.size() && doc_tokens_ == doc_lengths_[doc_],
               path_ << ": document " << doc_ << " has " << doc_tokens_ << " tokens, "
                     << (doc_ < doc_lengths_.size() ? doc_lengths_[doc_] : 0)
                     << " were announced (did the input change between passes?)");
  ++doc_;
  doc_tokens_ = 0;
}

void ShardWriter::flush() {
  if (buffered_ == 0) return;
  hash_.update(buffer_.data(), buffered_ * token_bytes_);
  h5::write_range(tokens_, token_bytes_ == 2 ? H5T_NATIVE_UINT16 : H5T_NATIVE_UINT32, written_,
                  buffered_, buffer_.data(), path_, "/tokens");
  written_ += buffered_;
  buffered_ = 0;
}

std::string ShardWriter::finish() {
  KILTER_CHECK(!finished_, path_ << ": finish() called twice");
  flush();
  KILTER_CHECK(doc_ == doc_lengths_.size() && written_ == total_tokens_,
               path_ << ": " << doc_ << " of " << doc_lengths_.size() << " documents and "
                     << written_ << " of " << total_tokens_ << " tokens were written");
  uint64_t offset = 0;
  hash_.update(&offset, sizeof offset);
  for (uint32_t length : doc_lengths_) {
    offset += length;
    hash_.update(&offset, sizeof offset);
  }
  tokens_.reset();
  KILTER_CHECK(H5Fflush(file_, H5F_SCOPE_GLOBAL) >= 0, path_ << ": flush failed (disk full?)");
  file_.reset();
  finished_ = true;
  return hash_.hex();
}

}  // namespace kilter::io
