// `kilter prep tokenizer train`: trains a SentencePiece model (BPE or unigram) on a corpus read
// like prep reads it (text, jsonl, fortune), through the library's own trainer.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/corpus.h"

namespace kilter::io {

struct TokenizerTrainOptions {
  std::vector<std::string> inputs;
  InputFormat format = InputFormat::text;
  uint32_t vocab = 8000;
  std::string kind = "bpe";              // "bpe" | "unigram"
  uint64_t sample = 1000000;             // sentences (lines) drawn uniformly from the corpus
  double character_coverage = 0.9995;    // SentencePiece's default for languages with few characters
  bool byte_fallback = false;            // unknown characters become <0xNN> byte pieces
  uint64_t seed = 1;                     // the sample's draw
  std::string out;                       // the *.model file (written atomically)
  bool progress = true;
};

struct TokenizerTrainReport {
  std::string out;
  uint64_t documents = 0;
  uint64_t sentences = 0;          // non-empty lines in the corpus
  uint64_t sampled_sentences = 0;  // lines the trainer saw
  uint32_t vocab = 0;
  double seconds = 0;
};

TokenizerTrainReport train_sentencepiece(const TokenizerTrainOptions& options);

}  // namespace kilter::io
