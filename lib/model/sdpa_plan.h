// The host side of the cuDNN SDPA attention engine (lib/model/attention_sdpa.h): from a packed
// micro-batch (cu_seqlens, each piece's pos_offset, the AttentionShape) it computes what the SDPA
// calls of a layer read, so that the engine itself only turns numbers into graphs. Plain C++
// (no CUDA): tests/unit/model_sdpa_plan_test.cpp runs the CPU packed attention through these very
// offsets and staging maps and compares it with attention_forward/backward on the packed batch.
//
// cuDNN's SDPA takes Q, K, V and O as (B, H, S, D) tensors whose batch stride is replaced by a
// RAGGED OFFSET per batch entry (an element offset of the entry's first row), with the real
// lengths in seq_len tensors (padding mask). Each piece is one batch entry, so no row is gathered
// or padded: Q, K and V are strided views of the packed qkv rows (row stride = row_width, Q at
// column 0, K at q_width, V after the K heads), O is written straight into the packed (N, q_width)
// output, and the backward's dQ/dK/dV land straight in the packed dqkv.
//
//   whole: the pieces without a prefix, causal (top-left: key j visible to query i when j <= i);
//   later: the later parts of cut pieces (kv_exchange.h). A part with s earlier tokens has L own
//          queries and s + L keys: its K/V rows are STAGED into one contiguous buffer (its s
//          prefix rows from the exchange, then its own L rows), and the causal mask is aligned
//          bottom-right (key j visible to query i when j <= i + s). The staging map says where
//          each staged row comes from and where its dK/dV go back (the prefix's dkv rows, or the
//          part's own dqkv rows).
//
// A cuDNN graph fixes B and the maximum S, so both are rounded up to a BUCKET (powers of two, S at
// least kSdpaMinSeq) and the graphs are cached per bucket: entries past the pieces have length 0.
// Stats (the softmax's log-sum-exp, kept for the backward) are packed like the rows: (N, n_head)
// floats, ragged offset = row * n_head.
//
// cuDNN's deterministic backward on sm_90 takes a workspace of the bucket's B x H x Sq x Skv bf16
// (dP; sdpa_workspace_estimate), which follows the padded bucket, not the pieces: one long piece
// among many short ones would make it B_pow2 x longest^2. So the pieces of one kind (whole, or
// later parts) run as SEVERAL calls when one call's B x Sq x Skv would pass a score budget
// (sdpa_score_budget: what full-context pieces of the micro-batch's size take): pieces of similar
// length together, each call within the budget. Buckets, graphs and the workspace stay bounded by
// the shape of the micro-batch the memory plan counts (sdpa_workspace_bound).
#pragma once
#include <array>
#include <cstdint>
#include <cstddef>
#include <string>
#include <tuple>
#include <vector>

#include "lib/model/attention.h"

namespace kilter::model {

constexpr int kSdpaMinSeq = 64;  // the smallest S bucket (cuDNN's backward refuses S = 1)

// The rounded shape of one call: what its cached graphs are built for.
struct SdpaBucket {
  int batch = 0;              // B: entries, rounded up to a power of two
  int seq_q = 0, seq_kv = 0;  // the longest query / key sequence, rounded up (power of two, >= kSdpaMinSeq)
  bool bottom_right = false;  // causal mask aligned bottom-right (later parts); top-left otherwise
  // Bounds of the row indices the ragged offsets reach in the query rows (N) and in the key rows
  // (N, or the staged rows), rounded up alike: cuDNN sizes its backward workspace from them.
  int rows_q = 0, rows_kv = 0;
  bool operator<(const SdpaBucket& o) const {
    return std::tie(batch, seq_q, seq_kv, bottom_right, rows_q, rows_kv) <
           std::tie(o.batch, o.seq_q, o.seq_kv, o.bottom_right, o.rows_q, o.rows_kv);
  }
  bool operator==(const SdpaBucket& o) const { return !(*this < o) && !(o < *this); }
  std::string text() const;  // "B=16 S=1024 rows=16384" or "B=2 Sq=256 Skv=1024 bottom-right rows=..."
};

// Where a call's tensor lives in its row buffer: element (b, h, s, d) of it is at
// column + offset[b] + h * stride[1] + s * stride[2] + d * stride[3] (stride[0], the batch stride of
// the unragged layout, is what cuDNN is told; the ragged offsets replace it).
struct SdpaTensorLayout {
  int64_t column = 0;                // of head 0 in a row: the engine's base pointer is buffer + column
  std::array<int64_t, 4> dim{}, stride{};
  int64_t at(int64_t offset, int h, int s, int d) const { return column + offset + h * stride[1] + s * stride[2] + d * stride[3]; }
};

// Which buffer holds a call's key and value rows.
enum class SdpaKeyRows { packed_qkv, staged };

// One SDPA call over some pieces of a micro-batch.
struct SdpaCall {
  SdpaBucket bucket;
  SdpaKeyRows keys = SdpaKeyRows::packed_qkv;
  int entries = 0;                 // real batch entries (<= bucket.batch); 0: no call
  std::vector<int> piece;          // per real entry: its piece in the micro-batch
  // bucket.batch values each (0 past the real entries): query and key tokens of each entry.
  std::vector<int32_t> seq_len_q, seq_len_kv;
  // bucket.batch + 1 values each (the last ones repeat the end): element offsets of each entry's
  // first row in its buffer: Q (qkv rows), K and V (qkv or staged rows), O (output rows), Stats.
  std::vector<int32_t> offset_q, offset_k, offset_v, offset_o, offset_stats;
  // The layouts (dQ, dK, dV, dO share those of Q, K, V, O; in dqkv, the staged gradient and dout).
  SdpaTensorLayout q, k, v, o, stats;

