// The one description of the model (docs/design.md, "Model"): the shape a config's [model] section
// gives, and everything derived from it that more than one part of kilter needs. The parameter
// table (names, shapes, order, initialization), the activations a block keeps, the FLOPs and K/V
// bytes a token costs, and where K and V sit in a row of the fused q|k|v projection all come from
// here, so a backend, the memory plan, the batch plan and the K/V exchange cannot disagree.
// GPT-2 and the Llama family (Llama 3, Qwen2, Mistral, SmolLM) are described; every derived figure
// is a function of the spec, not a formula written into its user.
#pragma once
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "io/model_settings.h"

namespace kilter::model {

struct ModelSpec {
  // The settings, one field each, as io/model_settings.h lists them (name, type, default; the
  // meaning of each is its help text there). The first five: n_layer, n_head, n_embd, block_size
  // (the context: the longest piece the model sees), vocab_size (0 in a config: from the dataset
  // index). The architecture (docs/design.md, "Model"): gpt2 (learned positions, LayerNorm, GELU
  // MLP, biases, tied head) or llama (RoPE, RMSNorm, SwiGLU MLP, grouped-query attention, no
  // biases unless qkv_bias, untied head unless tie_embeddings says otherwise).
  KILTER_MODEL_SETTINGS(KILTER_MODEL_SETTING_FIELD)

  bool llama() const { return arch == "llama"; }
  int head_dim() const { return n_embd / n_head; }
  int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  // Width of one row of the fused q|k|v projection: the query heads, then K, then V.
  int qkv_width() const { return (n_head + 2 * kv_heads()) * head_dim(); }
  // The MLP: its hidden width, and the output width of its first Linear (llama: gate | up).
  int ffn_width() const {
    if (ffn_hidden > 0) return ffn_hidden;
    return llama() ? (8 * n_embd / 3 + 255) / 256 * 256 : 4 * n_embd;
  }
  int ffn_in_width() const { return llama() ? 2 * ffn_width() : ffn_width(); }
  // The widest output of any Linear layer (the bias gradients' column sums).
  int widest_linear_out() const { return std::max({qkv_width(), n_embd, ffn_in_width()}); }
  bool tied() const { return tie_embeddings == "auto" ? !llama() : tie_embeddings == "true"; }

