// The host side of the cuDNN SDPA engine (lib/model/sdpa_plan.h) on the CPU: the ragged offsets,
// the layouts, the buckets and the staging map of later parts. The proof is an emulation of the
// two SDPA calls: the CPU packed attention (lib/model/attention.cpp) runs entry by entry, its
// inputs GATHERED through the planned offsets and layouts (the staged K/V built by the staging
// map) and its outputs and gradients scattered back the same way, and must give what
// attention_forward/backward give on the packed batch: whole pieces, later parts with prefixes
// (bottom-right causal), grouped-query shapes, buckets wider than the batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "lib/model/attention.h"
#include "lib/model/sdpa_plan.h"
#include "tests/unit/model_testing.h"

namespace kilter::model {
namespace {

using testing::random_vector;

// A packed micro-batch with prefixes: piece lengths, their pos_offsets, and each later part's
// prefix k|v rows (s rows of kv_width).
struct PackedCase {
  AttentionShape shape;
  std::vector<int32_t> cu_seqlens{0}, pos_offset;
  std::vector<std::vector<float>> prefix_kv;
  std::vector<float> qkv, dout;
  int tokens() const { return cu_seqlens.back(); }
  int pieces() const { return static_cast<int>(pos_offset.size()); }
};

PackedCase make_case(const AttentionShape& shape, const std::vector<int>& lengths, const std::vector<int>& offsets,
                     uint64_t seed) {
  PackedCase c;
  c.shape = shape;
  for (size_t p = 0; p < lengths.size(); ++p) {
    c.cu_seqlens.push_back(c.cu_seqlens.back() + lengths[p]);
    c.pos_offset.push_back(offsets[p]);
    c.prefix_kv.push_back(random_vector(static_cast<size_t>(offsets[p]) * shape.kv_width(), seed + 100 + p));
  }
  c.qkv = random_vector(static_cast<size_t>(c.tokens()) * shape.row_width(), seed);
  c.dout = random_vector(static_cast<size_t>(c.tokens()) * shape.q_width(), seed + 1);
  return c;
}

// What attention_forward/backward give on the packed batch (the reference).
struct AttentionResult {
  std::vector<float> out, dqkv;
  std::vector<std::vector<float>> prefix_dkv;
};

AttentionResult packed_attention(const PackedCase& c) {
  AttentionResult r;
  const int N = c.tokens();
  r.out.assign(static_cast<size_t>(N) * c.shape.q_width(), 0.0f);
  r.dqkv.assign(static_cast<size_t>(N) * c.shape.row_width(), 0.0f);
  std::vector<const float*> kv;
  std::vector<float*> dkv;
  for (int p = 0; p < c.pieces(); ++p) {
    r.prefix_dkv.emplace_back(c.prefix_kv[p].size(), 0.0f);
    kv.push_back(c.prefix_kv[p].data());
  }
  for (auto& d : r.prefix_dkv) dkv.push_back(d.data());
  const AttentionPrefix prefix{c.pos_offset.data(), kv.data(), dkv.data()};
  std::vector<float> att(attention_saved_floats(c.cu_seqlens.data(), c.pieces(), c.shape.n_head, c.pos_offset.data()));
  attention_forward(r.out.data(), att.data(), c.qkv.data(), c.cu_seqlens.data(), c.pieces(), c.shape, false, prefix);
  attention_backward(r.dqkv.data(), c.dout.data(), c.qkv.data(), att.data(), c.cu_seqlens.data(), c.pieces(), c.shape,
                     false, prefix);
  return r;
}

// Rows [s0, s0 + rows) of head h of a tensor (layout, entry offset) <-> a dense (rows, head_dim) block.
void gather_head(float* dst, const std::vector<float>& buffer, const SdpaTensorLayout& layout, int32_t offset, int h,
                 int s0, int rows) {
  const int hd = static_cast<int>(layout.dim[3]);
  for (int s = 0; s < rows; ++s)
    for (int d = 0; d < hd; ++d) {
      const int64_t at = layout.at(offset, h, s0 + s, d);
      ASSERT_GE(at, 0);
      ASSERT_LT(static_cast<size_t>(at), buffer.size());
      dst[static_cast<size_t>(s) * hd + d] = buffer[at];
    }
}

void scatter_head(std::vector<float>& buffer, const SdpaTensorLayout& layout, int32_t offset, int h, int s0, int rows,
                  const float* src, int src_stride) {
  const int hd = static_cast<int>(layout.dim[3]);
  for (int s = 0; s < rows; ++s)
    for (int d = 0; d < hd; ++d) {
      const int64_t at = layout.at(offset, h, s0 + s, d);
      ASSERT_LT(static_cast<size_t>(at), buffer.size());
      buffer[at] += src[static_cast<size_t>(s) * src_stride + d];  // cuDNN writes: every element once
    }
}

// The staged K/V buffer of the later parts, built from the staging map alone.
std::vector<float> stage_keys(const SdpaPlan& plan, const PackedCase& c) {
  const AttentionShape& shape = plan.shape;
  const int kv = shape.kv_width();
  std::vector<float> staged(static_cast<size_t>(plan.staged_rows) * kv, 0.0f);
  for (const SdpaStagedRows& run : plan.staging)
    for (int r = 0; r < run.rows; ++r) {
      float* dst = staged.data() + static_cast<size_t>(run.staged_row + r) * kv;
      const float* src = run.from_prefix
                             ? c.prefix_kv[run.piece].data() + static_cast<size_t>(run.source_row + r) * kv
                             : c.qkv.data() + static_cast<size_t>(run.source_row + r) * shape.row_width() + shape.q_width();
      std::copy(src, src + kv, dst);
    }
  return staged;
}

// The staged rows' dK/dV back where the staging map says: the prefix's dkv, or dqkv's k|v columns.
void unstage_key_grads(const SdpaPlan& plan, const std::vector<float>& staged_grad, AttentionResult& r) {
  const AttentionShape& shape = plan.shape;
  const int kv = shape.kv_width();
  for (const SdpaStagedRows& run : plan.staging)
    for (int row = 0; row < run.rows; ++row) {
      const float* src = staged_grad.data() + static_cast<size_t>(run.staged_row + row) * kv;
      float* dst = run.from_prefix
                       ? r.prefix_dkv[run.piece].data() + static_cast<size_t>(run.source_row + row) * kv
                       : r.dqkv.data() + static_cast<size_t>(run.source_row + row) * shape.row_width() + shape.q_width();
      for (int j = 0; j < kv; ++j) dst[j] += src[j];
    }
}

// One SDPA call emulated on the CPU: each entry's Q, K, V gathered through the call's offsets and
// layouts into a one-piece problem (keys [0, s) as its prefix, s = seq_len_kv - seq_len_q, which
// is the bottom-right alignment), attention_forward/backward on it, and O, dQ, dK, dV scattered
// back through the same offsets.
void emulate_call(const SdpaCall& call, const AttentionShape& shape, const std::vector<float>& qkv,
                  const std::vector<float>& keys, const std::vector<float>& dout, std::vector<float>& out,
                  std::vector<float>& dqkv, std::vector<float>& dkeys) {
  const int hd = shape.head_dim, W = shape.row_width(), KV = shape.kv_width();
  for (int b = 0; b < call.bucket.batch; ++b) {
    const int Lq = call.seq_len_q[b], Lkv = call.seq_len_kv[b];
    if (b >= call.entries) {
      EXPECT_EQ(Lq, 0);
      EXPECT_EQ(Lkv, 0);
      continue;
    }
    ASSERT_LE(Lq, call.bucket.seq_q);
    ASSERT_LE(Lkv, call.bucket.seq_kv);
    const int s = Lkv - Lq;
    ASSERT_GE(s, 0);
    if (!call.bucket.bottom_right) ASSERT_EQ(s, 0);  // top-left causal only where the alignments agree
    std::vector<float> mini_qkv(static_cast<size_t>(Lq) * W), prefix(static_cast<size_t>(s) * KV);
    std::vector<float> mini_dout(static_cast<size_t>(Lq) * shape.q_width()), block(static_cast<size_t>(Lkv) * hd);
    for (int h = 0; h < shape.n_head; ++h) {
      gather_head(block.data(), qkv, call.q, call.offset_q[b], h, 0, Lq);
      for (int i = 0; i < Lq; ++i) std::copy_n(&block[static_cast<size_t>(i) * hd], hd, &mini_qkv[static_cast<size_t>(i) * W + h * hd]);
      gather_head(block.data(), dout, call.o, call.offset_o[b], h, 0, Lq);
      for (int i = 0; i < Lq; ++i)
        std::copy_n(&block[static_cast<size_t>(i) * hd], hd, &mini_dout[static_cast<size_t>(i) * shape.q_width() + h * hd]);
    }
    for (int g = 0; g < shape.n_kv_head; ++g)
      for (int which = 0; which < 2; ++which) {
        const SdpaTensorLayout& layout = which == 0 ? call.k : call.v;
        gather_head(block.data(), keys, layout, which == 0 ? call.offset_k[b] : call.offset_v[b], g, 0, Lkv);
        const int column = (which * shape.n_kv_head + g) * hd;  // in a prefix row; + q_width in a qkv row
        for (int j = 0; j < Lkv; ++j) {
          float* dst = j < s ? &prefix[static_cast<size_t>(j) * KV + column]
                             : &mini_qkv[static_cast<size_t>(j - s) * W + shape.q_width() + column];
          std::copy_n(&block[static_cast<size_t>(j) * hd], hd, dst);
        }
      }
    std::vector<float> mini_out(static_cast<size_t>(Lq) * shape.q_width()), mini_dqkv(mini_qkv.size(), 0.0f),
        prefix_dkv(prefix.size(), 0.0f);
    const int32_t cu[2] = {0, Lq};
    const float* prefix_rows[1] = {prefix.data()};
    float* prefix_grads[1] = {prefix_dkv.data()};
    const AttentionPrefix with_prefix{&s, prefix_rows, prefix_grads};
    std::vector<float> att(attention_saved_floats(cu, 1, shape.n_head, &s));
    attention_forward(mini_out.data(), att.data(), mini_qkv.data(), cu, 1, shape, false, with_prefix);
    attention_backward(mini_dqkv.data(), mini_dout.data(), mini_qkv.data(), att.data(), cu, 1, shape, false, with_prefix);
    for (int h = 0; h < shape.n_head; ++h) {
      scatter_head(out, call.o, call.offset_o[b], h, 0, Lq, mini_out.data() + h * hd, shape.q_width());
      scatter_head(dqkv, call.q, call.offset_q[b], h, 0, Lq, mini_dqkv.data() + h * hd, W);
    }
    for (int g = 0; g < shape.n_kv_head; ++g)
      for (int which = 0; which < 2; ++which) {
        const SdpaTensorLayout& layout = which == 0 ? call.k : call.v;
        const int32_t offset = which == 0 ? call.offset_k[b] : call.offset_v[b];
        const int column = (which * shape.n_kv_head + g) * hd;
        scatter_head(dkeys, layout, offset, g, 0, s, prefix_dkv.data() + column, KV);
        scatter_head(dkeys, layout, offset, g, s, Lq, mini_dqkv.data() + shape.q_width() + column, W);
      }
  }
}

// Every call of a plan emulated: the whole pieces on the packed rows, the later parts on the
// staged rows (with their gradients unstaged).
AttentionResult sdpa_emulation(const SdpaPlan& plan, const PackedCase& c) {
  AttentionResult r;
  r.out.assign(static_cast<size_t>(c.tokens()) * c.shape.q_width(), 0.0f);
  r.dqkv.assign(static_cast<size_t>(c.tokens()) * c.shape.row_width(), 0.0f);
  for (int p = 0; p < c.pieces(); ++p) r.prefix_dkv.emplace_back(c.prefix_kv[p].size(), 0.0f);
  for (const SdpaCall& call : plan.whole) emulate_call(call, plan.shape, c.qkv, c.qkv, c.dout, r.out, r.dqkv, r.dqkv);
  const std::vector<float> staged = stage_keys(plan, c);
  std::vector<float> staged_grad(staged.size(), 0.0f);
  for (const SdpaCall& call : plan.later)
    emulate_call(call, plan.shape, c.qkv, staged, c.dout, r.out, r.dqkv, staged_grad);
  unstage_key_grads(plan, staged_grad, r);
  return r;
}

double max_relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0.0, scale = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return diff / scale;
}

void expect_same_attention(const PackedCase& c, int64_t score_budget = 0) {
  SdpaPlan plan;
  plan_sdpa(plan, c.cu_seqlens.data(), c.pieces(), c.pos_offset.data(), c.shape, score_budget);
  const AttentionResult want = packed_attention(c);
  const AttentionResult got = sdpa_emulation(plan, c);
  // The same CPU code runs the same pieces, so only the gathers could differ: 1e-6 is a loose bound.
  EXPECT_LT(max_relative_difference(got.out, want.out), 1e-6);
  EXPECT_LT(max_relative_difference(got.dqkv, want.dqkv), 1e-6);
  for (int p = 0; p < c.pieces(); ++p)
    EXPECT_LT(max_relative_difference(got.prefix_dkv[p], want.prefix_dkv[p]), 1e-6) << "piece " << p;
}

TEST(SdpaPlan, WholePiecesThroughTheOffsetsEqualPackedAttention) {
  expect_same_attention(make_case({2, 2, 8}, {5, 1, 17, 64, 3, 40}, {0, 0, 0, 0, 0, 0}, 11));
}

TEST(SdpaPlan, LaterPartsThroughTheStagingMapEqualPackedAttention) {
  // Whole pieces and later parts interleaved; a part of one token, a prefix of one token.
  expect_same_attention(make_case({2, 2, 8}, {9, 30, 1, 12, 70, 4}, {0, 37, 5, 0, 1, 100}, 12));
}

TEST(SdpaPlan, GroupedQueryHeads) {
  expect_same_attention(make_case({6, 2, 8}, {21, 8, 33, 2}, {0, 19, 0, 64}, 13));
  expect_same_attention(make_case({4, 1, 16}, {13, 50}, {7, 0}, 14));  // multi-query
}

TEST(SdpaPlan, OffsetsLayoutsAndStaging) {
  const AttentionShape shape{4, 2, 8};  // row_width 64, q_width 32, kv_width 32
  const std::vector<int32_t> cu{0, 10, 15, 40}, offsets{0, 20, 0};
  SdpaPlan plan;
  plan_sdpa(plan, cu.data(), 3, offsets.data(), shape);
  EXPECT_EQ(plan.tokens, 40);
  // Whole pieces 0 and 2: B = 2, S = 64 (the minimum bucket), top-left causal on the qkv rows.
  ASSERT_EQ(plan.whole.size(), 1u);
  const SdpaCall& whole = plan.whole[0];
  EXPECT_EQ(whole.entries, 2);
  EXPECT_EQ(whole.piece, (std::vector<int>{0, 2}));
  EXPECT_EQ(whole.bucket, (SdpaBucket{2, 64, 64, false, 64, 64}));
  EXPECT_EQ(whole.seq_len_q, (std::vector<int32_t>{10, 25}));
  EXPECT_EQ(whole.offset_q, (std::vector<int32_t>{0, 15 * 64, 40 * 64}));
  EXPECT_EQ(whole.offset_k, whole.offset_q);
  EXPECT_EQ(whole.offset_o, (std::vector<int32_t>{0, 15 * 32, 40 * 32}));
  EXPECT_EQ(whole.offset_stats, (std::vector<int32_t>{0, 15 * 4, 40 * 4}));
  EXPECT_EQ(whole.k.column, 32);
  EXPECT_EQ(whole.v.column, 48);
  EXPECT_EQ(whole.q.stride, (std::array<int64_t, 4>{64 * 64, 8, 64, 1}));
  EXPECT_EQ(whole.k.dim, (std::array<int64_t, 4>{2, 2, 64, 8}));
  EXPECT_EQ(whole.stats.stride, (std::array<int64_t, 4>{4 * 64, 1, 4, 1}));
  // The later part (piece 1: 5 queries after 20 prefix tokens): 25 staged rows, bottom-right.
  ASSERT_EQ(plan.later.size(), 1u);
  const SdpaCall& later = plan.later[0];
  EXPECT_EQ(later.entries, 1);
  EXPECT_EQ(later.bucket, (SdpaBucket{1, 64, 64, true, 64, 64}));  // 40 rows, 25 staged
  EXPECT_EQ(later.seq_len_q, (std::vector<int32_t>{5}));
  EXPECT_EQ(later.seq_len_kv, (std::vector<int32_t>{25}));
  EXPECT_EQ(later.offset_q, (std::vector<int32_t>{10 * 64, 15 * 64}));
  EXPECT_EQ(later.offset_k, (std::vector<int32_t>{0, 25 * 32}));
  EXPECT_EQ(later.k.column, 0);
  EXPECT_EQ(later.v.column, 16);
  EXPECT_EQ(later.k.stride[2], 32);
  EXPECT_EQ(plan.staged_rows, 25);
  ASSERT_EQ(plan.staging.size(), 2u);
  EXPECT_TRUE(plan.staging[0].from_prefix);
  EXPECT_EQ(plan.staging[0].rows, 20);
  EXPECT_FALSE(plan.staging[1].from_prefix);
  EXPECT_EQ(plan.staging[1].staged_row, 20);
  EXPECT_EQ(plan.staging[1].source_row, 10);
  // The device block: each array at its aligned index.
  const std::vector<int32_t> block = whole.descriptor_block();
  EXPECT_EQ(block.size(), SdpaCall::descriptor_ints(2));
  EXPECT_EQ(block[SdpaCall::descriptor_index(2, SdpaCall::seq_q_array) + 1], 25);
  EXPECT_EQ(block[SdpaCall::descriptor_index(2, SdpaCall::o_offsets) + 1], 15 * 32);
  EXPECT_EQ(SdpaCall::descriptor_index(2, SdpaCall::seq_kv_array) % kSdpaDescriptorAlign, 0u);
  EXPECT_EQ(SdpaCall::descriptor_index(2, SdpaCall::stats_offsets) % kSdpaDescriptorAlign, 0u);
}

TEST(SdpaPlan, BucketsAreReusedAndPaddedEntriesAreEmpty) {
  const AttentionShape shape = AttentionShape::mha(64, 8);
  SdpaPlan a, b;
  const std::vector<int32_t> cu_a{0, 100, 300, 301}, cu_b{0, 129, 256, 300, 310, 400};
  plan_sdpa(a, cu_a.data(), 3, nullptr, shape);
  plan_sdpa(b, cu_b.data(), 5, nullptr, shape);
  ASSERT_EQ(a.whole.size(), 1u);
  ASSERT_EQ(b.whole.size(), 1u);
  EXPECT_EQ(a.whole[0].bucket, (SdpaBucket{4, 256, 256, false, 512, 512}));
  EXPECT_EQ(b.whole[0].bucket, (SdpaBucket{8, 256, 256, false, 512, 512}));
  EXPECT_TRUE(a.later.empty());
  // The fourth entry of `a` pads the bucket: no tokens, and it starts where the last piece ends.
  EXPECT_EQ(a.whole[0].seq_len_q[3], 0);
  EXPECT_EQ(a.whole[0].offset_q[3], 301 * shape.row_width());
  EXPECT_EQ(a.whole[0].offset_q[4], 301 * shape.row_width());
  // The same bucket for another batch of up to 4 pieces of up to 256 tokens.
  const std::vector<int32_t> cu_c{0, 256, 257};
  SdpaPlan c;
  plan_sdpa(c, cu_c.data(), 2, nullptr, shape);
  EXPECT_EQ(c.whole[0].bucket.seq_q, 256);
  EXPECT_EQ(sdpa_bucket(1, kSdpaMinSeq), kSdpaMinSeq);
  EXPECT_EQ(sdpa_bucket(1025, kSdpaMinSeq), 2048);
  EXPECT_EQ(sdpa_bucket(3, 1), 4);
}

// Every call of a plan within the score budget, every piece in exactly one call of its kind, each
// call's entries in piece order; the descriptor blocks one after the other at aligned offsets.
void expect_calls_within(const SdpaPlan& plan, int pieces, const std::vector<int32_t>& pos_offset, int64_t budget) {
  std::vector<int> seen(pieces, 0);
  for (const SdpaCall* call : plan.calls()) {
    const SdpaBucket& b = call->bucket;
    const bool alone = call->entries == 1;  // one entry over the budget runs alone
    EXPECT_TRUE(alone || int64_t(b.batch) * b.seq_q * b.seq_kv <= budget) << b.text();
    EXPECT_TRUE(std::is_sorted(call->piece.begin(), call->piece.end()));
    for (int p : call->piece) {
      ++seen[p];
      EXPECT_EQ(pos_offset[p] > 0, call->keys == SdpaKeyRows::staged) << "piece " << p;
    }
  }
  for (int p = 0; p < pieces; ++p) EXPECT_EQ(seen[p], 1) << "piece " << p;
  std::vector<size_t> offsets;
  const std::vector<int32_t> blocks = plan.descriptor_blocks(&offsets);
  const std::vector<const SdpaCall*> calls = plan.calls();
  ASSERT_EQ(offsets.size(), calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(offsets[i] % kSdpaDescriptorAlign, 0u);
    const std::vector<int32_t> block = calls[i]->descriptor_block();
    EXPECT_TRUE(std::equal(block.begin(), block.end(), blocks.begin() + static_cast<std::ptrdiff_t>(offsets[i])));
  }
}

TEST(SdpaPlan, CallsSplitWithinTheScoreBudget) {
  // A budget of 4 x 64^2: the piece of 100 (bucket 128) runs alone, the seven pieces of the 64
  // bucket in calls of 4 and 3 entries; without a budget, one call of 8 x 128^2.
  const PackedCase c = make_case({2, 2, 8}, {5, 1, 17, 100, 64, 3, 40, 2}, {0, 0, 0, 0, 0, 0, 0, 0}, 21);
  const int64_t budget = 4 * 64 * 64;
  SdpaPlan plan;
  plan_sdpa(plan, c.cu_seqlens.data(), c.pieces(), c.pos_offset.data(), c.shape, budget);
  ASSERT_EQ(plan.whole.size(), 3u);
  EXPECT_EQ(plan.whole[0].piece, (std::vector<int>{3}));
  EXPECT_EQ(plan.whole[0].bucket, (SdpaBucket{1, 128, 128, false, 256, 256}));
  EXPECT_EQ(plan.whole[1].piece, (std::vector<int>{0, 1, 2, 4}));
  EXPECT_EQ(plan.whole[2].piece, (std::vector<int>{5, 6, 7}));
  EXPECT_EQ(plan.whole[2].bucket.batch, 4);
  expect_calls_within(plan, c.pieces(), c.pos_offset, budget);
  expect_same_attention(c, budget);
  SdpaPlan unbounded;
  plan_sdpa(unbounded, c.cu_seqlens.data(), c.pieces(), c.pos_offset.data(), c.shape);
  ASSERT_EQ(unbounded.whole.size(), 1u);
  EXPECT_EQ(unbounded.whole[0].bucket, (SdpaBucket{8, 128, 128, false, 256, 256}));
  // A budget the one call fits keeps it one call.
  plan_sdpa(unbounded, c.cu_seqlens.data(), c.pieces(), c.pos_offset.data(), c.shape, 8 * 128 * 128);
  EXPECT_EQ(unbounded.whole.size(), 1u);
}

TEST(SdpaPlan, LaterPartsSplitWithinTheScoreBudgetEqualPackedAttention) {
  // Later parts of (Sq, Skv) buckets (64, 128) x 3 and (64, 64) x 2, whole pieces between them.
  const PackedCase c = make_case({4, 2, 8}, {9, 30, 1, 12, 70, 4, 20, 7}, {0, 37, 100, 0, 1, 100, 3, 0}, 22);
  const int64_t budget = 2 * 64 * 128;
  SdpaPlan plan;
  plan_sdpa(plan, c.cu_seqlens.data(), c.pieces(), c.pos_offset.data(), c.shape, budget);
  EXPECT_GT(plan.later.size(), 1u);
  expect_calls_within(plan, c.pieces(), c.pos_offset, budget);
  expect_same_attention(c, budget);
}

TEST(SdpaPlan, ScoreBudgetIsFullContextPiecesOfTheBatchSize) {
  EXPECT_EQ(sdpa_score_budget(16384, 1024), 16 * 1024 * 1024);  // GPT-2 124M's 16 x 1024
  EXPECT_EQ(sdpa_score_budget(4096, 512), 8 * 512 * 512);
  EXPECT_EQ(sdpa_score_budget(16000, 1024), 16 * 1024 * 1024);  // 15.6 pieces round up
  EXPECT_EQ(sdpa_score_budget(100, 1024), 128 * 128);             // one piece of the batch's size
  EXPECT_EQ(sdpa_score_budget(239, 64), 4 * 64 * 64);
  // Full-context pieces fit their own budget in one call.
  const AttentionShape shape = AttentionShape::mha(768, 12);
  std::vector<int32_t> cu{0};
  while (cu.back() < 16384) cu.push_back(cu.back() + 1024);
  SdpaPlan plan;
  plan_sdpa(plan, cu.data(), 16, nullptr, shape, sdpa_score_budget(16384, 1024));
  ASSERT_EQ(plan.whole.size(), 1u);
  EXPECT_EQ(plan.whole[0].bucket, (SdpaBucket{16, 1024, 1024, false, 16384, 16384}));
}

TEST(SdpaPlan, WorkspaceEstimateAndItsBound) {
  // GPT-2 124M, 16 x 1024: dP of 16 x 12 x 1024 x 1024 bf16 and the softmax sums of 16384 rows.
  const AttentionShape gpt2 = AttentionShape::mha(768, 12);
  const uint64_t dp = 16ull * 12 * 1024 * 1024 * 2, sums = 16384ull * 12 * 4;
  EXPECT_EQ(sdpa_workspace_estimate(SdpaBucket{16, 1024, 1024, false, 16384, 16384}, gpt2.row_width(), gpt2), dp + sums);
  EXPECT_EQ(sdpa_workspace_bound(gpt2, 16384, 1024), dp + sums);
  // Grouped K/V heads add the fp32 dK and dV of every query head (4 per K/V head here).
  const AttentionShape gqa{8, 2, 16};
  EXPECT_EQ(sdpa_workspace_estimate(SdpaBucket{2, 64, 64, false, 128, 128}, gqa.row_width(), gqa),
            2ull * 8 * 64 * 64 * 2 + 128ull * 8 * 4 + 2ull * 128 * gqa.row_width() * 4 * 4);
  // A context longer than the micro-batch (a piece cut over ranks): one later part's keys count.
  EXPECT_GT(sdpa_workspace_bound(gpt2, 4096, 16384), sdpa_workspace_bound(gpt2, 4096, 4096));
  // No call of random batches of up to 3000 tokens (pieces up to 512, some later parts) passes the bound.
  for (const AttentionShape& shape : {gpt2, gqa}) {
    const uint64_t bound = sdpa_workspace_bound(shape, 3000, 512);
    uint32_t state = 7;
    auto next = [&](int n) { return static_cast<int>((state = state * 1664525u + 1013904223u) >> 8) % n; };
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<int32_t> cu{0}, offsets;
      while (true) {
        const int len = 1 + (next(4) == 0 ? next(512) : next(40));
        if (cu.back() + len > 3000) break;
        cu.push_back(cu.back() + len);
        offsets.push_back(next(8) == 0 ? next(512 - len + 1) : 0);
      }
      SdpaPlan plan;
      const int pieces = static_cast<int>(offsets.size());
      plan_sdpa(plan, cu.data(), pieces, offsets.data(), shape, sdpa_score_budget(cu.back(), 512));
      for (const SdpaCall* call : plan.calls()) {
        if (call->keys == SdpaKeyRows::staged && call->entries > 1) continue;  // the bound counts one later part
        EXPECT_LE(sdpa_workspace_estimate(call->bucket, call->k.stride[2], shape), bound) << call->bucket.text();
      }
    }
  }
}

TEST(SdpaPlan, ShapesTheEngineTakes) {
  std::string why;
  EXPECT_TRUE(sdpa_shape_supported(AttentionShape::mha(768, 12), &why)) << why;
  EXPECT_TRUE(sdpa_shape_supported({9, 3, 64}, &why)) << why;
  EXPECT_FALSE(sdpa_shape_supported(AttentionShape::mha(12, 2), &why));  // head_dim 6
  EXPECT_NE(why.find("multiple of 8"), std::string::npos) << why;
  EXPECT_FALSE(sdpa_shape_supported({4, 3, 64}, &why));
}

}  // namespace
}  // namespace kilter::model
