// Checks of one shard against the index: the cheap header checks load_index() runs on every
// rank, the full content checks of `kilter prep validate`, and the content hash used by staging.
#include <sys/stat.h>

#include <filesystem>
#include <functional>

#include "io/content_hash.h"
#include "io/dataset.h"
#include "io/base/error.h"
#include "io/hdf5_util.h"

namespace kilter::io {

constexpr uint64_t kChunkElements = uint64_t(1) << 20;

static std::string shard_path(const DatasetIndex& index, const std::string& dir, uint32_t shard) {
  const ShardInfo& info = index.shards.at(shard);
  if (!info.path.empty()) return info.path;  // a mixture's merged index
  return (std::filesystem::path(dir) / shard_file_name(shard)).string();
}

std::vector<std::string> check_shard_header(const DatasetIndex& index, const std::string& dir,
                                            uint32_t shard, ShardLayout* layout) {
  const std::string path = shard_path(index, dir, shard);
  const ShardInfo& info = index.shards.at(shard);
  std::vector<std::string> problems;
  auto problem = [&](const std::string& what) { problems.push_back(path + ": " + what); };
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    problem("shard file is missing (the index lists " + std::to_string(index.shards.size()) +
            " shards)");
    return problems;
  }
  try {
    h5::Handle file = h5::open_file(path);
    std::string format = h5::read_string_attribute(file, "format", path);
    if (format != kShardFormat) problem("attribute format is '" + format + "', expected '" + kShardFormat + "'");
    uint64_t version = h5::read_uint_attribute(file, "format_version", path);
    if (version != uint64_t(kFormatVersion))
      problem("format_version is " + std::to_string(version) + ", this kilter reads version " +
              std::to_string(kFormatVersion));
    auto expect = [&](const char* name, uint64_t want) {
      uint64_t got = h5::read_uint_attribute(file, name, path);
      if (got != want)
        problem(std::string(name) + " is " + std::to_string(got) + " but the index says " +
                std::to_string(want));
    };
    expect("vocab_size", index.vocab_size);
    expect("eos_id", index.eos_id);
    expect("shard_index", info.path.empty() ? shard : info.own_index);
    expect("num_shards", info.path.empty() ? index.shards.size() : info.own_count);
    std::string tokenizer = h5::read_string_attribute(file, "tokenizer", path);
    if (tokenizer != index.tokenizer)
      problem("tokenizer is '" + tokenizer + "' but the index says '" + index.tokenizer + "'");

    const uint32_t token_bytes = token_bytes_for_vocab(index.vocab_size);
    h5::Handle tokens = h5::open_dataset(file, "tokens", path);
    if (!h5::is_unsigned_le(tokens, token_bytes))
      problem("/tokens has type " + h5::describe_type(tokens) + ", expected uint" +
              std::to_string(8 * token_bytes) + " for vocab_size " + std::to_string(index.vocab_size));
    uint64_t num_tokens = h5::dataset_length(tokens, path, "/tokens");
    if (num_tokens != info.num_tokens)
      problem("/tokens has " + std::to_string(num_tokens) + " tokens, the index says " +
              std::to_string(info.num_tokens));
    h5::Handle dcpl(H5Dget_create_plist(tokens), H5Pclose);
    if (H5Pget_layout(dcpl) != H5D_CONTIGUOUS)
      problem("/tokens is not stored contiguously (chunked or compact datasets cannot be pread)");
    haddr_t offset = H5Dget_offset(tokens);
    if (num_tokens > 0 && offset == HADDR_UNDEF) problem("/tokens has no file storage allocated");
    uint64_t end = uint64_t(offset) + num_tokens * token_bytes;
    if (offset != HADDR_UNDEF && uint64_t(st.st_size) < end)
      problem("file is truncated: /tokens ends at byte " + std::to_string(end) + " but the file has " +
              std::to_string(st.st_size) + " bytes");

    h5::Handle offsets = h5::open_dataset(file, "offsets", path);
    if (!h5::is_unsigned_le(offsets, 8))
      problem("/offsets has type " + h5::describe_type(offsets) + ", expected uint64");
    uint64_t num_offsets = h5::dataset_length(offsets, path, "/offsets");
    if (num_offsets != info.num_docs + 1)
      problem("/offsets has " + std::to_string(num_offsets) + " entries, expected num_docs+1 = " +
              std::to_string(info.num_docs + 1));
    if (layout) {
      layout->path = path;
      layout->tokens_file_offset = uint64_t(offset);
      layout->token_bytes = token_bytes;
      layout->num_tokens = num_tokens;
      layout->num_docs = info.num_docs;
      layout->file_size = uint64_t(st.st_size);
    }
  } catch (const Error& e) {
    problems.push_back(e.message());
  }
  return problems;
}

