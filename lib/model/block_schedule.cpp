// The block schedule (block_schedule.h): the decoder block's forward and backward, for every
// datapath, in llm.c's gpt2_forward style. N: the micro-batch's token rows; C: n_embd; QKV: the
// q|k|v row width; F: the MLP's width (llama's gate|up: 2F). kv_progress() sits between the
// steps so that a cut piece's K/V move while the CPU computes (kv_exchange.h).
#include "lib/model/block_schedule.h"

namespace kilter::model {

void BlockSchedule::forward(BlockForwardOps& ops) const {
  ops.weights_needed(0);
  // ln1 (N,C) of block 0; every block's last step is the norm after it (the next ln1, or ln_f),
  // whose weights it needs too
  ops.norm({.layer = 0, .out = Act::ln1, .in = Stream::in, .rms = llama_});
  for (int l = 0; l < layers_; ++l) {
    ops.weights_needed(l + 1);
    block_forward(ops, l, false);
  }
}

void BlockSchedule::block_forward(BlockForwardOps& ops, int l, bool recomputing) const {
  // ln1 (N,C): the forward's came with the previous block's residual add; a rerun makes it again
  if (recomputing) ops.norm({.layer = l, .out = Act::ln1, .in = Stream::in, .rms = llama_});
  // qkv (N,QKV) = ln1 Wqkv^T + b, RoPE on q and k (llama)
  ops.linear({.layer = l, .out = Act::qkv, .in = Act::ln1, .weight = Linear::qkv});
  if (llama_) ops.rope({.layer = l});
  // atty (N,C), the softmax (or its statistics) saved
  attention_forward(ops, l, Act::atty, recomputing);
  ops.kv_progress();
  // mid (N,C) = in + atty Wproj^T + b; ln2 (N,C) = norm(mid)
  ops.projection_residual_norm({.layer = l, .out = Stream::mid, .residual = Stream::in, .in = Act::atty,
                                .weight = Linear::attproj, .norm_out = Act::ln2, .rms = llama_});
  ops.kv_progress();
  // fch (N,F; llama 2F) = ln2 Wfc^T + b; fch_act (N,F) = gelu(fch), or swiglu(gate | up)
  if (llama_) {
    ops.linear({.layer = l, .out = Act::fch, .in = Act::ln2, .weight = Linear::fc});
    ops.swiglu({.layer = l, .out = Act::fch_act, .in = Act::fch});
  } else {
    ops.linear_gelu({.layer = l, .out = Act::fch_act, .pre_gelu = Act::fch, .in = Act::ln2, .weight = Linear::fc});
  }
  ops.kv_progress();
  if (recomputing) return;  // the block's output is kept
  // out (N,C) = mid + fch_act Wfcproj^T + b; next_ln (N,C) = norm(out): the next ln1, or ln_f
  ops.projection_residual_norm({.layer = l, .out = Stream::out, .residual = Stream::mid, .in = Act::fch_act,
                                .weight = Linear::fcproj, .norm_out = Act::next_ln, .rms = llama_});
  ops.kv_progress();
}

void BlockSchedule::block_backward(BlockOps& ops, int l) const {
  if (recompute_ == Recompute::block) block_forward(ops, l, true);
  if (recompute_ == Recompute::gelu) {
    if (llama_)
      ops.swiglu({.layer = l, .out = Act::fch_act, .in = Act::fch});
    else
      ops.gelu({.layer = l, .out = Act::fch_act, .in = Act::fch});
  }
  ops.kv_progress();
  // MLP. dfch (N,F; llama 2F) from dresidual (N,C) through the projection and the activation
  if (llama_) {
    ops.linear_backward(
        {.layer = l, .dinp = Grad::dact, .dout = Grad::dresidual, .in = Act::fch_act, .weight = Linear::fcproj});
    ops.swiglu_backward({.layer = l, .dinp = Grad::dfch, .dout = Grad::dact, .in = Act::fch});
  } else {
    ops.linear_gelu_backward({.layer = l, .dinp = Grad::dfch, .dout = Grad::dresidual, .in = Act::fch_act,
                              .weight = Linear::fcproj, .pre_gelu = Act::fch});
  }
  // dln (N,C) = dfch Wfc
  ops.linear_backward({.layer = l, .dinp = Grad::dln, .dout = Grad::dfch, .in = Act::ln2, .weight = Linear::fc});
  ops.kv_progress();
  // dresidual (N,C) += ln2's input gradient: the residual connection
  ops.norm_backward(
      {.layer = l, .dinp = Grad::dresidual, .dout = Grad::dln, .in = Stream::mid, .norm = Act::ln2, .rms = llama_});
  // Attention. datty (N,C) = dresidual Wproj
  ops.linear_backward(
      {.layer = l, .dinp = Grad::datty, .dout = Grad::dresidual, .in = Act::atty, .weight = Linear::attproj});
  ops.kv_progress();
  // the saved softmax again (its output, equal to atty, into the spare buffer)
  if (recompute_ == Recompute::attention) attention_forward(ops, l, Act::spare, true);
  // dqkv (N,QKV), the later parts' dK/dV for these rows added; then RoPE's backward (the prefixes'
  // gradients went out still rotated, as their K/V came in)
  attention_backward(ops, l);
  if (llama_) ops.rope_backward({.layer = l});
  // dln (N,C) = dqkv Wqkv; dresidual += ln1's input gradient
  ops.linear_backward({.layer = l, .dinp = Grad::dln, .dout = Grad::dqkv, .in = Act::ln1, .weight = Linear::qkv});
  ops.kv_progress();
  ops.norm_backward(
      {.layer = l, .dinp = Grad::dresidual, .dout = Grad::dln, .in = Stream::in, .norm = Act::ln1, .rms = llama_});
}

void BlockSchedule::attention_forward(BlockForwardOps& ops, int l, Act out, bool recomputing) const {
  if (!ops.exchanging()) {
    ops.attention({.layer = l, .out = out, .pieces = AttentionPieces::all});
    return;
  }
  // This micro-batch's K/V go out first (later parts elsewhere may wait on them); the pieces that
  // need nothing from others run while the prefixes travel, then the later parts. A rerun sends
  // and waits for nothing (the forward did) and reads the prefixes the exchange still holds.
  if (!recomputing) ops.kv_send({.layer = l});
  ops.attention({.layer = l, .out = out, .pieces = AttentionPieces::without_prefix});
  if (!recomputing) ops.kv_wait({.layer = l});
  ops.attention({.layer = l, .out = out, .pieces = AttentionPieces::with_prefix});
}

void BlockSchedule::attention_backward(BlockOps& ops, int l) const {
  if (!ops.exchanging()) {
    ops.attention_backward({.layer = l, .pieces = AttentionPieces::all});
    return;
  }
  // The later parts first: their prefixes' dK/dV go back to the owners while the other pieces
  // run; then what later parts elsewhere computed for this micro-batch's rows is added.
  ops.attention_backward({.layer = l, .pieces = AttentionPieces::with_prefix});
  ops.kv_send_grads({.layer = l});
  ops.attention_backward({.layer = l, .pieces = AttentionPieces::without_prefix});
  ops.kv_wait_add_grads({.layer = l});
}

}  // namespace kilter::model
