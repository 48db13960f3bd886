// The decoder block, written once (docs/model.md, "The block schedule"): BlockSchedule is the
// forward and backward of a block for both architectures (gpt2: LayerNorm, GELU MLP, biases;
// llama: RMSNorm, RoPE, grouped K/V heads, SwiGLU, optional qkv bias), with train.recompute and
// the K/V exchange points of cut pieces (kv_exchange.h), in the order every datapath runs them.
// It drives an op table (BlockForwardOps, BlockOps), one per datapath: the CPU's fp32 (and its
// bf16-GEMM precision) and bf16-storage tables, the CUDA backend's two, and the KV-cache
// generator's (the CPU table with its own attention). The schedule names what each step reads and
// writes (the enums below); a table resolves the names into its own memory and kernels. A fused
// op is one entry; a table without that fusion implements it as two calls.
#pragma once
#include "lib/model/attention.h"
#include "lib/model/spec.h"

namespace kilter::model {

// The residual stream around block `layer`: its input (layer 0: the embeddings), the sum after
// attention (residual2) and its output (residual3).
enum class Stream { in, mid, out };
// A block's activations. next_ln: the norm after the block (the next block's ln_1, or ln_f after
// the last). spare: where a recomputation whose output is not needed writes it (the norm-input
// gradient's buffer, free between ln_2's backward and the QKV projection's). A norm's output
// names its weights and statistics too.
enum class Act { ln1, qkv, atty, ln2, fch, fch_act, next_ln, spare };
// A block's Linear layers (weight and bias; their gradients in the backward).
enum class Linear { qkv, attproj, fc, fcproj };
// The backward's gradients of activations: the residual stream's (accumulated by the norms'
// backward), the norms' outputs', attention's output and input, the MLP's input, SwiGLU's output.
enum class Grad { dresidual, dln, datty, dqkv, dfch, dact };

// ---- the entries' arguments, by name (rms: RMSNorm for llama, else LayerNorm) -------------------
struct NormArgs { int layer; Act out; Stream in; bool rms; };  // out = norm(in)
struct LinearArgs { int layer; Act out, in; Linear weight; };  // out = in @ weight^T + bias
// pre_gelu = in @ weight^T + bias; out = gelu(pre_gelu): a GEMM with a GELU epilogue
struct LinearGeluArgs { int layer; Act out, pre_gelu, in; Linear weight; };
// out = residual + in @ weight^T + bias; norm_out = norm(out): the residual add and the next norm
struct ResidualNormArgs { int layer; Stream out, residual; Act in; Linear weight; Act norm_out; bool rms; };
struct ActivationArgs { int layer; Act out, in; };  // out = gelu(in), or swiglu(in), in = gate | up
// RoPE (or its backward) in place on the query and key heads of qkv (dqkv); the exchange's calls
struct LayerArgs { int layer; };
// out = attention(qkv) of the pieces named, the saved state kept; all without an exchange, else
// without_prefix, then with_prefix
struct AttentionArgs { int layer; Act out; AttentionPieces pieces; };
// dinp = dout @ weight (overwritten); dweight, dbias += from dout and in
struct LinearBackwardArgs { int layer; Grad dinp, dout; Act in; Linear weight; };
// the same, dinp times gelu'(pre_gelu): a DGELU epilogue
struct LinearGeluBackwardArgs { int layer; Grad dinp, dout; Act in; Linear weight; Act pre_gelu; };
struct ActivationBackwardArgs { int layer; Grad dinp, dout; Act in; };  // dinp = swiglu'(in) dout
// dinp += norm'(in) dout, the norm's dweight, dbias += (norm: ln1, ln2 or next_ln: whose weights
// and statistics)
struct NormBackwardArgs { int layer; Grad dinp, dout; Stream in; Act norm; bool rms; };
// dqkv of the pieces named, from datty (the exchange's dK/dV added by kv_wait_add_grads)
struct AttentionBackwardArgs { int layer; AttentionPieces pieces; };

// The forward's op table.
class BlockForwardOps {
 public:
  virtual ~BlockForwardOps() = default;
  // The weights up to block `layer`'s are needed next (layer = n_layer: all, the final norm's too).
  virtual void weights_needed(int layer) { (void)layer; }
  virtual void norm(const NormArgs& a) = 0;
  virtual void linear(const LinearArgs& a) = 0;
  // By default the two ops; a table may fuse them (a GELU epilogue).
  virtual void linear_gelu(const LinearGeluArgs& a) {
    linear({.layer = a.layer, .out = a.pre_gelu, .in = a.in, .weight = a.weight});
    gelu({.layer = a.layer, .out = a.out, .in = a.pre_gelu});
  }
  virtual void projection_residual_norm(const ResidualNormArgs& a) = 0;
  virtual void gelu(const ActivationArgs& a) = 0;
  virtual void swiglu(const ActivationArgs& a) = 0;
  virtual void rope(const LayerArgs& a) = 0;
  virtual void attention(const AttentionArgs& a) = 0;
  // The K/V exchange of cut pieces (kv_exchange.h); only called while exchanging() is true.
  virtual bool exchanging() const { return false; }
  virtual void kv_send(const LayerArgs& a) { (void)a; }
  virtual void kv_wait(const LayerArgs& a) { (void)a; }
  virtual void kv_progress() {}
};

// The backward's op table: the forward's (recompute reruns it) and the gradients.
class BlockOps : public BlockForwardOps {
 public:
  virtual void linear_backward(const LinearBackwardArgs& a) = 0;
  virtual void linear_gelu_backward(const LinearGeluBackwardArgs& a) = 0;
  virtual void swiglu_backward(const ActivationBackwardArgs& a) = 0;
  virtual void norm_backward(const NormBackwardArgs& a) = 0;
  virtual void rope_backward(const LayerArgs& a) = 0;
  virtual void attention_backward(const AttentionBackwardArgs& a) = 0;
  virtual void kv_send_grads(const LayerArgs& a) { (void)a; }
  virtual void kv_wait_add_grads(const LayerArgs& a) { (void)a; }
};

class BlockSchedule {
 public:
  BlockSchedule(const ModelSpec& spec, Recompute recompute)
      : llama_(spec.llama()), layers_(spec.n_layer), recompute_(recompute) {}
  // Every block from the embeddings (Stream::in of layer 0) to the final norm's output.
  void forward(BlockForwardOps& ops) const;
  // Block `layer`'s forward; recomputing: the backward's rerun (recompute = block), from ln_1 to
  // the MLP's activation, its attention without exchange calls.
  void block_forward(BlockForwardOps& ops, int layer, bool recomputing) const;
  // Block `layer`'s backward from Grad::dresidual, recomputing what train.recompute dropped.
  void block_backward(BlockOps& ops, int layer) const;

 private:
  void attention_forward(BlockForwardOps& ops, int layer, Act out, bool recomputing) const;
  void attention_backward(BlockOps& ops, int layer) const;
  bool llama_;
  int layers_;
  Recompute recompute_;
};

}  // namespace kilter::model