// Streams a shard's /tokens then /offsets in bounded chunks (the content hash's byte order).
static void stream_shard(hid_t file, const std::string& path, uint32_t token_bytes,
                         const std::function<void(const void*, uint64_t)>& on_tokens,
                         const std::function<void(const uint64_t*, uint64_t)>& on_offsets) {
  h5::Handle tokens = h5::open_dataset(file, "tokens", path);
  uint64_t num_tokens = h5::dataset_length(tokens, path, "/tokens");
  // Grown to at most one chunk as needed: a small shard does not pay for an 8 MiB buffer.
  std::vector<unsigned char> buffer;
  hid_t token_type = token_bytes == 2 ? H5T_NATIVE_UINT16 : H5T_NATIVE_UINT32;
  for (uint64_t first = 0; first < num_tokens; first += kChunkElements) {
    uint64_t n = std::min(kChunkElements, num_tokens - first);
    if (buffer.size() < n * 8) buffer.resize(n * 8);
    h5::read_range(tokens, token_type, first, n, buffer.data(), path, "/tokens");
    on_tokens(buffer.data(), n);
  }
  h5::Handle offsets = h5::open_dataset(file, "offsets", path);
  uint64_t num_offsets = h5::dataset_length(offsets, path, "/offsets");
  for (uint64_t first = 0; first < num_offsets; first += kChunkElements) {
    uint64_t n = std::min(kChunkElements, num_offsets - first);
    if (buffer.size() < n * 8) buffer.resize(n * 8);
    h5::read_range(offsets, H5T_NATIVE_UINT64, first, n, buffer.data(), path, "/offsets");
    on_offsets(reinterpret_cast<const uint64_t*>(buffer.data()), n);
  }
}

std::string shard_content_hash(const std::string& path) {
  h5::Handle file = h5::open_file(path);
  h5::Handle tokens = h5::open_dataset(file, "tokens", path);
  h5::Handle type(H5Dget_type(tokens), H5Tclose);
  uint32_t token_bytes = uint32_t(H5Tget_size(type));
  KILTER_CHECK(token_bytes == 2 || token_bytes == 4,
               path << ": /tokens has " << token_bytes << "-byte elements, expected 2 or 4");
  tokens.reset();
  Fnv1a64 hash;
  stream_shard(
      file, path, token_bytes, [&](const void* data, uint64_t n) { hash.update(data, n * token_bytes); },
      [&](const uint64_t* data, uint64_t n) { hash.update(data, n * 8); });
  return hash.hex();
}

std::vector<std::string> check_shard_content(const DatasetIndex& index, const std::string& dir,
                                             uint32_t shard) {
  std::vector<std::string> problems = check_shard_header(index, dir, shard);
  if (!problems.empty()) return problems;  // the content cannot be interpreted safely
  const std::string path = shard_path(index, dir, shard);
  const ShardInfo& info = index.shards[shard];
  auto problem = [&](const std::string& what) { problems.push_back(path + ": " + what); };
  const uint32_t token_bytes = token_bytes_for_vocab(index.vocab_size);
  try {
    h5::Handle file = h5::open_file(path);
    Fnv1a64 hash;
    uint64_t bad_tokens = 0, first_bad_position = 0, first_bad_value = 0, position = 0;
    auto on_tokens = [&](const void* data, uint64_t n) {
      hash.update(data, n * token_bytes);
      for (uint64_t i = 0; i < n; ++i) {
        uint64_t value = token_bytes == 2 ? static_cast<const uint16_t*>(data)[i]
                                          : static_cast<const uint32_t*>(data)[i];
        if (value >= index.vocab_size && bad_tokens++ == 0) {
          first_bad_position = position + i;
          first_bad_value = value;
        }
      }
      position += n;
    };
    uint64_t entry = 0, previous = 0, length_mismatches = 0;
    std::string first_offset_problem;
    auto on_offsets = [&](const uint64_t* data, uint64_t n) {
      hash.update(data, n * 8);
      for (uint64_t i = 0; i < n; ++i, ++entry) {
        uint64_t value = data[i];
        std::string what;
        if (entry == 0 && value != 0) {
          what = "offsets[0] is " + std::to_string(value) + ", expected 0";
        } else if (value > info.num_tokens) {
          what = "offsets[" + std::to_string(entry) + "] = " + std::to_string(value) +
                 " is out of range (/tokens has " + std::to_string(info.num_tokens) + ")";
        } else if (entry > 0 && value < previous) {
          what = "offsets decrease at entry " + std::to_string(entry) + " (" +
                 std::to_string(previous) + " then " + std::to_string(value) + ")";
        } else if (entry > 0 && value - previous != index.doc_lengths[info.first_doc + entry - 1]) {
          ++length_mismatches;
        }
        if (!what.empty() && first_offset_problem.empty()) first_offset_problem = what;
        previous = value;
      }
    };
    stream_shard(file, path, token_bytes, on_tokens, on_offsets);
    if (!first_offset_problem.empty()) problem(first_offset_problem);
    if (first_offset_problem.empty() && previous != info.num_tokens)
      problem("last offset is " + std::to_string(previous) + ", expected len(/tokens) = " +
              std::to_string(info.num_tokens));
    if (length_mismatches > 0)
      problem(std::to_string(length_mismatches) +
              " document lengths in /offsets differ from the index's doc_lengths");
    if (bad_tokens > 0)
      problem(std::to_string(bad_tokens) + " tokens are not below vocab_size " +
              std::to_string(index.vocab_size) + " (first: tokens[" +
              std::to_string(first_bad_position) + "] = " + std::to_string(first_bad_value) + ")");
    if (hash.hex() != info.hash)
      problem("content hash " + hash.hex() + " does not match the index (" + info.hash +
              "): the shard was modified or corrupted");
  } catch (const Error& e) {
    problems.push_back(e.message());
  }
  return problems;
}

}  // namespace kilter::io
