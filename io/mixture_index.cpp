// One index over the datasets of a mixture (see mixture_index.h).
#include "io/mixture_index.h"

#include <filesystem>

#include "io/base/error.h"

namespace kilter::io {

MixtureIndex merge_indexes(const std::vector<DatasetIndex>& sources, const std::string& key) {
  KILTER_CHECK(!sources.empty(), key << ": no dataset given");
  MixtureIndex mix;
  const DatasetIndex& first = sources.front();
  DatasetIndex& merged = mix.merged;
  merged.vocab_size = first.vocab_size;
  merged.eos_id = first.eos_id;
  merged.tokenizer = first.tokenizer;
  merged.tokenizer_data = first.tokenizer_data;
  std::string names;
  for (const DatasetIndex& source : sources) {
    const auto describe = [](const DatasetIndex& d) {
      return d.dir + " (vocab_size " + std::to_string(d.vocab_size) + ", eos_id " + std::to_string(d.eos_id) +
             ", tokenizer " + d.tokenizer + ")";
    };
    const bool same_file = source.tokenizer_data == first.tokenizer_data;
    KILTER_CHECK(source.vocab_size == first.vocab_size && source.eos_id == first.eos_id &&
                     source.tokenizer == first.tokenizer && same_file,
                 key << ": " << describe(first) << " and " << describe(source) << " have different "
                     << (same_file ? "vocabularies" : "tokenizer files")
                     << ": a mixture trains one vocabulary; prepare every source with the same tokenizer");
    mix.doc_begin.push_back(merged.doc_lengths.size());
    mix.dirs.push_back(source.dir);
    names += (names.empty() ? "" : "+") + source.dir;
    const uint64_t base = merged.doc_lengths.size();
    for (size_t s = 0; s < source.shards.size(); ++s) {
      ShardInfo info = source.shards[s];
      info.path = info.path.empty() ? (std::filesystem::path(source.dir) / shard_file_name(uint32_t(s))).string()
                                    : info.path;
      info.own_index = info.path == source.shards[s].path ? info.own_index : uint32_t(s);
      info.own_count = info.path == source.shards[s].path ? info.own_count : uint32_t(source.shards.size());
      info.first_doc += base;
      merged.shards.push_back(info);
    }
    merged.doc_lengths.insert(merged.doc_lengths.end(), source.doc_lengths.begin(), source.doc_lengths.end());
  }
  mix.doc_begin.push_back(merged.doc_lengths.size());
  merged.dir = names;  // for messages; the shards carry their own paths
  return mix;
}

}  // namespace kilter::io
