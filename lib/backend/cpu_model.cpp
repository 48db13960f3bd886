// CpuModel: the model's forward/backward on the host: the embeddings, the blocks through the block
// schedule (lib/model/block_schedule.h) on the datapath's CPU op table, the LM head and
// crossentropy, and AdamW.
// A micro-batch is packed (model.h): every op but attention runs on its N token rows, attention
// runs piece by piece (cost sum(len^2)), and rows without a target are left out of the LM head.
// A later part of a cut piece (context parallelism) continues its piece's positions and attends to
// the K/V of its earlier tokens, which batch.exchange brings from the ranks holding them; their
// dK/dV go back the same way (the schedule makes kv_exchange.h's calls).
#include "lib/backend/cpu_model.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "io/base/error.h"
#include "lib/model/crossentropy.h"
#include "lib/model/encoder.h"
#include "lib/model/gemm.h"
#include "lib/model/init.h"
#include "lib/model/matmul.h"
#include "lib/optim/adamw.h"

namespace kilter::backend {

using model::Batch;
using model::ModelSpec;

namespace {

template <typename T>
void grow(std::vector<T>& buffer, size_t size) {
  if (buffer.size() < size) {
    buffer.clear();
    buffer.shrink_to_fit();  // release the old block before taking the larger one
    buffer.resize(size);
  }
}
}  // namespace

void set_blas_threads(int threads) { model::set_gemm_threads(threads); }

CpuModel::CpuModel(const ModelSpec& cfg, size_t pad_multiple, const std::string& precision,
                   const std::string& recompute, bool bf16_storage)
    : ModelBase(cfg, pad_multiple, recompute) {
  KILTER_CHECK(precision == "fp32" || precision == "bf16",
               "train.precision=" << precision << " is not supported by the cpu backend (fp32 | bf16)");
  bf16_ = precision == "bf16";
  bf16_storage_ = bf16_storage;
  KILTER_USER_CHECK(!bf16_storage_ || bf16_, "train.bf16_storage = on needs train.precision = bf16 (got "
                                                 << precision << ")");
  // The bf16-storage oracle multiplies bf16 values in fp32 GEMMs: it needs no bf16 instructions.
  KILTER_CHECK(!bf16_ || bf16_storage_ || model::gemm_has_bf16(),
               "train.precision=bf16 needs bf16 GEMM instructions (AVX512_BF16 or AMX) on the cpu backend; this CPU "
               "and build give " << model::gemm_engine() << " (use train.precision=fp32)");
  params_.resize(layout_.padded_size);  // zeros (FreshPagesAllocator)
  if (bf16_) params_bf16_.assign(layout_.padded_size, 0);
  grads_.resize(layout_.padded_size);
  if (cfg_.llama()) rope_ = model::RopeTable::build(cfg_, cfg_.block_size);
  memory_.activations = [this](int layer, int rows) { return block_activations(layer, rows); };
  if (bf16_ && !bf16_storage_)
    memory_.bf16_inputs = [this](int layer, int rows) { return block_inputs_bf16(layer, rows); };
  memory_.weights_needed = [this](int layer) {
    await_params(layer < cfg_.n_layer ? offsets_.block[size_t(layer)] + offsets_.block_floats : layout_.padded_size);
    if (!units_) return;
    // Block `layer` (or the final norm) is next; the forward of block layer - 2 is over.
    unit_needed(layer + 1);
    if (layer >= 2) units_->forward_done(layer - 1);
  };
  memory_.offsets = &offsets_;
  ops_ = model::make_cpu_block_ops(cfg_, memory_, bf16_, bf16_storage_, recompute_);
}

std::string CpuModel::describe() const {
  const std::string math = bf16_storage_ ? "bf16 storage (the CUDA datapath's oracle), fp32 accumulation and weights"
                           : bf16_       ? "bf16 GEMM inputs, fp32 accumulation and weights"
                                         : "fp32";
  return "cpu (" + model::gemm_engine() + ", " + math + ", " + std::to_string(model::gemm_threads()) + " threads)";
}

void CpuModel::refresh_bf16_params() {
  if (bf16_) model::to_bf16(params_bf16_.data(), params_.data(), params_.size());
  if (!master_sharded_) return;
  widen_norms(0, layout_.padded_size);
  drop_unowned_master();  // a whole-buffer write (initialization, a resume) kept only what this rank owns
}

void CpuModel::shard_optimizer(const std::vector<model::ParamRange>& owned) {
  ModelBase::shard_optimizer(owned);
  // Only bf16 storage reads every weight through the working copy; fp32 and bf16 GEMMs read the
  // fp32 parameters, which stay whole (and sharded parameters hold their own chunks).
  if (!bf16_storage_ || units_) return;
  await_params(layout_.padded_size);
  master_sharded_ = true;
  widened_.resize(layout_.padded_size);
  norm_ranges_ = model::norm_tensor_ranges(layout_);
  widen_norms(0, layout_.padded_size);
  drop_unowned_master();
}

void CpuModel::widen_norms(size_t lo, size_t hi) const {
  for (const model::ParamRange& r : norm_ranges_) {
    const size_t a = std::max(lo, r.offset), b = std::min(hi, r.offset + r.count);
    if (a < b) model::bf16_to_floats(widened_.data() + a, params_bf16_.data() + a, b - a);
  }
}

void CpuModel::drop_unowned_master() {
  size_t at = 0;
  for (const model::ParamRange& r : owned()) {
    if (r.offset > at) return_pages(params_.data() + at, r.offset - at);
    at = std::max(at, r.offset + r.count);
  }
  if (at < layout_.padded_size) return_pages(params_.data() + at, layout_.padded_size - at);
}

void CpuModel::params_arriving(std::function<void(size_t end)> wait) {
  await_params(layout_.padded_size);  // a previous gather's rest first
  arriving_ = std::move(wait);
  arrived_end_ = 0;
}

void CpuModel::set_param_units(model::ParamUnitHooks* hooks) {
  KILTER_CHECK(capacity_tokens_ == 0, "CpuModel::set_param_units: call it before reserve (the head's buffers)");
  units_ = hooks;
  head_chunk_rows_ = units_ ? kShardedHeadChunkRows : kHeadChunkRows;
  unit_ranges_ = units_ ? model::param_unit_ranges(layout_) : std::vector<model::ParamRange>{};
}

void CpuModel::unit_needed(int unit) {
  if (!units_->need(unit) || !bf16_) return;
  const model::ParamRange& r = unit_ranges_[size_t(unit)];
  model::to_bf16(params_bf16_.data() + r.offset, params_.data() + r.offset, r.count);
}

void CpuModel::await_params(size_t end) const {
  if (!arriving_) return;
  end = std::min(end, layout_.padded_size);
  if (end <= arrived_end_) return;
  arriving_(end);
  if (master_sharded_) {
    widen_norms(arrived_end_, end);  // the working copy itself arrived
  } else if (bf16_) {
    model::bf16* rounded = const_cast<model::bf16*>(params_bf16_.data());
    model::to_bf16(rounded + arrived_end_, params_.data() + arrived_end_, end - arrived_end_);
  }
  arrived_end_ = end;
  if (arrived_end_ == layout_.padded_size) arriving_ = nullptr;
}

CpuModel::BlockActivations CpuModel::block_activations(int layer, int rows) {
  float* kept = block_acts_.data() + static_cast<size_t>(layer) * capacity_tokens_ * plan_.kept_per_token;
  float* shared = block_scratch_.data();
  BlockActivations a = model::carve_block(plan_, static_cast<size_t>(rows), [&](model::ActSlot, model::ActHome home,
                                                                               size_t floats) {
    float*& next = home == model::ActHome::kept ? kept : shared;
    float* slice = next;
    next += floats;
    return slice;
  });
  a.att = att_.data() + (att_layers() == 1 ? 0 : static_cast<size_t>(layer)) * capacity_att_;
  return a;
}

model::Bf16Inputs CpuModel::block_inputs_bf16(int layer, int rows) {
  model::Bf16Inputs b;
  if (!bf16_ || bf16_storage_) return b;
  const size_t C = cfg_.n_embd;
  const size_t N = static_cast<size_t>(rows);
  const size_t held = plan_.bf16_layers == 1 ? 0 : static_cast<size_t>(layer);
  model::bf16* p = inputs_bf16_.data() + held * capacity_tokens_ * plan_.bf16_inputs_per_token;
  b.ln1 = p;       p += N * C;
  b.atty = p;      p += N * C;
  b.ln2 = p;       p += N * C;
  b.fch_act = plan_.where(model::ActSlot::fch_act) == model::ActHome::kept ? p : nullptr;
  return b;
}

void CpuModel::reserve(int max_tokens, int context) {
  KILTER_CHECK(max_tokens > 0 && context > 0, "CpuModel::reserve: max_tokens and context must be positive, got "
                                                  << max_tokens << ", " << context);
  // sum(len * (offset + len)) <= N * context: every query sees at most `context` keys (a later
  // part of a cut piece too, and with context > max_tokens, context parallelism, pieces are cut).
  ensure_capacity(static_cast<size_t>(max_tokens), static_cast<size_t>(cfg_.n_head) * max_tokens * context);
}

void CpuModel::ensure_capacity(size_t tokens, size_t att) {
  const size_t C = cfg_.n_embd;
  const size_t L = cfg_.n_layer;
  if (tokens > capacity_tokens_) {
    capacity_tokens_ = tokens;
    grow(encoded_, tokens * C);
    grow(block_acts_, L * tokens * plan_.kept_per_token);
    grow(block_scratch_, tokens * plan_.shared_per_token);
    if (bf16_ && !bf16_storage_) grow(inputs_bf16_, plan_.bf16_layers * tokens * plan_.bf16_inputs_per_token);
    if (bf16_storage_) {
      grow(projection_, tokens * C);
      grow(dresidual_bf16_, tokens * C);
    }
    grow(lnf_, tokens * C);
    grow(lnf_mean_, tokens);
    grow(lnf_rstd_, tokens);
    grow(dresidual_, tokens * C);
    grow(dln_, tokens * C);
    grow(datty_, tokens * C);
    grow(dqkv_, tokens * size_t(cfg_.qkv_width()));
    grow(dfch_, tokens * size_t(cfg_.ffn_in_width()));
    if (cfg_.llama()) grow(dact_, tokens * size_t(cfg_.ffn_width()));
    grow(positions_, tokens);
    grow(target_rows_, tokens);
    grow(target_ids_, tokens);
    grow(head_inputs_, tokens * C);
    grow(head_dinputs_, static_cast<size_t>(head_chunk_rows_) * C);
    grow(logits_, static_cast<size_t>(head_chunk_rows_) * cfg_.vocab_size);
  }
  if (att > capacity_att_) {
    capacity_att_ = att;
    grow(att_, att_layers() * att);
  }
}

void CpuModel::init_params(uint64_t seed) {
  await_params(layout_.padded_size);
  std::fill(params_.begin(), params_.end(), 0.0f);
  model::init_params(params_.data(), layout_, cfg_, seed);
  refresh_bf16_params();
  zero_moments();
}

void CpuModel::set_params(const float* host) {
  await_params(layout_.padded_size);
  std::memcpy(params_.data(), host, sizeof(float) * layout_.num_params);
  refresh_bf16_params();
}
void CpuModel::get_params(float* host) const {
  await_params(layout_.padded_size);
  if (master_sharded_) {
    // No rank holds the whole master: the weights the forward computes with (a sharded
    // checkpoint writes each rank's master from params()).
    model::bf16_to_floats(host, params_bf16_.data(), layout_.num_params);
    return;
  }
  std::memcpy(host, params_.data(), sizeof(float) * layout_.num_params);
}

std::optional<model::Bf16MatmulScope> CpuModel::gemm_precision_scope() const {
  if (!bf16_ || bf16_storage_) return std::nullopt;
  return std::make_optional<model::Bf16MatmulScope>(params_.data(), params_bf16_.data(), params_.size());
}

void CpuModel::forward(const Batch& batch) {
  model::validate_batch(batch, cfg_);
  const int pieces = batch.num_pieces();
  const int32_t* cu_seqlens = batch.cu_seqlens.data();
  const int32_t* pos_offset = batch.pos_offset.empty() ? nullptr : batch.pos_offset.data();
  ensure_capacity(static_cast<size_t>(batch.N),
                  model::attention_saved_floats(cu_seqlens, pieces, cfg_.n_head, pos_offset));
  memory_.embeddings = encoded_.data();
  memory_.lnf = lnf_.data(), memory_.lnf_mean = lnf_mean_.data(), memory_.lnf_rstd = lnf_rstd_.data();
  memory_.params = master_sharded_ ? widened_.data() : params_.data(), memory_.grads = grads_.data();
  float* grad[] = {dresidual_.data(), dln_.data(), datty_.data(), dqkv_.data(), dfch_.data(), dact_.data()};
  std::copy(std::begin(grad), std::end(grad), memory_.grad);
  memory_.params_bf16 = params_bf16_.data();
  memory_.projection = projection_.data(), memory_.dresidual_bf16 = dresidual_bf16_.data();
  memory_.rows = batch.N, memory_.batch = &batch, memory_.positions = positions_.data(), memory_.rope = &rope_;
  // A sharded step's all-gather may still be arriving (params_arriving): each layer waits for its
  // own range only, so the gather of the later layers overlaps the earlier layers' forward.
  await_params(offsets_.embeddings_end());
  if (units_) unit_needed(0);
  if (master_sharded_) {
    const model::bf16* wpe = offsets_.wpe == model::kNoTensor ? nullptr : params_bf16_.data() + offsets_.wpe;
    model::encoder_forward_bf16(encoded_.data(), batch.inputs.data(), params_bf16_.data() + offsets_.wte, wpe,
                                cu_seqlens, pieces, cfg_.n_embd, pos_offset);
  } else {
    model::encoder_forward(encoded_.data(), batch.inputs.data(), params_.data() + offsets_.wte,
                           model::tensor_at(params_.data(), offsets_.wpe), cu_seqlens, pieces, cfg_.n_embd,
                           pos_offset);
  }
  if (bf16_storage_) model::round_bf16_inplace(encoded_.data(), static_cast<size_t>(batch.N) * cfg_.n_embd);
  if (cfg_.llama()) model::piece_positions(positions_.data(), cu_seqlens, pieces, pos_offset);
  if (units_) units_->forward_done(0);  // a tied head gathers the embeddings again (head_needs_embeddings)
  schedule_.forward(*ops_);
  if (units_) units_->forward_done(cfg_.n_layer);  // the last block's
}

void CpuModel::head_needs_embeddings() {
  if (units_ && cfg_.tied()) unit_needed(0);
}

void CpuModel::head_finished() {
  if (units_ && cfg_.tied()) units_->head_done();
}

int64_t CpuModel::gather_target_rows(const Batch& batch) {
  const size_t C = cfg_.n_embd;
  const size_t N = static_cast<size_t>(batch.N);
  int64_t count = 0;
  for (size_t row = 0; row < N; ++row) {
    if (batch.targets[row] < 0) continue;
    target_rows_[count] = static_cast<int32_t>(row);
    target_ids_[count] = batch.targets[row];
    std::memcpy(head_inputs_.data() + count * C, lnf_.data() + row * C, sizeof(float) * C);
    ++count;
  }
  return count;
}

double CpuModel::forward_loss(const Batch& batch) {
  model::check_evaluation_batch(batch);
  const auto precision = gemm_precision_scope();
  forward(batch);
  const int C = cfg_.n_embd, V = cfg_.vocab_size;
  head_needs_embeddings();
  double loss = 0.0;
  if (bf16_storage_)  // the CUDA bf16 datapath's classifier: bf16 logits
    loss = model::classifier_bf16(nullptr, nullptr, lnf_.data(), working(params_.data() + offsets_.head),
                                  batch.targets.data(), batch.N, C, V, 0.0f);
  const int64_t num_targets = bf16_storage_ ? 0 : gather_target_rows(batch);
  for (int64_t c0 = 0; c0 < num_targets; c0 += head_chunk_rows_) {
    const int n = static_cast<int>(std::min(head_chunk_rows_, num_targets - c0));
    model::matmul_forward(logits_.data(), head_inputs_.data() + c0 * C, params_.data() + offsets_.head, nullptr, n, C,
                          V);
    loss += model::crossentropy_forward(logits_.data(), target_ids_.data() + c0, n, V);
  }
  if (units_) units_->pass_done();
  return loss;
}

double CpuModel::forward_backward(const Batch& batch, float loss_scale, const model::GradReadyFn& on_ready) {
  const auto precision = gemm_precision_scope();
  forward(batch);
  // The phase timers' split: the LM head computes logits, loss and their gradient chunk by
  // chunk, so it is counted with backward.
  if (backward_start_hook_) backward_start_hook_();
  head_needs_embeddings();
  const double loss = head_backward(batch, loss_scale);  // into dln_
  head_finished();
  backward_from_final_norm(batch, on_ready);
  if (units_) units_->pass_done();
  return loss;
}

void CpuModel::backward_from_final_norm(const Batch& batch, const model::GradReadyFn& on_ready) {
  // The final norm: its input is the last block's output. dresidual_ carries the gradient of the
  // residual stream; each norm's backward adds its input gradient into it, which is the residual
  // connection.
  std::memset(dresidual_.data(), 0, sizeof(float) * static_cast<size_t>(batch.N) * cfg_.n_embd);
  if (units_) unit_needed(cfg_.n_layer + 1);
  ops_->norm_backward({.layer = cfg_.n_layer - 1, .dinp = model::Grad::dresidual, .dout = model::Grad::dln,
                       .in = model::Stream::out, .norm = model::Act::next_ln, .rms = cfg_.llama()});
  // The final norm (and an untied head) are the last tensors; the zero padding after them is
  // final too.
  if (on_ready) on_ready(offsets_.lnf_w, layout_.padded_size - offsets_.lnf_w);
  if (units_) units_->grads_final(cfg_.n_layer + 1);
  for (int l = cfg_.n_layer - 1; l >= 0; --l) {
    if (units_) unit_needed(l + 1);
    schedule_.block_backward(*ops_, l);
    if (on_ready) on_ready(offsets_.block[l], offsets_.block_floats);
    if (units_) units_->grads_final(l + 1);
  }
  float* grads = grads_.data();
  model::encoder_backward(grads + offsets_.wte, model::tensor_at(grads, offsets_.wpe), dresidual_.data(),
                          batch.inputs.data(), batch.cu_seqlens.data(), batch.num_pieces(), cfg_.n_embd,
                          batch.pos_offset.empty() ? nullptr : batch.pos_offset.data());
  // The token embedding also holds a tied head's gradient, so it (with wpe next to it) is final
  // only now.
  if (on_ready) on_ready(offsets_.wte, offsets_.embeddings_end() - offsets_.wte);
  if (units_) units_->grads_final(0);
}

double CpuModel::head_backward(const Batch& batch, float loss_scale) {
  // One chunk of target rows at a time: logits, loss and dlogits (in place), then the gradients
  // of the gathered final-norm rows and of the head's weight. Rows without a target keep a zero
  // gradient.
  const int C = cfg_.n_embd, V = cfg_.vocab_size;
  float* params = params_.data();
  float* grads = grads_.data();
  float* dlnf = dln_.data();
  if (bf16_storage_) {  // the CUDA bf16 datapath's classifier: bf16 logits and dlogits
    const double loss = model::classifier_bf16(dlnf, grads + offsets_.head, lnf_.data(), working(params + offsets_.head),
                                               batch.targets.data(), batch.N, C, V, loss_scale);
    ops_->kv_progress();  // the K/V exchange moves (kv_exchange.h)
    return loss;
  }
  std::memset(dlnf, 0, sizeof(float) * static_cast<size_t>(batch.N) * C);
  const int64_t num_targets = gather_target_rows(batch);
  double loss = 0.0;
  for (int64_t c0 = 0; c0 < num_targets; c0 += head_chunk_rows_) {
    const int n = static_cast<int>(std::min(head_chunk_rows_, num_targets - c0));
    const float* x = head_inputs_.data() + c0 * C;
    model::matmul_forward(logits_.data(), x, params + offsets_.head, nullptr, n, C, V);
    loss += model::crossentropy_forward_backward_inplace(logits_.data(), target_ids_.data() + c0, n, V, loss_scale);
    model::matmul_backward_overwrite_dinp(head_dinputs_.data(), grads + offsets_.head, nullptr, logits_.data(), x,
                                          params + offsets_.head, n, C, V);
    for (int i = 0; i < n; ++i)
      std::memcpy(dlnf + static_cast<size_t>(target_rows_[c0 + i]) * C, head_dinputs_.data() + static_cast<size_t>(i) * C,
                  sizeof(float) * C);
    ops_->kv_progress();  // the K/V exchange moves (kv_exchange.h)
  }
  return loss;
}

void CpuModel::zero_grads() {
  if (!units_) {
    std::fill(grads_.begin(), grads_.end(), 0.0f);
    return;
  }
  // Sharded parameters: only this rank's chunks hold anything (the rest is freed, reading zeros).
  for (const model::ParamRange& r : owned()) std::fill(grads_.data() + r.offset, grads_.data() + r.offset + r.count, 0.0f);
}

bool CpuModel::grads_finite(size_t offset, size_t count) {
  // x * 0 is 0 for every finite x and NaN for inf and NaN: one sum, which vectorizes, instead of
  // a branch per element.
  const float* g = grads_.data() + offset;
  float acc[8] = {0};
  size_t i = 0;
  for (; i + 8 <= count; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += g[i + j] * 0.0f;
  float total = 0;
  for (int j = 0; j < 8; ++j) total += acc[j];
  for (; i < count; ++i) total += g[i] * 0.0f;
  return total == 0.0f;
}

double CpuModel::grad_norm_squared() {
  // Fixed-order partial sums in double: deterministic and accurate for 10^8 elements.
  // Per owned range, then over the ranges (unsharded: one range, the same sum as ever).
  double total = 0.0;
  for (const model::ParamRange& r : owned()) {
    const size_t end = std::min(r.offset + r.count, layout_.num_params);
    if (r.offset >= end) continue;
    const float* g = grads_.data() + r.offset;
    const size_t n = end - r.offset;
    double acc[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
      for (int j = 0; j < 8; ++j) acc[j] += static_cast<double>(g[i + j]) * g[i + j];
    double range_total = 0.0;
    for (int j = 0; j < 8; ++j) range_total += acc[j];
    for (; i < n; ++i) range_total += static_cast<double>(g[i]) * g[i];
    total += range_total;
  }
  return total;
}

void CpuModel::adamw_step(const model::AdamWParams& p) {
  await_params(layout_.padded_size);
  ensure_moments();
  // Every tensor's part inside every owned range (unsharded: every tensor whole).
  float *m = moment_m(), *v = moment_v();
  model::for_each_owned_part(layout_, owned(), [&](size_t lo, size_t hi, size_t k, bool decay) {
    optim::adamw_update(params_.data() + lo, grads_.data() + lo, m + k, v + k, hi - lo, p.lr, p.beta1, p.beta2, p.eps,
                        decay ? p.weight_decay : 0.0f, p.grad_scale, p.t);
    // Sharded, the all-gather brings the other ranks' ranges and params_changed() rounds them;
    // under the distributed optimizer the working copy is what is gathered: its own ranges first.
    if (bf16_ && (!sharded() || master_sharded_))
      model::to_bf16(params_bf16_.data() + lo, params_.data() + lo, hi - lo);
  });
}

}  // namespace kilter::backend
