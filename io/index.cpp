// index.h5: reading, writing and consistency checks of the dataset index, and load_index(),
// the cheap check every rank runs before planning (docs/design.md "Dataset format").
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <numeric>

#include "io/content_hash.h"
#include "io/dataset.h"
#include "io/base/error.h"
#include "io/hdf5_util.h"
#include "io/tokenizer/tokenizer.h"

namespace kilter::io {

void DatasetReport::describe(const DatasetIndex& index, const std::string& dir) {
  out = dir;
  tokenizer = index.tokenizer;
  vocab_size = index.vocab_size;
  eos_id = index.eos_id;
  documents = index.num_docs();
  tokens = index.total_tokens();
  shards = uint32_t(index.shards.size());
}

std::string shard_file_name(uint32_t shard) {
  char name[32];
  std::snprintf(name, sizeof name, "shard-%05u.h5", shard);
  return name;
}

uint32_t token_bytes_for_vocab(uint32_t vocab_size) { return vocab_size > 65535 ? 4 : 2; }

uint64_t DatasetIndex::total_tokens() const {
  uint64_t total = 0;
  for (const ShardInfo& shard : shards) total += shard.num_tokens;
  return total;
}

uint32_t DatasetIndex::shard_of(uint64_t doc) const {
  KILTER_CHECK(doc < num_docs(), dir << ": document " << doc << " is out of range (the dataset has "
                                     << num_docs() << ")");
  auto after = std::upper_bound(shards.begin(), shards.end(), doc,
                                [](uint64_t d, const ShardInfo& s) { return d < s.first_doc; });
  return uint32_t(after - shards.begin() - 1);
}

static std::string index_path(const std::string& dir) {
  return (std::filesystem::path(dir) / kIndexFileName).string();
}

template <typename T>
static std::vector<T> read_array(hid_t file, const std::string& name, size_t bytes,
                                 hid_t mem_type, const std::string& path, uint64_t expected) {
  h5::Handle ds = h5::open_dataset(file, name, path);
  KILTER_CHECK(h5::is_unsigned_le(ds, bytes), path << ": dataset " << name << " has type "
                                                   << h5::describe_type(ds) << ", expected uint"
                                                   << 8 * bytes);
  uint64_t length = h5::dataset_length(ds, path, name);
  KILTER_CHECK(length == expected, path << ": dataset " << name << " has " << length
                                        << " entries, the attributes say " << expected);
  std::vector<T> values(length);
  h5::read_range(ds, mem_type, 0, length, values.data(), path, name);
  return values;
}

DatasetIndex read_index_file(const std::string& dir) {
  const std::string path = index_path(dir);
  KILTER_CHECK(std::filesystem::exists(path), path << ": index file is missing (is " << dir
                                                   << " a dataset made by `kilter prep`?)");
  h5::Handle file = h5::open_file(path);
  std::string format = h5::read_string_attribute(file, "format", path);
  KILTER_CHECK(format == kIndexFormat,
               path << ": attribute format is '" << format << "', expected '" << kIndexFormat << "'");
  uint64_t version = h5::read_uint_attribute(file, "format_version", path);
  KILTER_CHECK(version == uint64_t(kFormatVersion),
               path << ": format_version is " << version << ", this kilter reads version "
                    << kFormatVersion);
  DatasetIndex index;
  index.dir = dir;
  uint64_t vocab = h5::read_uint_attribute(file, "vocab_size", path);
  uint64_t eos = h5::read_uint_attribute(file, "eos_id", path);
  KILTER_CHECK(vocab <= UINT32_MAX && eos <= UINT32_MAX,
               path << ": vocab_size " << vocab << " or eos_id " << eos << " does not fit 32 bits");
  index.vocab_size = uint32_t(vocab);
  index.eos_id = uint32_t(eos);
  index.tokenizer = h5::read_string_attribute(file, "tokenizer", path);
  if (h5::has_link(file, "tokenizer_data")) {
    h5::Handle ds = h5::open_dataset(file, "tokenizer_data", path);
    KILTER_CHECK(h5::is_unsigned_le(ds, 1), path << ": dataset tokenizer_data has type "
                                                 << h5::describe_type(ds) << ", expected uint8");
    uint64_t length = h5::dataset_length(ds, path, "tokenizer_data");
    index.tokenizer_data.resize(length);
    h5::read_range(ds, H5T_NATIVE_UINT8, 0, length, index.tokenizer_data.data(), path,
                   "tokenizer_data");
  }
  uint64_t num_shards = h5::read_uint_attribute(file, "num_shards", path);
  uint64_t num_docs = h5::read_uint_attribute(file, "num_docs", path);
  if (h5::has_attribute(file, "hash_algorithm")) {
    std::string algorithm = h5::read_string_attribute(file, "hash_algorithm", path);
    KILTER_CHECK(algorithm == kHashAlgorithm, path << ": hash_algorithm is '" << algorithm
                                                   << "', expected '" << kHashAlgorithm << "'");
  }

  auto shard_docs = read_array<uint64_t>(file, "shard_num_docs", 8, H5T_NATIVE_UINT64, path, num_shards);
  auto shard_tokens = read_array<uint64_t>(file, "shard_num_tokens", 8, H5T_NATIVE_UINT64, path, num_shards);
  auto shard_hash = read_array<uint64_t>(file, "shard_hash", 8, H5T_NATIVE_UINT64, path, num_shards);
  index.doc_lengths = read_array<uint32_t>(file, "doc_lengths", 4, H5T_NATIVE_UINT32, path, num_docs);

  uint64_t first_doc = 0;
  for (uint64_t s = 0; s < num_shards; ++s) {
    ShardInfo info;
    info.file = shard_file_name(uint32_t(s));
    info.num_docs = shard_docs[s];
    info.num_tokens = shard_tokens[s];
    info.first_doc = first_doc;
    info.hash = Fnv1a64::to_hex(shard_hash[s]);
    first_doc += shard_docs[s];
    index.shards.push_back(info);
  }
  return index;
}

std::vector<std::string> index_problems(const DatasetIndex& index) {
  const std::string path = index_path(index.dir);
  std::vector<std::string> problems;
  auto problem = [&](const std::string& what) { problems.push_back(path + ": " + what); };
  if (index.vocab_size == 0) problem("vocab_size is 0");
  if (index.eos_id >= index.vocab_size)
    problem("eos_id " + std::to_string(index.eos_id) + " is not below vocab_size " +
            std::to_string(index.vocab_size));
  if (index.tokenizer.empty()) problem("tokenizer attribute is empty");
  if (index.shards.empty()) problem("the dataset has no shards");
  // Summed without wrapping around: huge counts that wrap to the right total must not pass.
  uint64_t docs_in_shards = 0;
  bool too_many = false;
  for (const ShardInfo& shard : index.shards) {
    too_many = too_many || shard.num_docs > index.num_docs() - docs_in_shards;
    if (!too_many) docs_in_shards += shard.num_docs;
  }
  if (too_many || docs_in_shards != index.num_docs()) {
    problem("shard_num_docs add up to " + std::string(too_many ? "more than " : "") +
            std::to_string(too_many ? index.num_docs() : docs_in_shards) + ", doc_lengths has " +
            std::to_string(index.num_docs()) + " entries");
    return problems;  // the per-shard sums below would index out of range
  }
  for (size_t s = 0; s < index.shards.size(); ++s) {
    const ShardInfo& shard = index.shards[s];
    uint64_t tokens = std::accumulate(index.doc_lengths.begin() + shard.first_doc,
                                      index.doc_lengths.begin() + shard.first_doc + shard.num_docs,
                                      uint64_t(0));
    if (tokens != shard.num_tokens)
      problem("shard " + std::to_string(s) + ": shard_num_tokens is " +
              std::to_string(shard.num_tokens) + " but its documents' lengths add up to " +
              std::to_string(tokens));
  }
  return problems;
}

void write_index(const std::string& path, const DatasetIndex& index) {
  h5::Handle file = h5::create_file(path);
  h5::write_attribute(file, "format", std::string(kIndexFormat));
  h5::write_attribute(file, "format_version", uint64_t(kFormatVersion));
  h5::write_attribute(file, "vocab_size", uint64_t(index.vocab_size));
  h5::write_attribute(file, "eos_id", uint64_t(index.eos_id));
  h5::write_attribute(file, "tokenizer", index.tokenizer);
  h5::write_attribute(file, "num_shards", uint64_t(index.shards.size()));
  h5::write_attribute(file, "num_docs", uint64_t(index.num_docs()));
  h5::write_attribute(file, "num_tokens", index.total_tokens());
  h5::write_attribute(file, "hash_algorithm", std::string(kHashAlgorithm));

  std::vector<uint64_t> docs, tokens, hashes;
  for (const ShardInfo& shard : index.shards) {
    docs.push_back(shard.num_docs);
    tokens.push_back(shard.num_tokens);
    hashes.push_back(std::stoull(shard.hash, nullptr, 16));
  }
  auto write = [&](const char* name, hid_t file_type, hid_t mem_type, size_t n, const void* data) {
    h5::Handle ds = h5::create_contiguous_1d(file, name, file_type, n, path);
    h5::write_range(ds, mem_type, 0, n, data, path, name);
  };
  write("shard_num_docs", H5T_STD_U64LE, H5T_NATIVE_UINT64, docs.size(), docs.data());
  write("shard_num_tokens", H5T_STD_U64LE, H5T_NATIVE_UINT64, tokens.size(), tokens.data());
  write("shard_hash", H5T_STD_U64LE, H5T_NATIVE_UINT64, hashes.size(), hashes.data());
  write("doc_lengths", H5T_STD_U32LE, H5T_NATIVE_UINT32, index.doc_lengths.size(),
        index.doc_lengths.data());
  // The tokenizer file itself, so that training, checkpoints and `kilter sample` decode with
  // exactly what encoded the data (absent for the built-in byte tokenizer).
  if (!index.tokenizer_data.empty())
    write("tokenizer_data", H5T_STD_U8LE, H5T_NATIVE_UINT8, index.tokenizer_data.size(),
          index.tokenizer_data.data());
  KILTER_CHECK(H5Fflush(file, H5F_SCOPE_GLOBAL) >= 0, path << ": flush failed (disk full?)");
}

static std::string summarize(const std::string& dir, const std::vector<std::string>& problems) {
  std::string text = "dataset " + dir + " is not usable: " + problems[0];
  for (size_t i = 1; i < problems.size() && i < 5; ++i) text += "; " + problems[i];
  if (problems.size() > 5) text += "; and " + std::to_string(problems.size() - 5) + " more";
  return text + " (`kilter prep validate " + dir + "` lists every problem)";
}

DatasetIndex load_index(const std::string& dir) {
  DatasetIndex index = read_index_file(dir);
  std::vector<std::string> problems = index_problems(index);
  if (problems.empty()) {
    for (uint32_t s = 0; s < index.shards.size(); ++s) {
      std::vector<std::string> shard_problems = check_shard_header(index, dir, s);
      problems.insert(problems.end(), shard_problems.begin(), shard_problems.end());
    }
  }
  KILTER_CHECK(problems.empty(), summarize(dir, problems));
  return index;
}

// The recorded tokenizer rebuilds and agrees with the index's vocab_size and eos_id.
static std::vector<std::string> tokenizer_problems(const DatasetIndex& index) {
  const std::string path = index_path(index.dir);
  const bool needs_file = index.tokenizer == "sentencepiece" || index.tokenizer == "hf-bpe";
  if (index.tokenizer_data.empty()) {
    if (needs_file) return {path + ": tokenizer is '" + index.tokenizer + "' but tokenizer_data is missing"};
    return {};
  }
  if (!needs_file && index.tokenizer != "imported")
    return {path + ": tokenizer is '" + index.tokenizer + "' but tokenizer_data holds a file"};
  try {
    std::unique_ptr<Tokenizer> tokenizer =
        load_tokenizer(index.tokenizer, index.tokenizer_data, path + " tokenizer_data");
    std::vector<std::string> problems;
    if (index.tokenizer != "imported" && tokenizer->vocab_size() != index.vocab_size)
      problems.push_back(path + ": vocab_size is " + std::to_string(index.vocab_size) +
                         " but the recorded tokenizer has " + std::to_string(tokenizer->vocab_size()));
    if (index.tokenizer != "imported" && tokenizer->eos_id() != index.eos_id)
      problems.push_back(path + ": eos_id is " + std::to_string(index.eos_id) +
                         " but the recorded tokenizer's is " + std::to_string(tokenizer->eos_id()));
    return problems;
  } catch (const Error& e) {
    return {e.message()};
  }
}

std::vector<std::string> validate_dataset(const std::string& dir) {
  DatasetIndex index;
  try {
    index = read_index_file(dir);
  } catch (const Error& e) {
    return {e.message()};
  }
  std::vector<std::string> problems = index_problems(index);
  if (!problems.empty()) return problems;
  problems = tokenizer_problems(index);
  for (uint32_t s = 0; s < index.shards.size(); ++s) {
    std::vector<std::string> shard_problems = check_shard_content(index, dir, s);
    problems.insert(problems.end(), shard_problems.begin(), shard_problems.end());
  }
  return problems;
}

}  // namespace kilter::io
