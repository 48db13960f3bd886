// `kilter prep --format llmc|nanogpt|megatron|npy`: imports corpora that another pipeline already
// tokenized (llm.c `.bin`, nanoGPT's flat uint16 `.bin`, Megatron-LM's indexed `.idx`+`.bin`, a
// 1-D integer `.npy`) into a kilter dataset (docs/design.md, "Dataset format"). Inputs are memory-mapped
// and streamed twice (document lengths, then tokens), so memory holds the document lengths only.
// Documents are split at the EOT id (which is not stored: the reader appends eos_id after every
// document) and, for Megatron, at its document index. Every structural fault of an input is an
// error naming the file and the byte offset. Owner: imports.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/dataset.h"

namespace kilter::io {

enum class ImportFormat { llmc, nanogpt, megatron, npy };

// Whether `name` is one of the import formats ("llmc" | "nanogpt" | "megatron" | "npy").
bool is_import_format(const std::string& name);
ImportFormat parse_import_format(const std::string& name);  // throws naming --format
const char* import_format_name(ImportFormat format);

struct ImportOptions {
  ImportFormat format = ImportFormat::llmc;
  // Files in stream order. llmc/nanogpt/npy: the files' tokens form one stream (a document may
  // continue into the next file, as llm.c's shards do); megatron: a prefix or its .idx/.bin path.
  std::vector<std::string> inputs;
  int64_t eot = -1;          // end-of-text id; -1: the tokenizer's EOS, else the format's convention
  int64_t vocab = 0;         // 0: the tokenizer's, else max id + 1 (with a warning)
  // "" (none: kind "imported", ids only) | "byte" | a tokenizer file to attach: the dataset records
  // its kind and bytes, or kind "imported" with its bytes when --vocab / --eot differ from the
  // tokenizer's vocabulary and EOS.
  std::string tokenizer;
  uint32_t shards = 1;
  std::string out;
  bool force = false;        // replace an existing non-empty output directory
  bool progress = true;      // progress on stderr
};

struct ImportReport : DatasetReport {  // tokens: those stored (EOTs excluded)
  bool vocab_inferred = false;    // vocab_size = max id + 1 (no --vocab, no tokenizer)
  uint64_t eot_tokens = 0;        // EOT ids consumed as document boundaries
  uint64_t max_id = 0;
  std::vector<std::string> warnings;  // also printed on stderr as they arise
};

// Imports `options.inputs` into the dataset directory `options.out` (built in a temporary
// sibling and renamed into place when complete). Throws kilter::Error naming the file and byte
// offset of the first structural fault, or the option at fault.
ImportReport import_dataset(const ImportOptions& options);

}  // namespace kilter::io
