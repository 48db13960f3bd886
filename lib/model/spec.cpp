// The model description's derived figures (spec.h): the parameter table, the activation plan,
// FLOPs and K/V bytes, the q|k|v row layout.
#include "lib/model/spec.h"

#include <sstream>

#include "io/error.h"

namespace kilter::model {

void check_spec(const ModelSpec& spec) {
  KILTER_CHECK(spec.n_layer > 0 && spec.n_head > 0 && spec.n_embd > 0 && spec.block_size > 0 && spec.vocab_size > 0,
               "model config: n_layer, n_head, n_embd, block_size and vocab_size must be positive (got "
                   << spec.n_layer << ", " << spec.n_head << ", " << spec.n_embd << ", " << spec.block_size << ", "
                   << spec.vocab_size << ")");
  KILTER_CHECK(spec.n_embd % spec.n_head == 0,
               "model.n_embd (" << spec.n_embd << ") must be a multiple of model.n_head (" << spec.n_head << ")");
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
  const int64_t C = spec.n_embd, F = spec.ffn_hidden();
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

}  // namespace

std::vector<TensorSpec> parameter_table(const ModelSpec& spec) {
  check_spec(spec);
  using R = TensorRole;
  using I = TensorInit;
  const int64_t C = spec.n_embd;
  TableBuilder table;
  table.add("transformer.wte.weight", {spec.vocab_size, C}, R::token_embedding, I::normal);
  table.add("transformer.wpe.weight", {spec.block_size, C}, R::position_embedding, I::normal);
  for (int l = 0; l < spec.n_layer; ++l) add_gpt2_block(table, spec, l);
  table.add("transformer.ln_f.weight", {C}, R::final_norm_weight, I::ones);
  table.add("transformer.ln_f.bias", {C}, R::final_norm_bias, I::zeros);
  return std::move(table.tensors);
}

Recompute parse_recompute(const std::string& text) {
  if (text == "none") return Recompute::none;
  if (text == "gelu") return Recompute::gelu;
  if (text == "attention") return Recompute::attention;
  if (text == "block") return Recompute::block;
  KILTER_FAIL("train.recompute=" << text << " is not one of none, gelu, attention, block");
}

ActivationPlan activation_plan(const ModelSpec& spec, Recompute recompute) {
  const size_t C = size_t(spec.n_embd), F = size_t(spec.ffn_hidden());
  ActivationPlan plan;
  auto set = [&](ActSlot slot, size_t per_token) { plan.per_token[static_cast<size_t>(slot)] = per_token; };
  set(ActSlot::norm1, C);
  set(ActSlot::norm1_mean, 1);
  set(ActSlot::norm1_rstd, 1);
  set(ActSlot::qkv, size_t(spec.qkv_width()));
  set(ActSlot::atty, C);
  set(ActSlot::residual2, C);
  set(ActSlot::norm2, C);
  set(ActSlot::norm2_mean, 1);
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
  plan.backward_per_token = C + C + C + size_t(spec.qkv_width()) + size_t(spec.ffn_in_width());
  return plan;
}

double dense_flops_per_token(const ModelSpec& spec) {
  // Integers up to 2^53 are exact in double, so the sum does not depend on its order.
  const double C = spec.n_embd;
  const double per_layer = C * spec.qkv_width() + C * C + C * spec.ffn_in_width() + double(spec.ffn_hidden()) * C;
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
  os << spec.n_layer << " layers x " << spec.n_embd << " (" << spec.n_head << " heads), context " << spec.block_size
     << ", vocabulary " << spec.vocab_size;
  return os.str();
}

}  // namespace kilter::model
