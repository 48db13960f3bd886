// Fuzz harness (issue 17), structure-aware: the fuzz input drives the building of a dataset
// directory (index.h5 + shard-NNNNN.h5, docs/design.md "Dataset format"): its shape (shards,
// documents, lengths, tokens, vocabulary, tokenizer) and, for every attribute and dataset kilter
// reads, the valid form or an adversarial one (tests/fuzz/fuzz_hdf5.h). Then kilter's paths run
// as a rank and `kilter prep validate` would: validate_dataset(), load_index(), and the
// prefetching reader over every document. Refusals must be kilter::Error (or a problem list);
// and a dataset that validate_dataset() calls sound must load, and read back the tokens built.
#include <filesystem>

#include "fuzz_hdf5.h"
#include "io/content_hash.h"
#include "io/dataset.h"
#include "io/reader.h"

namespace {

using namespace kilter::fuzz;

struct Shard {
  std::vector<std::vector<uint32_t>> docs;
};

const std::string& dataset_dir() {
  static const std::string dir = [] {
    std::string d = scratch_dir() + "/dataset";
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

void write_image(const std::string& name, const std::string& image) {
  write_file(dataset_dir() + "/" + name, image.data(), image.size());
}

// Writes shard `s` the way io/shard_writer.cpp does, with mutations; returns its content hash.
uint64_t build_shard(const Shard& shard, uint32_t s, uint32_t num_shards, uint32_t vocab, uint32_t eos,
                     const std::string& tokenizer, Input& in) {
  h5b::MemFile file;
  const hid_t f = file.id();
  h5b::attr_str(f, "format", kilter::io::kShardFormat, in);
  h5b::attr_u64(f, "format_version", kilter::io::kFormatVersion, in);
  h5b::attr_u64(f, "vocab_size", vocab, in);
  h5b::attr_u64(f, "eos_id", eos, in);
  h5b::attr_u64(f, "shard_index", s, in);
  h5b::attr_u64(f, "num_shards", num_shards, in);
  h5b::attr_str(f, "tokenizer", tokenizer, in);
  std::vector<uint64_t> tokens, offsets{0};
  for (const auto& doc : shard.docs) {
    tokens.insert(tokens.end(), doc.begin(), doc.end());
    offsets.push_back(tokens.size());
  }
  h5b::attr_u64(f, "num_docs", shard.docs.size(), in);
  h5b::attr_u64(f, "num_tokens", tokens.size(), in);
  const uint32_t token_bytes = kilter::io::token_bytes_for_vocab(vocab);
  h5b::dataset<uint64_t>(f, "tokens", token_bytes == 2 ? H5T_STD_U16LE : H5T_STD_U32LE,
                         {hsize_t(tokens.size())}, tokens, in);
  h5b::dataset<uint64_t>(f, "offsets", H5T_STD_U64LE, {hsize_t(offsets.size())}, offsets, in);
  kilter::io::Fnv1a64 hash;
  for (uint64_t t : tokens) {
    if (token_bytes == 2) {
      uint16_t v = uint16_t(t);
      hash.update(&v, 2);
    } else {
      uint32_t v = uint32_t(t);
      hash.update(&v, 4);
    }
  }
  hash.update(offsets.data(), offsets.size() * 8);
  int which = 0;
  if (!(h5b::mutate(in, which) && which % 4 == 1))  // else: the shard file is missing
    write_image(kilter::io::shard_file_name(s), h5b::maybe_truncated(file.image(), in));
  return hash.value();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  h5b::fixed_strings() = true;
  const std::string& dir = dataset_dir();
  for (const auto& entry : std::filesystem::directory_iterator(dir)) std::filesystem::remove(entry.path());

  // The dataset's shape.
  static const uint32_t kVocabs[] = {257, 50257, 65535, 65536, 100000, 1, 2};
  const uint32_t vocab = kVocabs[in.u8() % 7];
  const uint32_t eos = vocab - 1;
  static const char* const kTokenizers[] = {"byte", "imported", "synthetic", "sentencepiece", "hf-bpe", ""};
  const uint8_t tokenizer_pick = in.u8();
  const std::string tokenizer = kTokenizers[tokenizer_pick % 6];
  const std::string tokenizer_data = tokenizer_pick & 0x80 ? in.bytes(512) : std::string();
  const uint32_t num_shards = 1 + in.u8() % 2;  // two shards reach every cross-shard check
  std::vector<Shard> shards(num_shards);
  std::vector<uint64_t> doc_lengths;
  for (Shard& shard : shards) {
    const uint32_t docs = in.u8() % 5;
    for (uint32_t d = 0; d < docs; ++d) {
      std::vector<uint32_t> doc(in.u8() % 9);
      for (uint32_t& t : doc) t = in.u16() % vocab;
      doc_lengths.push_back(doc.size());
      shard.docs.push_back(std::move(doc));
    }
  }

  // The shards, then the index that describes them.
  std::vector<uint64_t> shard_docs, shard_tokens, shard_hash;
  for (uint32_t s = 0; s < num_shards; ++s) {
    shard_hash.push_back(build_shard(shards[s], s, num_shards, vocab, eos, tokenizer, in));
    uint64_t tokens = 0;
    for (const auto& doc : shards[s].docs) tokens += doc.size();
    shard_docs.push_back(shards[s].docs.size());
    shard_tokens.push_back(tokens);
  }
  {
    h5b::MemFile file;
    const hid_t f = file.id();
    h5b::attr_str(f, "format", kilter::io::kIndexFormat, in);
    h5b::attr_u64(f, "format_version", kilter::io::kFormatVersion, in);
    h5b::attr_u64(f, "vocab_size", vocab, in);
    h5b::attr_u64(f, "eos_id", eos, in);
    h5b::attr_str(f, "tokenizer", tokenizer, in);
    h5b::attr_u64(f, "num_shards", num_shards, in);
    h5b::attr_u64(f, "num_docs", doc_lengths.size(), in);
    uint64_t total = 0;
    for (uint64_t t : shard_tokens) total += t;
    h5b::attr_u64(f, "num_tokens", total, in);
    h5b::attr_str(f, "hash_algorithm", kilter::io::kHashAlgorithm, in);
    h5b::dataset<uint64_t>(f, "shard_num_docs", H5T_STD_U64LE, {num_shards}, shard_docs, in);
    h5b::dataset<uint64_t>(f, "shard_num_tokens", H5T_STD_U64LE, {num_shards}, shard_tokens, in);
    h5b::dataset<uint64_t>(f, "shard_hash", H5T_STD_U64LE, {num_shards}, shard_hash, in);
    h5b::dataset<uint64_t>(f, "doc_lengths", H5T_STD_U32LE, {hsize_t(doc_lengths.size())}, doc_lengths, in);
    if (!tokenizer_data.empty()) {
      std::vector<uint64_t> bytes(tokenizer_data.begin(), tokenizer_data.end());
      for (uint64_t& b : bytes) b &= 0xff;
      h5b::dataset<uint64_t>(f, "tokenizer_data", H5T_STD_U8LE, {hsize_t(bytes.size())}, bytes, in);
    }
    write_image(kilter::io::kIndexFileName, h5b::maybe_truncated(file.image(), in));
  }

  // kilter reads it.
  const std::vector<std::string> problems = kilter::io::validate_dataset(dir);
  if (h5b::debug())
    for (const std::string& p : problems) std::fprintf(stderr, "validate: %s\n", p.c_str());
  kilter::io::DatasetIndex index;
  try {
    index = kilter::io::load_index(dir);
  } catch (const kilter::Error& e) {
    if (h5b::debug()) std::fprintf(stderr, "load_index: %s\n", e.what());
    KILTER_FUZZ_EXPECT(!problems.empty(), std::string("validate_dataset found no problem but load_index refused: ") + e.what());
    return 0;
  }
  std::vector<kilter::io::PieceRequest> pieces;
  uint64_t expected_tokens = 0;
  for (uint64_t d = 0; d < index.num_docs() && pieces.size() < 64; ++d) {
    const uint32_t len = index.doc_lengths[d];
    if (len == 0 || len > 64) continue;
    pieces.push_back({d, 0, len});
    expected_tokens += len + 1;
  }
  if (pieces.empty()) return 0;
  try {
    kilter::io::ReaderOptions opts;
    opts.prefetch = 1;
    opts.threads = 1;
    kilter::io::PrefetchReader reader(index, dir, opts);
    reader.enqueue(pieces);
    const kilter::io::ReadyGroup& group = reader.next();
    KILTER_FUZZ_EXPECT(group.pieces.size() == pieces.size(), "the reader returned another number of pieces");
    if (problems.empty()) {
      // A sound dataset reads back exactly what was built (EOS after each document).
      std::vector<uint32_t> all;
      for (const Shard& shard : shards)
        for (const auto& doc : shard.docs) {
          if (doc.empty()) continue;
          all.insert(all.end(), doc.begin(), doc.end());
          all.push_back(index.eos_id);
        }
      size_t k = 0;
      for (size_t p = 0; p < group.pieces.size(); ++p)
        for (uint32_t i = 0; i <= group.pieces[p].len; ++i, ++k)
          KILTER_FUZZ_EXPECT(k < all.size() && uint32_t(group.tokens[group.offsets[p] + i]) == all[k],
                             "the reader's tokens differ from the sound dataset's");
      (void)expected_tokens;
    }
  } catch (const kilter::Error& e) {
    KILTER_FUZZ_EXPECT(!problems.empty(), std::string("validate_dataset found no problem but the reader refused: ") + e.what());
  }
  return 0;
}
