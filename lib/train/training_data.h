// What a run trains on: one dataset (`data.dir`) or a weighted mixture of several
// (`data.sources`, lib/balance/mixture.h) behind one merged index, with what the trainer reports
// per source: tokens per source in the summary, eval loss per source.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "io/dataset.h"
#include "io/mixture_index.h"
#include "lib/balance/mixture.h"
#include "lib/core/config.h"
#include "lib/train/plan_cursor.h"

namespace kilter::train {

struct TrainingData {
  io::DatasetIndex index;             // the dataset, or the mixture's merged index
  std::vector<std::string> sources;   // a mixture's directories (empty: one dataset)
  std::vector<double> weights;        // normalized, per source
  std::vector<uint64_t> doc_begin;    // per source, plus the end: global document ids
  bool mixture() const { return !sources.empty(); }
  // Documents of `docs` (global ids) that belong to source k.
  std::vector<uint64_t> docs_of(size_t k, const std::vector<uint64_t>& docs) const;
};

// Loads data.dir, or data.sources merged (io::merge_indexes refuses sources whose vocabularies
// differ, naming both). Throws kilter::Error naming the key: no dataset given, data.stage_dir
// with a mixture (not supported).
TrainingData load_training_data(const Config& cfg);

// The training plans: the balanced/naive plan over `docs`, or the mixture's draw.
std::unique_ptr<PlanCache> make_plan_cache(const TrainingData& data, const std::vector<uint64_t>& docs,
                                           const balance::PlanOptions& opts, int world_size);

// Rank 0's lines about a mixture's sources wrapping: "source DIR runs out in step 137 and wraps
// into its epoch 2" (steps and epochs counted from 1, as the log counts steps).
std::vector<std::string> wrap_messages(const TrainingData& data, const std::vector<balance::SourceWrap>& wraps);

}  // namespace kilter::train