  bool empty() const { return entries == 0; }
  // The int32 block the engine reads on the device, in this order: seq_len_q, seq_len_kv
  // (bucket.batch each), then offset_q, offset_k, offset_v, offset_o, offset_stats (bucket.batch+1
  // each), every array starting at a multiple of kSdpaDescriptorAlign ints.
  std::vector<int32_t> descriptor_block() const;
  enum Array { seq_q_array, seq_kv_array, q_offsets, k_offsets, v_offsets, o_offsets, stats_offsets, num_arrays };
  // Where an array starts in the block of a bucket of `batch` entries; descriptor_ints: its size.
  static size_t descriptor_index(int batch, Array array);
  static size_t descriptor_ints(int batch) { return descriptor_index(batch, num_arrays); }
};

constexpr int kSdpaDescriptorAlign = 16;  // ints: 64-byte aligned device arrays

// Rows of slack, written (zeroed) once, past the last row of every buffer SDPA reads (q|k|v, the
// staged prefix rows, O, dO, Stats): a tile of cuDNN's kernels that runs past a call's last
// sequence reads rows that hold numbers, never memory nothing wrote (whose NaN bit patterns would
// reach the output through a masked score times a NaN value). cuDNN's tiles are at most 128 rows.
constexpr int kSdpaTailRows = 128;

// A run of staged key/value rows (rows of kv_width: k heads | v heads, as a prefix row).
struct SdpaStagedRows {
  int staged_row = 0;       // first row in the staging buffer
  int rows = 0;
  int piece = 0;            // the micro-batch's piece (a later part)
  bool from_prefix = false; // the piece's prefix rows (kv_exchange.h prefix_kv, dK/dV into prefix_dkv)
                            // or its own rows (k|v columns of qkv; dK/dV into dqkv's)
  int source_row = 0;       // prefix: the first prefix row; own: the first packed row
};

struct SdpaPlan {
  AttentionShape shape;
  int tokens = 0;                       // N
  std::vector<SdpaCall> whole;          // pieces without a prefix (one call, or several within the budget)
  std::vector<SdpaCall> later;          // later parts of cut pieces, keys staged (likewise)
  std::vector<SdpaStagedRows> staging;  // the later parts' staged rows, part after part: prefix, own
  int staged_rows = 0;                  // rows of kv_width in the staging buffer

  // Every call, the whole ones first, then the later ones (the order of descriptor_blocks).
  std::vector<const SdpaCall*> calls() const;
  // Every call's descriptor_block(), one after the other in calls() order; offsets[i] is where
  // call i's starts (a multiple of kSdpaDescriptorAlign, as every block's size is).
  std::vector<int32_t> descriptor_blocks(std::vector<size_t>* offsets) const;
};

// Whether the SDPA engine takes this attention shape; *why says why not.
bool sdpa_shape_supported(const AttentionShape& shape, std::string* why);

// A length rounded up to its bucket: the next power of two, at least `minimum`.
int sdpa_bucket(int n, int minimum);

// Plans a packed micro-batch: cu_seqlens (pieces + 1 offsets), pos_offset (per piece, s earlier
// tokens; null = none). Reuses plan's buffers. Throws kilter::Error when an element offset would
// not fit cuDNN's int32 ragged offsets. score_budget: the most B x Sq x Skv of a call's bucket
// (per head); the pieces of a kind run as one call when it fits (or score_budget <= 0), else in
// calls per (Sq, Skv) bucket, longest first, of at most score_budget / (Sq x Skv) entries (a power
// of two, at least one), each call's entries in piece order.
void plan_sdpa(SdpaPlan& plan, const int32_t* cu_seqlens, int pieces, const int32_t* pos_offset,
               const AttentionShape& shape, int64_t score_budget = 0);

// The score budget of micro-batches of `tokens` tokens whose pieces are at most `context` long:
// B x S^2 of full-context pieces filling them (B and S rounded up to their buckets).
int64_t sdpa_score_budget(int tokens, int context);

// cuDNN's device workspace for a call of `bucket` (its backward: the larger of the two), by
// cudnn-frontend 1.32's sizing of the deterministic backward on sm_90 with cuDNN < 9.25: dP of
// the bucket in bf16 (B x H x Sq x Skv, each S rounded up to 64), the softmax sums (fp32, by the
// Stats rows), and with grouped K/V heads the fp32 dK and dV of every query head before they are
// summed into their K/V head (by the key rows, kv_row_stride apart, times the group). An estimate
// for the memory plan: the engine asks cuDNN for the real figure (SdpaAttention::workspace_bytes).
uint64_t sdpa_workspace_estimate(const SdpaBucket& bucket, int64_t kv_row_stride, const AttentionShape& shape);
// The estimate of the largest call plan_sdpa makes, with sdpa_score_budget(tokens, context), for
// micro-batches of at most `tokens` tokens: whole pieces, and one later part of a piece of up to
// `context` tokens (several later parts in one micro-batch may take more, as their staging does).
uint64_t sdpa_workspace_bound(const AttentionShape& shape, int tokens, int context);

}  // namespace kilter::model
