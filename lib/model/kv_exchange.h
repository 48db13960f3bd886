// The K/V exchange of cut pieces (context parallelism; docs/design.md, "Batch plan"): what a backend calls,
// layer by layer, while its micro-batch holds parts of pieces cut between ranks.
//
// A part [s, e) of a piece has positions s..e-1; its queries attend to the keys and values of
// all s earlier tokens of its piece, computed by the ranks that hold the earlier parts. In the
// backward, the dK and dV of those earlier tokens go back to their owners, who add them to their
// own before the QKV projection's backward.
//
// Per layer the backend calls, in this order (every call posts or waits; none may be skipped):
//   forward:  forward_send(l, qkv) ... [attention of pieces with no prefix] ...
//             forward_wait(l) ... prefix_kv(l, p) read for every piece p with pos_offset > 0
//   backward: ... attention backward of pieces with a prefix, writing prefix_dkv(l, p) ...
//             backward_send(l) ... [attention backward of the other pieces] ...
//             backward_wait_add(l, dqkv) ... then the QKV projection's backward.
// Sends are posted before waits on every rank and every slot, so no order of ranks deadlocks
// (lib/balance/plan.h: all parts of a piece share one local micro-batch index).
// Pointers are the backend's memory (host for the CPU backend, device for CUDA). The CUDA backend
// drains its compute stream before forward_send, backward_send and backward_wait_add, and expects
// the exchange's device work (the prefix rows arriving, the adds into dqkv) to be complete, or
// ordered on cuda_compute_stream(), when forward_wait and backward_wait_add return.
// Evaluation (Model::forward_loss) never sees an exchange: both backends refuse a batch with one.
// tests/unit/thread_kv_exchange.h is a reference implementation between threads of one process.
#pragma once

namespace kilter::model {

class KvExchange {
 public:
  virtual ~KvExchange() = default;
  // qkv: this micro-batch's (N, 3C) q|k|v rows of `layer`. Posts the sends of the K and V rows
  // that later parts on other ranks need; returns without waiting.
  virtual void forward_send(int layer, const float* qkv) = 0;
  // Waits until the K/V of every earlier token of this micro-batch's later parts have arrived.
  virtual void forward_wait(int layer) = 0;
  // Piece p's prefix (pos_offset[p] rows of 2C floats: k | v of tokens 0..s-1 of its piece, in
  // order). Valid from forward_wait(layer) until backward_wait_add(layer) returns.
  virtual const float* prefix_kv(int layer, int piece) = 0;
  // Where the backward writes piece p's prefix gradient (pos_offset[p] rows of 2C floats:
  // dk | dv), zeroed by the exchange; the backend accumulates (+=) into it.
  virtual float* prefix_dkv(int layer, int piece) = 0;
  // Posts the sends of every prefix_dkv(layer, .) to the ranks that own those tokens.
  virtual void backward_send(int layer) = 0;
  // Waits for the dK/dV that later parts on other ranks computed for this micro-batch's rows and
  // adds them into dqkv's k and v columns (dqkv is (N, 3C)).
  virtual void backward_wait_add(int layer, float* dqkv) = 0;
  // Lets the transfers posted so far move while the backend computes; never waits. The CPU
  // backend calls it between the kernels of a layer: MPI moves a large message over TCP (and any
  // rendezvous protocol without a progress thread) only while some MPI call runs on both sides, so
  // without it a layer's K/V would sit in the sender's queue until its next wait. An exchange
  // whose transfers progress by themselves (NCCL's kernels) does nothing.
  virtual void progress() {}
};

}  // namespace kilter::model
