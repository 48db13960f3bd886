// Test tool for tests/e2e/tokenizer_exact.sh: encodes every {"text": ...} line of stdin with a
// tokenizer file (as kilter prep loads it) and writes {"ids": [...], "text": decode(ids)} per line.
// Usage: tokenizer_tool TOKENIZER_FILE < corpus.jsonl > ids.jsonl
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "io/base/error.h"
#include "io/tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: tokenizer_tool TOKENIZER_FILE < corpus.jsonl\n";
    return 2;
  }
  try {
    std::unique_ptr<kilter::io::Tokenizer> tokenizer = kilter::io::load_tokenizer_file(argv[1]);
    // What index.h5 records must rebuild the same tokenizer.
    std::unique_ptr<kilter::io::Tokenizer> recorded =
        kilter::io::load_tokenizer(tokenizer->kind(), tokenizer->file_bytes(), "recorded");
    std::string line;
    std::vector<uint32_t> ids, again;
    while (std::getline(std::cin, line)) {
      std::string text = nlohmann::json::parse(line).at("text").get<std::string>();
      ids.clear();
      again.clear();
      tokenizer->encode(text, ids);
      recorded->encode(text, again);
      KILTER_CHECK(ids == again, "the recorded tokenizer encodes differently");
      nlohmann::json out;
      out["ids"] = ids;
      out["text"] = tokenizer->decode(ids.data(), ids.size());
      std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    }
    std::cerr << "tokenizer_tool: " << tokenizer->kind() << ", vocab_size " << tokenizer->vocab_size()
              << ", eos_id " << tokenizer->eos_id() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "tokenizer_tool: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
