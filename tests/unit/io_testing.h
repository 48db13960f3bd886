// Helpers shared by the io unit tests: scratch directories, small synthetic datasets, and
// surgical edits of shard files (attributes, offsets, dtype) to build bad inputs.
#pragma once
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "io/dataset.h"
#include "io/base/error.h"
#include "io/hdf5_util.h"
#include "io/prep.h"

namespace kilter::io::testing {

namespace fs = std::filesystem;

// A small hand-made byte-level BPE tokenizer.json. Vocabulary: the 256 byte symbols (GPT-2's
// map: 'Ġ' is the space byte) at ids 0..255 in byte order, then merges "h e" -> 256, "l l" -> 257, "he ll" -> 258, "Ġ w" -> 259, "o r" -> 260.
inline nlohmann::json tiny_bpe_tokenizer() {
  using json = nlohmann::json;
  std::vector<uint32_t> cp(256);
  std::vector<bool> direct(256, false);
  for (int b = '!'; b <= '~'; ++b) direct[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) cp[b] = direct[b] ? b : next++;
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    uint32_t c = cp[b];
    if (c < 0x80) {
      s.push_back(char(c));
    } else {
      s.push_back(char(0xC0 | (c >> 6)));
      s.push_back(char(0x80 | (c & 0x3F)));
    }
    vocab[s] = b;
  }
  vocab["he"] = 256;
  vocab["ll"] = 257;
  vocab["hell"] = 258;
  vocab["\xC4\xA0w"] = 259;  // "Ġw"
  vocab["or"] = 260;
  json root;
  root["version"] = "1.0";
  root["added_tokens"] = json::array({{{"id", 261}, {"content", "<|endoftext|>"}, {"special", true},
                                       {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                                       {"normalized", false}}});
  root["normalizer"] = nullptr;
  root["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  root["post_processor"] = nullptr;
  root["decoder"] = {{"type", "ByteLevel"}};
  root["model"] = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
                   {"vocab", vocab},
                   {"merges", json::array({"h e", "l l", json::array({"he", "ll"}), "\xC4\xA0 w", "o r"})}};
  return root;
}


// A fresh directory under /tmp, removed when the test ends.
class ScratchDir {
 public:
  ScratchDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("kilter-io-" + std::string(info->test_suite_name()) + "-" + info->name() + "-" +
             std::to_string(::getpid()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string path(const std::string& name = "") const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

inline std::string make_synth(const std::string& out, uint64_t docs, uint32_t shards,
                              uint32_t vocab = 1000, const std::string& lengths = "uniform:1,300",
                              uint64_t seed = 11) {
  SynthOptions options;
  options.docs = docs;
  options.lengths = lengths;
  options.vocab = vocab;
  options.shards = shards;
  options.seed = seed;
  options.out = out;
  options.progress = false;
  synthesize_dataset(options);
  return out;
}

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Runs `f`, expecting a kilter::Error whose message contains every one of `needles`.
template <typename F>
void expect_error(F&& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "expected an error mentioning '" << needles.front() << "'";
  } catch (const Error& e) {
    for (const std::string& needle : needles)
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
          << "message lacks '" << needle << "': " << e.what();
  }
}

// The message of the kilter::Error that `f` throws; "" when it throws none.
inline std::string error_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

// As error_message, and the error must be a user's: a file or a key the user gave and can fix.
inline std::string user_error_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_TRUE(e.is_user_error()) << e.what();
    return e.message();
  }
  return "";
}

inline bool any_contains(const std::vector<std::string>& lines, const std::string& needle) {
  for (const std::string& line : lines)
    if (line.find(needle) != std::string::npos) return true;
  return false;
}

inline std::string join(const std::vector<std::string>& lines) {
  std::string text;
  for (const std::string& line : lines) text += line + "\n";
  return text;
}

// Edits of an existing shard or index file.
inline void set_uint_attribute(const std::string& file, const std::string& name, uint64_t value) {
  h5::Handle f = h5::open_file(file, true);
  h5::write_attribute(f, name, value);
}

inline void set_offset(const std::string& file, uint64_t entry, uint64_t value) {
  h5::Handle f = h5::open_file(file, true);
  h5::Handle ds = h5::open_dataset(f, "offsets", file);
  h5::write_range(ds, H5T_NATIVE_UINT64, entry, 1, &value, file, "offsets");
}

inline uint64_t get_offset(const std::string& file, uint64_t entry) {
  h5::Handle f = h5::open_file(file);
  h5::Handle ds = h5::open_dataset(f, "offsets", file);
  uint64_t value = 0;
  h5::read_range(ds, H5T_NATIVE_UINT64, entry, 1, &value, file, "offsets");
  return value;
}

// Every token of a shard, read through HDF5 (the reference the reader is compared with).
inline std::vector<uint32_t> shard_tokens(const std::string& file) {
  h5::Handle f = h5::open_file(file);
  h5::Handle ds = h5::open_dataset(f, "tokens", file);
  std::vector<uint32_t> tokens(h5::dataset_length(ds, file, "tokens"));
  h5::read_range(ds, H5T_NATIVE_UINT32, 0, tokens.size(), tokens.data(), file, "tokens");
  return tokens;
}

inline void set_token(const std::string& file, uint64_t position, uint32_t value) {
  h5::Handle f = h5::open_file(file, true);
  h5::Handle ds = h5::open_dataset(f, "tokens", file);
  h5::write_range(ds, H5T_NATIVE_UINT32, position, 1, &value, file, "tokens");
}

// Replaces /tokens by a dataset of the same length and another element type.
inline void retype_tokens(const std::string& file, hid_t file_type) {
  std::vector<uint32_t> tokens = shard_tokens(file);
  h5::Handle f = h5::open_file(file, true);
  H5Ldelete(f, "tokens", H5P_DEFAULT);
  h5::Handle ds = h5::create_contiguous_1d(f, "tokens", file_type, tokens.size(), file);
  h5::write_range(ds, H5T_NATIVE_UINT32, 0, tokens.size(), tokens.data(), file, "tokens");
}

}  // namespace kilter::io::testing