  // The settings with the defaults that depend on others resolved (n_kv_head, ffn_hidden,
  // tie_embeddings): two specs that make the same model compare equal.
  ModelSpec resolved() const;
  bool operator==(const ModelSpec& o) const;
  bool operator!=(const ModelSpec& o) const { return !(*this == o); }
};

// RoPE's inverse frequencies, head_dim / 2 of them (HF's rotate-half convention: frequency i
// turns the pair of columns (i, i + head_dim / 2)), with llama3 scaling applied where set.
std::vector<double> rope_inverse_frequencies(const ModelSpec& spec);

// Throws kilter::Error when the description cannot make a model (non-positive sizes, n_embd not a
// multiple of n_head, n_head not a multiple of n_kv_head, an unknown arch, llama keys on gpt2),
// naming the model.* keys.
void check_spec(const ModelSpec& spec);

// ---- parameters -------------------------------------------------------------------------------
// What a tensor is to the model; the per-block roles are shared by every block.
enum class TensorRole {
  token_embedding,
  position_embedding,
  norm1_weight, norm1_bias,
  qkv_weight, qkv_bias,
  attn_proj_weight, attn_proj_bias,
  norm2_weight, norm2_bias,
  fc_weight, fc_bias,
  fc_proj_weight, fc_proj_bias,
  final_norm_weight, final_norm_bias,
  lm_head,
  count
};
constexpr size_t kTensorRoles = static_cast<size_t>(TensorRole::count);
// How init_params fills a tensor: N(0, 0.02); N(0, 0.02 / sqrt(2 n_layer)) for the projections
// into the residual stream; zeros (biases); ones (norm weights).
enum class TensorInit { normal, normal_residual, zeros, ones };

struct TensorSpec {
  std::string name;            // the checkpoint's and the export's name (nanoGPT's for GPT-2)
  std::vector<int64_t> shape;  // torch layout; Linear weights are [out, in]
  TensorRole role = TensorRole::token_embedding;
  int layer = -1;              // the block it belongs to (-1: none)
  TensorInit init = TensorInit::normal;
  bool decay = false;          // AdamW weight decay (2-D weights only)
};

// Every parameter tensor in buffer order: the embeddings, each block's tensors contiguous
// (h.0 .. h.{L-1}), then the final norm (and an untied head). Backward finishes the blocks from
// the last to the first, so gradient buckets become ready from high offsets to low.
std::vector<TensorSpec> parameter_table(const ModelSpec& spec);

// ---- activations -----------------------------------------------------------------------------
// train.recompute: what the forward drops and the backward recomputes.
enum class Recompute { none, gelu, attention, block };
// Parses train.recompute; throws kilter::Error naming the key for anything else.
Recompute parse_recompute(const std::string& text);

// The tensors one block keeps for its backward, per token, in the order a backend lays them out.
enum class ActSlot {
  norm1, norm1_mean, norm1_rstd, qkv, atty, residual2, norm2, norm2_mean, norm2_rstd, fch, fch_act, residual3,
  count
};
constexpr size_t kActSlots = static_cast<size_t>(ActSlot::count);
// Where a slot lives: every layer its own (kept), one block's worth all layers share and the
// backward recomputes (shared), or nowhere (this architecture has no such tensor).
enum class ActHome { kept, shared, absent };

struct ActivationLayout {
  std::array<size_t, kActSlots> per_token{};  // elements per token of each slot
  std::array<ActHome, kActSlots> home{};
  size_t kept_per_token = 0;    // one layer's kept elements per token
  size_t shared_per_token = 0;  // the shared block's elements per token
  bool attention_per_layer = true;  // every layer keeps its attention's saved state (else one is shared)
  // The Linear layers' inputs whose bf16 roundings a bf16 GEMM keeps for the backward (CPU
  // backend, train.precision = bf16): elements per token per layer, held for `bf16_layers` layers.
  size_t bf16_inputs_per_token = 0;
  size_t bf16_layers = 0;
  // Backward scratch per token: the residual stream's gradient, a norm's input gradient, the
  // attention output's, the q|k|v rows', the MLP's first Linear output's.
  size_t backward_per_token = 0;

  size_t of(ActSlot slot) const { return per_token[static_cast<size_t>(slot)]; }
  ActHome where(ActSlot slot) const { return home[static_cast<size_t>(slot)]; }
};
ActivationLayout activation_layout(const ModelSpec& spec, Recompute recompute);

// ---- costs -----------------------------------------------------------------------------------
// Forward + backward FLOPs of one token through the dense layers and the LM head: 6 x the
// weights of every Linear (GPT-2: 6 (12 n_layer n_embd^2 + n_embd vocab)). Exact in double.
double dense_flops_per_token(const ModelSpec& spec);
// Forward + backward FLOPs of attention per unit of sum(L^2) (causal: half the pairs), over all
// layers: 6 n_layer n_head head_dim.
double attention_flops_per_square(const ModelSpec& spec);
// K and V elements of one token in one layer (what a cut piece's later part receives).
double kv_values_per_token_layer(const ModelSpec& spec);
// Bytes of K and V of one token over all layers, one direction, at value_bytes per element.
double kv_bytes_per_token(const ModelSpec& spec, double value_bytes);

// Where K and V sit in a row of the fused q|k|v projection's output: K at column kv_offset, V
// right after it, kv_width columns of both together, rows row_width apart.
struct KvRowLayout {
  int row_width = 0;
  int kv_offset = 0;
  int kv_width = 0;
};
KvRowLayout kv_row_layout(const ModelSpec& spec);

// "4 layers x 256 (4 heads), context 256, vocabulary 8192": for logs and error messages.
std::string describe_spec(const ModelSpec& spec);

}  // namespace kilter::model
