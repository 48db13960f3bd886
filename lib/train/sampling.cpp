// Sampling from checkpoints and during training (see sampling.h).
#include "lib/train/sampling.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

#include "io/checkpoint.h"
#include "io/base/error.h"
#include "io/prep.h"
#include "io/reader.h"
#include "lib/train/checkpointer.h"
#include "lib/train/hf_interop.h"
#include "lib/train/sample_feed.h"

namespace kilter::train {

namespace {

// Kinds that record ids without a text form.
bool ids_only_kind(const std::string& kind) { return kind == "imported" || kind == "synthetic"; }

// Newlines and control characters escaped, so a sample stays on one log line.
std::string one_line(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) out += "?";
    else out += char(c);
  }
  return out;
}

}  // namespace

TextCodec TextCodec::from_record(const std::string& kind, const std::string& file_bytes, int64_t eos_id,
                                 const std::string& where) {
  TextCodec codec;
  codec.kind = kind;
  codec.eos_id = eos_id;
  if (!ids_only_kind(kind) || !file_bytes.empty()) {
    codec.tokenizer = io::load_tokenizer(kind, file_bytes, where);
    if (codec.eos_id < 0) codec.eos_id = codec.tokenizer->eos_id();
  }
  return codec;
}

std::string TextCodec::decode(const std::vector<int32_t>& ids) const {
  if (tokenizer) {
    std::vector<uint32_t> unsigned_ids(ids.begin(), ids.end());
    return tokenizer->decode(unsigned_ids.data(), unsigned_ids.size());
  }
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < ids.size(); ++i) os << (i ? " " : "") << ids[i];
  os << "]";
  return os.str();
}

std::string TextCodec::continuation(const std::vector<int32_t>& prompt, const std::vector<int32_t>& completion) const {
  if (!tokenizer) return decode(completion);
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), completion.begin(), completion.end());
  const std::string whole = decode(all), head = decode(prompt);
  size_t common = 0;
  while (common < head.size() && common < whole.size() && head[common] == whole[common]) ++common;
  if (common < head.size()) {
    // The prompt's text changed with what followed (its last character was incomplete): keep
    // what differs, from the start of the character it differs in.
    while (common > 0 && (static_cast<unsigned char>(whole[common]) & 0xC0) == 0x80) --common;
  }
  return whole.substr(common);
}

SamplingModel load_sampling_model(const std::string& source) {
  SamplingModel m;
  CheckpointWeights c = read_checkpoint_weights(source);
  const io::CheckpointInfo& info = c.info;
  m.checkpoint = c.path;
  m.step = info.step;
  m.gpt = c.gpt;
  m.params = std::move(c.params);

  const std::string where = "checkpoint " + m.checkpoint;
  if (!info.tokenizer.empty()) {
    m.codec = TextCodec::from_record(info.tokenizer, info.tokenizer_data, info.eos_id, where);
  } else if (info.vocab_size == int64_t(io::kByteVocabSize)) {
    // Written before checkpoints recorded a tokenizer, when every text dataset was byte-level.
    m.codec = TextCodec::from_record("byte", "", io::kByteEosId, where);
    m.note = "checkpoint records no tokenizer (kilter " + info.kilter_version +
             "); its vocab_size is 257, so it decodes as bytes";
  } else {
    m.codec.kind = "";
    m.note = "checkpoint records no tokenizer (kilter " + info.kilter_version + ") and its vocab_size " +
             std::to_string(info.vocab_size) + " is not the byte tokenizer's 257: ids only";
  }
  m.starts = to_document_starts(info.document_starts);
  return m;
}

std::vector<int32_t> prompt_ids(const TextCodec& codec, const std::string& text, const std::vector<int32_t>& ids,
                                bool ids_given, const std::string& where) {
  std::vector<int32_t> out;
  if (ids_given) {
    out = ids;
  } else if (!text.empty()) {
    KILTER_CHECK(codec.tokenizer, where << " has no tokenizer to encode a text prompt (tokenizer kind '" << codec.kind
                                        << "'; import with --tokenizer FILE to attach one): give --prompt-tokens ID,ID,...");
    std::vector<uint32_t> encoded;
    codec.tokenizer->encode(text, encoded);
    out.assign(encoded.begin(), encoded.end());
  }
  return out;
}

