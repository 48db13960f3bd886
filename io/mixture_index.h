// The datasets of a weighted mixture (`data.sources`) as one index: their documents
// get global ids source after source (source k holds [doc_begin[k], doc_begin[k+1])), their
// shards are listed with their own paths, so the plan, the reader and everything that takes one
// DatasetIndex work on a mixture unchanged. The sources must share one vocabulary.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/dataset.h"

namespace kilter::io {

struct MixtureIndex {
  DatasetIndex merged;
  std::vector<uint64_t> doc_begin;  // per source, plus the end: source k's global document ids
  std::vector<std::string> dirs;    // per source
};

// Merges the loaded indexes of `sources` (in order). Throws kilter::Error naming both datasets
// when two differ in vocab_size, eos_id, tokenizer kind or tokenizer file (a mixture trains one
// vocabulary), and `key` (the config key) for errors of the list itself.
MixtureIndex merge_indexes(const std::vector<DatasetIndex>& sources, const std::string& key);

}  // namespace kilter::io
