// The model description's derived figures (spec.h): the parameter table, the activation layout,
// FLOPs and K/V bytes, the q|k|v row layout.
#include "lib/model/spec.h"

#include <cmath>
#include <sstream>

#include "io/base/error.h"

namespace kilter::model {

void check_spec(const ModelSpec& spec) {
  KILTER_CHECK(spec.n_layer > 0 && spec.n_head > 0 && spec.n_embd > 0 && spec.block_size > 0 && spec.vocab_size > 0,
               "model config: n_layer, n_head, n_embd, block_size and vocab_size must be positive (got "
                   << spec.n_layer << ", " << spec.n_head << ", " << spec.n_embd << ", " << spec.block_size << ", "
                   << spec.vocab_size << ")");
  KILTER_CHECK(spec.n_embd % spec.n_head == 0,
               "model.n_embd (" << spec.n_embd << ") must be a multiple of model.n_head (" << spec.n_head << ")");
  KILTER_CHECK(spec.arch == "gpt2" || spec.arch == "llama", "model.arch = " << spec.arch << ": expected gpt2 or llama");
  KILTER_CHECK(spec.n_kv_head >= 0 && spec.n_head % spec.kv_heads() == 0,
               "model.n_kv_head (" << spec.n_kv_head << ") must divide model.n_head (" << spec.n_head << ")");
  KILTER_CHECK(spec.llama() || spec.kv_heads() == spec.n_head,
               "model.n_kv_head = " << spec.n_kv_head << ": grouped-query attention is for model.arch = llama");
  KILTER_CHECK(!spec.llama() || spec.head_dim() % 2 == 0,
               "model.arch = llama needs an even head_dim (RoPE turns pairs of columns); n_embd / n_head = "
                   << spec.head_dim());
  KILTER_CHECK(spec.ffn_hidden >= 0, "model.ffn_hidden = " << spec.ffn_hidden << ": must be >= 0 (0: the default)");
  KILTER_CHECK(spec.norm_eps > 0, "model.norm_eps = " << spec.norm_eps << ": must be > 0");
  KILTER_CHECK(spec.tie_embeddings == "auto" || spec.tie_embeddings == "true" || spec.tie_embeddings == "false",
               "model.tie_embeddings = " << spec.tie_embeddings << ": expected auto, true or false");
  KILTER_CHECK(spec.rope_scaling == "none" || spec.rope_scaling == "llama3",
               "model.rope_scaling = " << spec.rope_scaling << ": expected none or llama3");
  KILTER_CHECK(spec.rope_theta > 0, "model.rope_theta = " << spec.rope_theta << ": must be > 0");
  KILTER_CHECK(spec.rope_scaling != "llama3" || (spec.rope_factor > 0 && spec.rope_low_freq_factor > 0 &&
                                                 spec.rope_high_freq_factor > spec.rope_low_freq_factor &&
                                                 spec.rope_original_context > 0),
               "model.rope_scaling = llama3 needs rope_factor > 0, 0 < rope_low_freq_factor < rope_high_freq_factor "
               "and rope_original_context > 0");
  KILTER_CHECK(spec.llama() || !spec.qkv_bias,
               "model.qkv_bias = true: gpt2 has biases everywhere already; the key is for model.arch = llama");
}

ModelSpec ModelSpec::resolved() const {
  ModelSpec r = *this;
  r.n_kv_head = kv_heads();
  r.ffn_hidden = ffn_width();
  r.tie_embeddings = tied() ? "true" : "false";
  return r;
}

bool ModelSpec::operator==(const ModelSpec& o) const { return io::same_model_settings(resolved(), o.resolved()); }

std::vector<double> rope_inverse_frequencies(const ModelSpec& spec) {
  // As Hugging Face computes them, in float: base ** (2i / dim), inverted (modeling_rope_utils.py);
  // llama3 then divides the long wavelengths by `factor` and blends the middle band.
  const int dim = spec.head_dim(), half = dim / 2;
  std::vector<double> inv(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) {
    const float exponent = float(2 * i) / float(dim);
    const float power = static_cast<float>(std::pow(spec.rope_theta, double(exponent)));
    inv[size_t(i)] = 1.0f / power;
  }
  if (spec.rope_scaling != "llama3") return inv;
  const double factor = spec.rope_factor, low = spec.rope_low_freq_factor, high = spec.rope_high_freq_factor;
  const double old_context = spec.rope_original_context;
  const double low_freq_wavelen = old_context / low, high_freq_wavelen = old_context / high;
  for (double& f : inv) {
    const double wavelen = 2 * M_PI / f;
    if (wavelen > low_freq_wavelen) {
      f = static_cast<float>(f / factor);
    } else if (!(wavelen < high_freq_wavelen)) {
      const double smooth = (old_context / wavelen - low) / (high - low);
      f = static_cast<float>((1 - smooth) * f / factor + smooth * f);
    }
  }
  return inv;
}

namespace {

// Appends tensors to a table; a tensor of two or more dimensions decays.
struct TableBuilder {
  std::vector<TensorSpec> tensors;
  void add(std::string name, std::vector<int64_t> shape, TensorRole role, TensorInit init, int layer = -1) {
    TensorSpec t;
    t.name = std::move(name);
    t.decay = shape.size() >= 2;  // AdamW decays 2-D weights (embeddings included), not biases or norms
    t.shape = std::move(shape);
    t.role = role;
    t.layer = layer;
    t.init = init;
    tensors.push_back(std::move(t));
  }
};

// One GPT-2 block under nanoGPT's names.
void add_gpt2_block(TableBuilder& table, const ModelSpec& spec, int layer) {
  using R = TensorRole;
  using I = TensorInit;
  const int64_t C = spec.n_embd, F = spec.ffn_width();
  const std::string p = "transformer.h." + std::to_string(layer) + ".";
  table.add(p + "ln_1.weight", {C}, R::norm1_weight, I::ones, layer);
  table.add(p + "ln_1.bias", {C}, R::norm1_bias, I::zeros, layer);
  table.add(p + "attn.c_attn.weight", {spec.qkv_width(), C}, R::qkv_weight, I::normal, layer);
  table.add(p + "attn.c_attn.bias", {spec.qkv_width()}, R::qkv_bias, I::zeros, layer);
  table.add(p + "attn.c_proj.weight", {C, C}, R::attn_proj_weight, I::normal_residual, layer);
  table.add(p + "attn.c_proj.bias", {C}, R::attn_proj_bias, I::zeros, layer);
  table.add(p + "ln_2.weight", {C}, R::norm2_weight, I::ones, layer);
  table.add(p + "ln_2.bias", {C}, R::norm2_bias, I::zeros, layer);
  table.add(p + "mlp.c_fc.weight", {F, C}, R::fc_weight, I::normal, layer);
  table.add(p + "mlp.c_fc.bias", {F}, R::fc_bias, I::zeros, layer);
  table.add(p + "mlp.c_proj.weight", {C, F}, R::fc_proj_weight, I::normal_residual, layer);
  table.add(p + "mlp.c_proj.bias", {C}, R::fc_proj_bias, I::zeros, layer);
}

// One Llama-family block under Hugging Face's LlamaForCausalLM names. q|k|v weights (and biases)
// sit next to each other, as do gate and up: the buffer holds the fused projections the kernels
// multiply with, whatever the names.
void add_llama_block(TableBuilder& table, const ModelSpec& spec, int layer) {
  using R = TensorRole;
  using I = TensorInit;
  const int64_t C = spec.n_embd, F = spec.ffn_width(), hd = spec.head_dim();
  const int64_t q = spec.n_head * hd, kv = spec.kv_heads() * hd;
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  table.add(p + "input_layernorm.weight", {C}, R::norm1_weight, I::ones, layer);
  table.add(p + "self_attn.q_proj.weight", {q, C}, R::qkv_weight, I::normal, layer);
  table.add(p + "self_attn.k_proj.weight", {kv, C}, R::qkv_weight, I::normal, layer);
  table.add(p + "self_attn.v_proj.weight", {kv, C}, R::qkv_weight, I::normal, layer);
  if (spec.qkv_bias) {
    table.add(p + "self_attn.q_proj.bias", {q}, R::qkv_bias, I::zeros, layer);
    table.add(p + "self_attn.k_proj.bias", {kv}, R::qkv_bias, I::zeros, layer);
    table.add(p + "self_attn.v_proj.bias", {kv}, R::qkv_bias, I::zeros, layer);
  }
  table.add(p + "self_attn.o_proj.weight", {C, q}, R::attn_proj_weight, I::normal_residual, layer);
  table.add(p + "post_attention_layernorm.weight", {C}, R::norm2_weight, I::ones, layer);
  table.add(p + "mlp.gate_proj.weight", {F, C}, R::fc_weight, I::normal, layer);
  table.add(p + "mlp.up_proj.weight", {F, C}, R::fc_weight, I::normal, layer);
  table.add(p + "mlp.down_proj.weight", {C, F}, R::fc_proj_weight, I::normal_residual, layer);
}

}  // namespace

std::vector<TensorSpec> parameter_table(const ModelSpec& spec) {
  check_spec(spec);
  using R = TensorRole;
  using I = TensorInit;
  const int64_t C = spec.n_embd, V = spec.vocab_size;
  TableBuilder table;
  if (spec.llama()) {
    table.add("model.embed_tokens.weight", {V, C}, R::token_embedding, I::normal);
    for (int l = 0; l < spec.n_layer; ++l) add_llama_block(table, spec, l);
    table.add("model.norm.weight", {C}, R::final_norm_weight, I::ones);
    if (!spec.tied()) table.add("lm_head.weight", {V, C}, R::lm_head, I::normal);
    return std::move(table.tensors);
  }
  table.add("transformer.wte.weight", {V, C}, R::token_embedding, I::normal);
  table.add("transformer.wpe.weight", {spec.block_size, C}, R::position_embedding, I::normal);
  for (int l = 0; l < spec.n_layer; ++l) add_gpt2_block(table, spec, l);
  table.add("transformer.ln_f.weight", {C}, R::final_norm_weight, I::ones);
  table.add("transformer.ln_f.bias", {C}, R::final_norm_bias, I::zeros);
  if (!spec.tied()) table.add("lm_head.weight", {V, C}, R::lm_head, I::normal);
  return std::move(table.tensors);
}

Recompute parse_recompute(const std::string& text) {
  if (text == "none") return Recompute::none;
  if (text == "gelu") return Recompute::gelu;
  if (text == "attention") return Recompute::attention;
  if (text == "block") return Recompute::block;
  KILTER_FAIL("train.recompute=" << text << " is not one of none, gelu, attention, block");
}

ActivationLayout activation_layout(const ModelSpec& spec, Recompute recompute) {
  const size_t C = size_t(spec.n_embd), F = size_t(spec.ffn_width());
  const size_t mean = spec.llama() ? 0 : 1;  // RMSNorm keeps no mean
  ActivationLayout plan;
  auto set = [&](ActSlot slot, size_t per_token) { plan.per_token[static_cast<size_t>(slot)] = per_token; };
  set(ActSlot::norm1, C);
  set(ActSlot::norm1_mean, mean);
  set(ActSlot::norm1_rstd, 1);
  set(ActSlot::qkv, size_t(spec.qkv_width()));
  set(ActSlot::atty, C);
  set(ActSlot::residual2, C);
  set(ActSlot::norm2, C);
  set(ActSlot::norm2_mean, mean);
  set(ActSlot::norm2_rstd, 1);
  set(ActSlot::fch, size_t(spec.ffn_in_width()));
  set(ActSlot::fch_act, F);
  set(ActSlot::residual3, C);
  // recompute: gelu shares the MLP's activation output, block everything but the block's output
  // (the next block's input, from which the backward reruns the block).
  for (size_t s = 0; s < kActSlots; ++s) {
    ActHome home = ActHome::kept;
    if (plan.per_token[s] == 0) home = ActHome::absent;
    else if (recompute == Recompute::block && static_cast<ActSlot>(s) != ActSlot::residual3) home = ActHome::shared;
    else if (recompute == Recompute::gelu && static_cast<ActSlot>(s) == ActSlot::fch_act) home = ActHome::shared;
    plan.home[s] = home;
    (home == ActHome::kept ? plan.kept_per_token : plan.shared_per_token) += home == ActHome::absent ? 0 : plan.per_token[s];
  }
  plan.attention_per_layer = recompute == Recompute::none || recompute == Recompute::gelu;
  // The roundings of the four Linear inputs (norm1, atty, norm2, fch_act). A recomputed fch_act's
  // rounding is not kept: the backward rounds the recomputed values (the same bits), and block's
  // recompute stops before the projection that would round it.
  const bool act_rounding_kept = plan.where(ActSlot::fch_act) == ActHome::kept;
  plan.bf16_inputs_per_token = C + C + C + (act_rounding_kept ? F : 0);
  plan.bf16_layers = recompute == Recompute::block ? 1 : size_t(spec.n_layer);
  // llama also needs the SwiGLU output's gradient beside its input's.
  plan.backward_per_token =
      C + C + C + size_t(spec.qkv_width()) + size_t(spec.ffn_in_width()) + (spec.llama() ? F : 0);
  return plan;
}

double dense_flops_per_token(const ModelSpec& spec) {
  // Integers up to 2^53 are exact in double, so the sum does not depend on its order.
  const double C = spec.n_embd;
  const double q_width = double(spec.n_head) * spec.head_dim();
  const double per_layer = C * spec.qkv_width() + q_width * C + C * spec.ffn_in_width() + double(spec.ffn_width()) * C;
  return 6.0 * (spec.n_layer * per_layer + C * spec.vocab_size);
}

double attention_flops_per_square(const ModelSpec& spec) {
  return 6.0 * spec.n_layer * (double(spec.n_head) * spec.head_dim());
}

double kv_values_per_token_layer(const ModelSpec& spec) { return 2.0 * spec.kv_heads() * spec.head_dim(); }

double kv_bytes_per_token(const ModelSpec& spec, double value_bytes) {
  return kv_values_per_token_layer(spec) * double(spec.n_layer) * value_bytes;
}

KvRowLayout kv_row_layout(const ModelSpec& spec) {
  KvRowLayout layout;
  layout.row_width = spec.qkv_width();
  layout.kv_offset = spec.n_head * spec.head_dim();
  layout.kv_width = 2 * spec.kv_heads() * spec.head_dim();
  return layout;
}

std::string describe_spec(const ModelSpec& spec) {
  std::ostringstream os;
  os << spec.arch << " " << spec.n_layer << " layers x " << spec.n_embd << " (" << spec.n_head << " heads";
  if (spec.kv_heads() != spec.n_head) os << ", " << spec.kv_heads() << " K/V heads";
  os << "), context " << spec.block_size << ", vocabulary " << spec.vocab_size;
  return os.str();
}

}  // namespace kilter::model
