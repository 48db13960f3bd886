// KV-cache generation on the CPU (see generate.h). The blocks run through training's block
// schedule on the CPU fp32 op table (block_ops_cpu.h); attention over the cache is its own entry,
// written here for one query row at a time against positions 0..t, which is all generation needs
// (causal, one sequence, no padding).
#include "lib/model/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "io/base/error.h"
#include "lib/model/encoder.h"
#include "lib/model/layout.h"
#include "lib/model/matmul.h"
#include "lib/model/vecmath.h"

namespace kilter::model {

Generator::Generator(const ModelSpec& cfg, std::vector<float> params)
    : Generator(cfg, params.data(), nullptr) {
  const size_t needed = ParamLayout::build(cfg_).num_params;
  KILTER_CHECK(params.size() >= needed, "generator: " << params.size() << " parameters given, the model ("
                                                      << cfg_.n_layer << " layers x " << cfg_.n_embd << ") has "
                                                      << needed);
  own_params_ = std::move(params);  // the buffer moves with its data: params_ still points into it
}

Generator::Generator(const ModelSpec& cfg, float* params, ParamUnitHooks* units)
    : cfg_(cfg), params_(params), units_(units), schedule_(cfg_, Recompute::none) {
  const ParamLayout layout = ParamLayout::build(cfg_);
  offsets_ = LayoutOffsets::of(layout);
  shape_ = {cfg_.n_head, cfg_.kv_heads(), cfg_.head_dim()};
  if (cfg_.llama()) rope_ = RopeTable::build(cfg_, cfg_.block_size);
  const size_t kv = size_t(shape_.kv_width() / 2), T = size_t(cfg_.block_size);
  key_cache_.assign(size_t(cfg_.n_layer) * T * kv, 0.0f);
  value_cache_.assign(size_t(cfg_.n_layer) * T * kv, 0.0f);
  scores_.resize(T);
  logits_.resize(size_t(cfg_.vocab_size));
  // Every layer's activations in the same buffers; the residual stream in place.
  memory_.activations = [this](int, int) {
    return BlockActivations{ln_.data(), mean_.data(), rstd_.data(), qkv_.data(), atty_.data(), nullptr, x_.data(),
                            ln_.data(), mean_.data(), rstd_.data(), fch_.data(), fch_gelu_.data(), x_.data()};
  };
  memory_.params = params_;
  if (units_) {
    // As in training's forward: block `layer` (or the final norm, unit n_layer + 1) is next, and
    // the block two back is done; the embeddings stay for a tied head.
    memory_.weights_needed = [this](int layer) {
      units_->need(layer + 1);
      if (layer >= 2) units_->forward_done(layer - 1);
    };
  }
  memory_.offsets = &offsets_;
  memory_.attention = [this](int layer) { attend(layer, memory_.rows); };
  ops_ = make_cpu_block_ops(cfg_, memory_, false, false, Recompute::none);
}

// The new rows' keys and values (RoPE applied) join the cache; then the causal attention of each
// new row over it: positions 0 .. its own; query head h reads the cache's key/value head
// shape_.group(h).
void Generator::attend(int layer, int n) {
  const int hs = shape_.head_dim, kv = shape_.kv_width() / 2, row = shape_.row_width(), C = shape_.q_width();
  float* keys = key_cache_.data() + size_t(layer) * cfg_.block_size * kv;
  float* values = value_cache_.data() + size_t(layer) * cfg_.block_size * kv;
  for (int i = 0; i < n; ++i) {
    const float* r = qkv_.data() + size_t(i) * row + shape_.q_width();
    std::copy(r, r + kv, keys + size_t(position_ + i) * kv);
    std::copy(r + kv, r + 2 * kv, values + size_t(position_ + i) * kv);
  }
  const float scale = 1.0f / std::sqrt(float(hs));
  for (int i = 0; i < n; ++i) {
    const int t = position_ + i;
    for (int h = 0; h < shape_.n_head; ++h) {
      const float* q = qkv_.data() + size_t(i) * row + shape_.q_col(h);
      const size_t head = size_t(shape_.group(h)) * hs;
      float max_score = -INFINITY;
      for (int j = 0; j <= t; ++j) {
        const float s = lane_dot(q, keys + size_t(j) * kv + head, hs) * scale;
        scores_[size_t(j)] = s;
        max_score = std::max(max_score, s);
      }
      float sum = 0.0f;
      for (int j = 0; j <= t; ++j) {
        scores_[size_t(j)] = std::exp(scores_[size_t(j)] - max_score);
        sum += scores_[size_t(j)];
      }
      const float inv = 1.0f / sum;
      float* y = atty_.data() + size_t(i) * C + size_t(h) * hs;
      std::fill(y, y + hs, 0.0f);
      for (int j = 0; j <= t; ++j) {
        const float p = scores_[size_t(j)] * inv;
        const float* v = values + size_t(j) * kv + head;
        for (int d = 0; d < hs; ++d) y[d] += p * v[d];
      }
    }
  }
}

const float* Generator::feed(const int32_t* tokens, int count) {
  KILTER_CHECK(count >= 1, "generator: nothing to feed");
  KILTER_CHECK(position_ + count <= cfg_.block_size,
               "generator: " << position_ + count << " tokens do not fit the model's context of " << cfg_.block_size
                             << " (model.block_size)");
  for (int i = 0; i < count; ++i)
    KILTER_CHECK(tokens[i] >= 0 && tokens[i] < cfg_.vocab_size,
                 "generator: token id " << tokens[i] << " is outside the model's vocabulary of " << cfg_.vocab_size);
  const size_t n = size_t(count), C = size_t(cfg_.n_embd);
  x_.resize(n * C);
  ln_.resize(n * C);
  mean_.resize(n);
  rstd_.resize(n);
  qkv_.resize(n * size_t(shape_.row_width()));
  atty_.resize(n * C);
  fch_.resize(n * size_t(cfg_.ffn_in_width()));
  fch_gelu_.resize(n * size_t(cfg_.ffn_width()));
  positions_.resize(n);
  for (size_t i = 0; i < n; ++i) positions_[i] = position_ + int32_t(i);

  // Token (+ position) embeddings: one piece whose positions continue from the cache.
  if (units_) units_->need(0);
  const int32_t cu_seqlens[2] = {0, count};
  encoder_forward(x_.data(), tokens, params_ + offsets_.wte, tensor_at(params_, offsets_.wpe), cu_seqlens, 1, int(C),
                  &position_);
  // The blocks, the final norm last (into ln_); the head for the last row only.
  memory_.rows = count, memory_.positions = positions_.data(), memory_.rope = &rope_;
  memory_.embeddings = x_.data();
  memory_.lnf = ln_.data(), memory_.lnf_mean = mean_.data(), memory_.lnf_rstd = rstd_.data();
  schedule_.forward(*ops_);
  position_ += count;
  matmul_forward(logits_.data(), ln_.data() + (n - 1) * C, params_ + offsets_.head, nullptr, 1, int(C),
                 cfg_.vocab_size);
  if (units_) units_->pass_done();
  return logits_.data();
}

TokenPicker::TokenPicker(double temperature, int top_k, uint64_t seed)
    : temperature_(temperature), top_k_(top_k), rng_(seed) {
  KILTER_CHECK(temperature >= 0 && std::isfinite(temperature), "--temperature " << temperature << " must be >= 0");
  KILTER_CHECK(top_k >= 0, "--top-k " << top_k << " must be >= 0");
}

int32_t TokenPicker::pick(const float* logits, int vocab_size) {
  for (int i = 0; i < vocab_size; ++i)
    KILTER_CHECK(std::isfinite(logits[i]), "sampling: logit of id " << i << " is " << logits[i]
                                                                     << " (the weights hold NaN or Inf)");
  if (temperature_ == 0) return int32_t(std::max_element(logits, logits + vocab_size) - logits);
  // Candidates in a total order (logit descending, then id), so top-k never depends on how a
  // sort breaks ties.
  order_.resize(size_t(vocab_size));
  for (int i = 0; i < vocab_size; ++i) order_[size_t(i)] = i;
  const size_t k = top_k_ > 0 ? std::min<size_t>(size_t(top_k_), size_t(vocab_size)) : size_t(vocab_size);
  auto by_logit = [&](int32_t a, int32_t b) { return logits[a] != logits[b] ? logits[a] > logits[b] : a < b; };
  if (k < order_.size()) std::partial_sort(order_.begin(), order_.begin() + long(k), order_.end(), by_logit);
  const double top = *std::max_element(logits, logits + vocab_size);
  weights_.resize(k);
  double total = 0;
  for (size_t i = 0; i < k; ++i) {
    weights_[i] = std::exp((double(logits[order_[i]]) - top) / temperature_);
    total += weights_[i];
  }
  const double u = double(rng_() >> 11) * 0x1.0p-53 * total;  // uniform in [0, total)
  double cumulative = 0;
  for (size_t i = 0; i < k; ++i) {
    cumulative += weights_[i];
    if (u < cumulative) return order_[i];
  }
  return order_[k - 1];  // rounding at the very top of the range
}

Generation generate(Generator& generator, const std::vector<int32_t>& prompt, const SamplingOptions& options,
                    const DocumentStarts* starts) {
  using clock = std::chrono::steady_clock;
  const int context = generator.config().block_size, vocab = generator.config().vocab_size;
  KILTER_CHECK(!prompt.empty() || (starts && !starts->empty()),
               "sampling: the prompt has no token and there are no document starts to draw one from");
  KILTER_CHECK(int64_t(prompt.size()) <= context, "sampling: the prompt has " << prompt.size()
                                                      << " tokens, more than the model's context of " << context
                                                      << " (model.block_size)");
  KILTER_CHECK(options.max_new_tokens >= 0, "--max-new-tokens " << options.max_new_tokens << " must be >= 0");
  TokenPicker picker(options.temperature, options.top_k, options.seed);
  Generation out;
  out.stop_reason = "max_new_tokens";
  generator.reset();
  auto t0 = clock::now();
  const float* logits = nullptr;
  if (!prompt.empty()) {
    logits = generator.feed(prompt.data(), int(prompt.size()));
  } else if (options.max_new_tokens > 0) {
    // The first token from the document starts: log-counts as logits, so temperature and top-k
    // act on them as on the model's; ids no document starts with can never be drawn.
    KILTER_CHECK(starts->ids.size() == starts->counts.size(), "sampling: document start ids and counts differ in number");
    std::vector<float> start_logits(size_t(vocab), std::numeric_limits<float>::lowest());
    for (size_t i = 0; i < starts->ids.size(); ++i) {
      const int32_t id = starts->ids[i];
      KILTER_CHECK(id >= 0 && id < vocab, "sampling: document start id " << id << " is outside the model's vocabulary of "
                                                                         << vocab);
      if (starts->counts[i] > 0) start_logits[size_t(id)] = float(std::log(double(starts->counts[i])));
    }
    const int32_t first = picker.pick(start_logits.data(), vocab);
    out.tokens.push_back(first);
    if (options.max_new_tokens > 1) logits = generator.feed(&first, 1);
  }
  auto t1 = clock::now();
  while (int(out.tokens.size()) < options.max_new_tokens) {
    const int32_t next = picker.pick(logits, vocab);
    if (options.eos_id >= 0 && next == options.eos_id) {
      out.stop_reason = "eos";
      break;
    }
    out.tokens.push_back(next);
    if (int(out.tokens.size()) == options.max_new_tokens) break;
    if (generator.position() == context) {
      out.stop_reason = "context";
      break;
    }
    logits = generator.feed(&next, 1);
  }
  auto t2 = clock::now();
  out.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  out.decode_seconds = std::chrono::duration<double>(t2 - t1).count();
  return out;
}

}  // namespace kilter::model