std::vector<std::pair<uint32_t, uint64_t>> count_document_starts(const io::DatasetIndex& index, const std::string& dir,
                                                                 const std::vector<uint64_t>& docs, size_t max_docs) {
  const uint64_t n = docs.empty() ? index.num_docs() : docs.size();
  const uint64_t take = std::min<uint64_t>(n, std::max<size_t>(max_docs, 1));
  std::vector<io::PieceRequest> pieces;
  for (uint64_t i = 0; i < take; ++i) {
    const uint64_t k = take == n ? i : uint64_t((unsigned __int128)i * n / take);  // evenly spaced
    const uint64_t doc = docs.empty() ? k : docs[size_t(k)];
    if (doc < index.num_docs() && index.doc_lengths[size_t(doc)] > 0) pieces.push_back({doc, 0, 1});
  }
  std::map<uint32_t, uint64_t> counts;
  if (!pieces.empty()) {
    io::ReaderOptions options;
    options.prefetch = 2;
    options.threads = 1;
    io::PrefetchReader reader(index, dir, options);
    constexpr size_t kGroup = 4096;
    for (size_t first = 0; first < pieces.size(); first += kGroup) {
      reader.enqueue(std::vector<io::PieceRequest>(pieces.begin() + long(first),
                                                   pieces.begin() + long(std::min(pieces.size(), first + kGroup))));
      const io::ReadyGroup& group = reader.next();
      for (size_t offset : group.offsets) ++counts[uint32_t(group.tokens[offset])];
    }
  }
  return {counts.begin(), counts.end()};
}

model::DocumentStarts to_document_starts(const std::vector<std::pair<uint32_t, uint64_t>>& counts) {
  model::DocumentStarts starts;
  for (const auto& [id, count] : counts) {
    starts.ids.push_back(int32_t(id));
    starts.counts.push_back(count);
  }
  return starts;
}

std::vector<int32_t> unprompted_start(const TextCodec& codec, const model::DocumentStarts& starts,
                                      const std::string& where, std::string& note) {
  if (!starts.empty()) return {};
  KILTER_CHECK(codec.eos_id >= 0, where << " records neither document starts nor an EOS id to start an empty prompt "
                                           "from: give a prompt");
  note = "records no document starts (written by an older kilter): an empty prompt starts from the EOS id, which "
         "the model never saw as an input, so the first tokens may begin mid-word; give --prompt";
  return {int32_t(codec.eos_id)};
}

TrainingSampler::TrainingSampler(const Config& cfg, const io::DatasetIndex& index, int rank,
                                 model::DocumentStarts starts)
    : every_(cfg.output.sample_every),
      tokens_(cfg.output.sample_tokens),
      temperature_(cfg.output.sample_temperature),
      seed_(cfg.train.seed),
      prompt_(cfg.output.sample_prompt) {
  active_ = rank == 0 && every_ > 0;
  if (!active_) return;
  codec_ = TextCodec::from_record(index.tokenizer, index.tokenizer_data, index.eos_id, "dataset " + index.dir);
  starts_ = std::move(starts);
  prompt_ids_ = prompt_ids(codec_, prompt_, {}, false, "output.sample_prompt");
  if (prompt_ids_.empty()) {
    std::string note;
    prompt_ids_ = unprompted_start(codec_, starts_, "dataset " + index.dir, note);
    if (!note.empty()) std::fprintf(stderr, "kilter: output.sample_prompt is empty and the dataset %s\n", note.c_str());
  }
  KILTER_CHECK(int64_t(prompt_ids_.size()) < cfg.model.block_size,
               "output.sample_prompt is " << prompt_ids_.size() << " tokens, which leaves no room in the context of "
                                          << cfg.model.block_size << " (model.block_size)");
}

void TrainingSampler::maybe_sample(model::Model& model, int64_t step) {
  if (every_ <= 0 || step % every_ != 0) return;
  if (!active_) {
    if (feed_) feed_->serve();  // rank 0's shard group sends it the units
    return;
  }
  model::SamplingOptions options;
  options.max_new_tokens = tokens_;
  options.temperature = temperature_;
  options.top_k = 0;
  options.seed = seed_ + uint64_t(step);
  options.eos_id = codec_.eos_id;
  const model::Generation g = generate_sample(model, options);
  std::printf("sample at step %lld: %s%s\n", (long long)step, one_line(prompt_).c_str(),
              one_line(codec_.continuation(prompt_ids_, g.tokens)).c_str());
  std::fflush(stdout);
}

model::Generation TrainingSampler::generate_sample(model::Model& model, const model::SamplingOptions& options) {
  const model::ModelSpec& gpt = model.config();
  if (!feed_) {
    std::vector<float> params(model.layout().num_params);
    model.get_params(params.data());
    model::Generator generator(gpt, std::move(params));
    return model::generate(generator, prompt_ids_, options, &starts_);
  }
  // Sharded: the weights arrive one unit at a time; the others are told the end even when
  // generation throws (they would wait for the next feed).
  model::Generator generator(gpt, feed_->weights(), feed_);
  model::Generation g;
  try {
    g = model::generate(generator, prompt_ids_, options, &starts_);
  } catch (...) {
    feed_->end();
    throw;
  }
  feed_->end();
  return g;
}

}  // namespace kilter::train
