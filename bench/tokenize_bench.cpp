// The program bench/tokenize.sh runs: kilter's tokenizer alone, on every {"text": ...} line of a
// JSONL file held in memory, over THREADS threads (documents handed out in batches, as prep does).
// Prints one JSON object: documents, bytes, tokens, the sum of all ids (the script checks count
// and sum against HF `tokenizers`), and the best wall time of REPEATS runs.
// Usage: tokenize_bench TOKENIZER_FILE CORPUS.jsonl THREADS [REPEATS=3]
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "io/tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::cerr << "usage: tokenize_bench TOKENIZER_FILE CORPUS.jsonl THREADS [REPEATS]\n";
    return 2;
  }
  try {
    auto tokenizer = kilter::io::load_tokenizer_file(argv[1]);
    const unsigned threads = std::max(1, std::atoi(argv[3]));
    const int repeats = argc > 4 ? std::max(1, std::atoi(argv[4])) : 3;
    std::vector<std::string> docs;
    uint64_t bytes = 0;
    std::ifstream corpus(argv[2]);
    for (std::string line; std::getline(corpus, line);) {
      docs.push_back(nlohmann::json::parse(line).at("text").get<std::string>());
      bytes += docs.back().size();
    }
    double best = 1e30;
    uint64_t tokens = 0, id_sum = 0;
    for (int r = 0; r < repeats; ++r) {
      std::atomic<size_t> next{0};
      std::atomic<uint64_t> run_tokens{0}, run_sum{0};
      auto start = std::chrono::steady_clock::now();
      std::vector<std::thread> pool;
      for (unsigned t = 0; t < threads; ++t)
        pool.emplace_back([&] {
          std::vector<uint32_t> ids;
          uint64_t count = 0, sum = 0;
          constexpr size_t kBatch = 64;
          for (size_t first; (first = next.fetch_add(kBatch)) < docs.size();) {
            for (size_t d = first; d < std::min(first + kBatch, docs.size()); ++d) {
              ids.clear();
              tokenizer->encode(docs[d], ids);
              count += ids.size();
              for (uint32_t id : ids) sum += id;
            }
          }
          run_tokens += count;
          run_sum += sum;
        });
      for (std::thread& thread : pool) thread.join();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      tokens = run_tokens;
      id_sum = run_sum;
    }
    std::printf("{\"documents\": %zu, \"bytes\": %llu, \"tokens\": %llu, \"id_sum\": %llu, "
                "\"threads\": %u, \"seconds\": %.6f}\n",
                docs.size(), (unsigned long long)bytes, (unsigned long long)tokens,
                (unsigned long long)id_sum, threads, best);
  } catch (const std::exception& e) {
    std::cerr << "tokenize_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
