// The replay driver of the fuzz harnesses (tests/fuzz/fuzz.cmake): runs one harness's
// LLVMFuzzerTestOneInput over every file of the given files and directories, so the seed corpora
// and the regression inputs of past findings run in every build, with any compiler. A harness
// aborts on a finding; this driver fails when a directory holds no inputs at all (a typo in a
// path must not make the test pass vacuously) unless it is the regressions directory.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#define KILTER_FUZZ_HARNESS(name) extern "C" int kilter_fuzz_##name(const uint8_t* data, size_t size);
#define KILTER_FUZZ_ALL(X)                                                                         \
  X(text) X(jsonl) X(fortune) X(sentencepiece) X(tokenizer_json) X(bpe_encode) X(config_ini)       \
  X(config_override) X(import_llmc) X(import_nanogpt) X(import_megatron) X(import_npy) X(dataset)  \
  X(checkpoint) X(safetensors)
KILTER_FUZZ_ALL(KILTER_FUZZ_HARNESS)

namespace {

using Entry = int (*)(const uint8_t*, size_t);

struct Harness {
  const char* name;
  Entry entry;
};

#define KILTER_FUZZ_ROW(name) {#name, kilter_fuzz_##name},
const Harness kHarnesses[] = {KILTER_FUZZ_ALL(KILTER_FUZZ_ROW)};

std::vector<std::string> inputs_of(const std::string& path) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  if (fs::is_directory(path)) {
    for (const auto& entry : fs::directory_iterator(path))
      if (entry.is_regular_file() && entry.path().filename().string()[0] != '.')
        files.push_back(entry.path().string());
  } else if (fs::is_regular_file(path)) {
    files.push_back(path);
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: fuzz_replay HARNESS CORPUS_DIR [REGRESSION_DIR|FILE...]\n");
    return 2;
  }
  Entry entry = nullptr;
  for (const Harness& h : kHarnesses)
    if (std::strcmp(h.name, argv[1]) == 0) entry = h.entry;
  if (!entry) {
    std::fprintf(stderr, "fuzz_replay: unknown harness '%s'\n", argv[1]);
    return 2;
  }
  size_t total = 0;
  for (int a = 2; a < argc; ++a) {
    std::vector<std::string> files = inputs_of(argv[a]);
    if (files.empty() && a == 2) {
      std::fprintf(stderr, "fuzz_replay: %s holds no inputs (the seed corpus must not be empty)\n", argv[a]);
      return 1;
    }
    for (const std::string& file : files) {
      std::ifstream in(file, std::ios::binary);
      std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      std::fprintf(stderr, "fuzz_replay %s: %s (%zu bytes)\n", argv[1], file.c_str(), bytes.size());
      entry(bytes.data(), bytes.size());
      ++total;
    }
  }
  std::printf("fuzz_replay %s: %zu inputs ran clean\n", argv[1], total);
  return 0;
}
