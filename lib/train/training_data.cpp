// One dataset or a mixture of several (see training_data.h).
#include "lib/train/training_data.h"

#include <algorithm>

#include "io/base/error.h"

namespace kilter::train {

std::vector<uint64_t> TrainingData::docs_of(size_t k, const std::vector<uint64_t>& docs) const {
  std::vector<uint64_t> out;
  const auto first = std::lower_bound(docs.begin(), docs.end(), doc_begin[k]);
  const auto last = std::lower_bound(docs.begin(), docs.end(), doc_begin[k + 1]);
  out.assign(first, last);
  return out;
}

TrainingData load_training_data(const Config& cfg) {
  TrainingData data;
  if (cfg.data.sources.empty()) {
    KILTER_CHECK(!cfg.data.dir.empty(), "config key data.dir is empty: name a dataset directory "
                                        "(kilter prep ... --out DIR), or a mixture with data.sources = DIR:W, DIR:W, ...");
    data.index = io::load_index(cfg.data.dir);
    data.doc_begin = {0, data.index.num_docs()};
    return data;
  }
  KILTER_CHECK(cfg.data.stage_dir.empty(), "config key data.stage_dir is set with data.sources: staging a mixture "
                                           "is not supported yet; leave data.stage_dir empty to read the sources in place");
  std::vector<io::DatasetIndex> indexes;
  for (const auto& [dir, weight] : parse_data_sources(cfg.data.sources)) {
    indexes.push_back(io::load_index(dir));
    data.sources.push_back(dir);
    data.weights.push_back(weight);
  }
  io::MixtureIndex mix = io::merge_indexes(indexes, "config key data.sources");
  data.index = std::move(mix.merged);
  data.doc_begin = std::move(mix.doc_begin);
  return data;
}

std::unique_ptr<PlanCache> make_plan_cache(const TrainingData& data, const std::vector<uint64_t>& docs,
                                           const balance::PlanOptions& opts, int world_size) {
  if (!data.mixture()) return std::make_unique<PlanCache>(data.index, docs, opts, world_size);
  KILTER_CHECK(opts.sampler == "balanced", "config key data.sampler = " << opts.sampler
                                           << ": a mixture (data.sources) is drawn by the balanced plan only");
  std::vector<balance::MixtureSource> sources;
  for (size_t k = 0; k < data.sources.size(); ++k)
    sources.push_back({data.sources[k], data.weights[k], data.docs_of(k, docs)});
  auto planner = std::make_shared<balance::MixturePlanner>(data.index.doc_lengths, std::move(sources), opts);
  return std::make_unique<PlanCache>(data.index, std::move(planner), world_size);
}

std::vector<std::string> wrap_messages(const TrainingData& data, const std::vector<balance::SourceWrap>& wraps) {
  std::vector<std::string> lines;
  for (const balance::SourceWrap& w : wraps)
    lines.push_back("source " + data.sources.at(w.source) + " runs out in step " + std::to_string(w.step + 1) +
                    " and wraps into its epoch " + std::to_string(w.source_epoch + 1));
  return lines;
}

}  // namespace kilter::train
