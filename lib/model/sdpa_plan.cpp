// Offsets, buckets and the staging map of the cuDNN SDPA engine's calls (sdpa_plan.h).
#include "lib/model/sdpa_plan.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <utility>

#include "io/base/error.h"

namespace kilter::model {

std::string SdpaBucket::text() const {
  std::string text = "B=" + std::to_string(batch);
  if (seq_q == seq_kv && !bottom_right)
    text += " S=" + std::to_string(seq_q);
  else
    text += " Sq=" + std::to_string(seq_q) + " Skv=" + std::to_string(seq_kv) + (bottom_right ? " bottom-right" : "");
  return text + " rows=" + std::to_string(rows_q) + (rows_kv == rows_q ? "" : "/" + std::to_string(rows_kv));
}

size_t SdpaCall::descriptor_index(int batch, Array array) {
  auto aligned = [](size_t n) { return (n + kSdpaDescriptorAlign - 1) / kSdpaDescriptorAlign * kSdpaDescriptorAlign; };
  const size_t lengths = aligned(static_cast<size_t>(batch)), offsets = aligned(static_cast<size_t>(batch) + 1);
  const int a = static_cast<int>(array);
  return a <= seq_kv_array ? a * lengths : 2 * lengths + (a - q_offsets) * offsets;
}

std::vector<int32_t> SdpaCall::descriptor_block() const {
  const int B = bucket.batch;
  std::vector<int32_t> block(descriptor_ints(B), 0);
  auto put = [&](Array array, const std::vector<int32_t>& values) {
    std::copy(values.begin(), values.end(), block.begin() + static_cast<std::ptrdiff_t>(descriptor_index(B, array)));
  };
  put(seq_q_array, seq_len_q);
  put(seq_kv_array, seq_len_kv);
  put(q_offsets, offset_q);
  put(k_offsets, offset_k);
  put(v_offsets, offset_v);
  put(o_offsets, offset_o);
  put(stats_offsets, offset_stats);
  return block;
}

bool sdpa_shape_supported(const AttentionShape& shape, std::string* why) {
  const int hd = shape.head_dim;
  std::string reason;
  if (shape.n_head <= 0 || shape.n_kv_head <= 0 || shape.n_head % shape.n_kv_head != 0)
    reason = "n_head must be a multiple of n_kv_head";
  else if (hd % 8 != 0)  // 16-byte rows of bf16 per head: the kernels' vector loads and TMA
    reason = "head_dim " + std::to_string(hd) + " is not a multiple of 8";
  else if (hd > 256)
    reason = "head_dim " + std::to_string(hd) + " is above 256";
  if (why != nullptr) *why = reason;
  return reason.empty();
}

int sdpa_bucket(int n, int minimum) {
  int bucket = std::max(minimum, 1);
  while (bucket < n) bucket *= 2;
  return bucket;
}

namespace {

// (B, H, S, D) rows of row_stride elements, head h at column + h * head_dim.
SdpaTensorLayout row_layout(int64_t column, int batch, int heads, int seq, int head_dim, int64_t row_stride) {
  SdpaTensorLayout layout;
  layout.column = column;
  layout.dim = {batch, heads, seq, head_dim};
  layout.stride = {seq * row_stride, head_dim, row_stride, 1};
  return layout;
}

// Element offset of `row` in rows of `stride` elements, checked against cuDNN's int32 offsets.
int32_t element_offset(int64_t row, int64_t stride) {
  const int64_t offset = row * stride;
  KILTER_CHECK(offset <= std::numeric_limits<int32_t>::max(),
               "SDPA attention: element offset " << offset << " does not fit cuDNN's int32 ragged offsets");
  return static_cast<int32_t>(offset);
}

// A call's entries for the pieces of `entries`: their query rows and key rows (first row, count).
struct Entry {
  int piece, q_row, q_len, kv_row, kv_len;
};

void fill_call(SdpaCall& call, const std::vector<Entry>& entries, const AttentionShape& shape, int tokens,
               int key_rows, bool bottom_right, SdpaKeyRows keys) {
  const int hd = shape.head_dim, W = shape.row_width();
  int max_q = 0, max_kv = 0;
  for (const Entry& e : entries) max_q = std::max(max_q, e.q_len), max_kv = std::max(max_kv, e.kv_len);
  const int B = entries.empty() ? 0 : sdpa_bucket(static_cast<int>(entries.size()), 1);
  SdpaBucket& bucket = call.bucket;
  bucket.batch = B;
  bucket.seq_q = entries.empty() ? 0 : sdpa_bucket(max_q, kSdpaMinSeq);
  bucket.seq_kv = entries.empty() ? 0 : sdpa_bucket(max_kv, kSdpaMinSeq);
  bucket.bottom_right = bottom_right;
  call.keys = keys;
  call.entries = static_cast<int>(entries.size());
  call.piece.clear();
  for (const Entry& e : entries) call.piece.push_back(e.piece);
  const int64_t kv_stride = keys == SdpaKeyRows::packed_qkv ? W : shape.kv_width();
  const int64_t k_column = keys == SdpaKeyRows::packed_qkv ? shape.q_width() : 0;
  call.q = row_layout(0, B, shape.n_head, bucket.seq_q, hd, W);
  call.k = row_layout(k_column, B, shape.n_kv_head, bucket.seq_kv, hd, kv_stride);
  call.v = row_layout(k_column + static_cast<int64_t>(shape.n_kv_head) * hd, B, shape.n_kv_head, bucket.seq_kv, hd,
                      kv_stride);
  call.o = row_layout(0, B, shape.n_head, bucket.seq_q, hd, shape.q_width());
  // Stats (B, H, S, 1) packed by rows: row r's heads at r * n_head + h.
  call.stats.column = 0;
  call.stats.dim = {B, shape.n_head, bucket.seq_q, 1};
  call.stats.stride = {static_cast<int64_t>(shape.n_head) * bucket.seq_q, 1, shape.n_head, 1};
  bucket.rows_q = entries.empty() ? 0 : sdpa_bucket(tokens, kSdpaMinSeq);
  bucket.rows_kv = entries.empty() ? 0 : sdpa_bucket(key_rows, kSdpaMinSeq);
  call.seq_len_q.assign(B, 0);
  call.seq_len_kv.assign(B, 0);
  for (auto* offsets : {&call.offset_q, &call.offset_k, &call.offset_v, &call.offset_o, &call.offset_stats})
    offsets->assign(B + 1, 0);
  // Entries past the real ones are empty and start where the last one ends.
  int q_end = 0, kv_end = 0;
  for (int b = 0; b <= B; ++b) {
    const bool real = b < call.entries;
    const int q_row = real ? entries[b].q_row : q_end, kv_row = real ? entries[b].kv_row : kv_end;
    if (b < B) {
      call.seq_len_q[b] = real ? entries[b].q_len : 0;
      call.seq_len_kv[b] = real ? entries[b].kv_len : 0;
    }
    call.offset_q[b] = element_offset(q_row, W);
    call.offset_k[b] = call.offset_v[b] = element_offset(kv_row, kv_stride);
    call.offset_o[b] = element_offset(q_row, shape.q_width());
    call.offset_stats[b] = element_offset(q_row, shape.n_head);
    if (real) q_end = entries[b].q_row + entries[b].q_len, kv_end = entries[b].kv_row + entries[b].kv_len;
  }
}

// B x Sq x Skv of the bucket one call of `entries` would take.
int64_t call_scores(const std::vector<Entry>& entries) {
  int max_q = 0, max_kv = 0;
  for (const Entry& e : entries) max_q = std::max(max_q, e.q_len), max_kv = std::max(max_kv, e.kv_len);
  return int64_t(sdpa_bucket(static_cast<int>(entries.size()), 1)) * sdpa_bucket(max_q, kSdpaMinSeq) *
         sdpa_bucket(max_kv, kSdpaMinSeq);
}

// The calls of one kind of entries (plan_sdpa's rule): one call when it fits the budget, else one
// class per (Sq, Skv) bucket, longest first, cut into calls of at most budget / (Sq x Skv) entries.
std::vector<std::vector<Entry>> split_calls(const std::vector<Entry>& entries, int64_t budget) {
  if (entries.empty()) return {};
  if (budget <= 0 || call_scores(entries) <= budget) return {entries};
  std::map<std::pair<int, int>, std::vector<Entry>, std::greater<>> classes;  // (Sq, Skv) bucket, longest first
  for (const Entry& e : entries)
    classes[{sdpa_bucket(e.kv_len, kSdpaMinSeq), sdpa_bucket(e.q_len, kSdpaMinSeq)}].push_back(e);
  std::vector<std::vector<Entry>> calls;
  for (const auto& [bucket, members] : classes) {
    int64_t cap = 1;  // a power of two: the call's B bucket stays within it
    while (cap * 2 * bucket.first * bucket.second <= budget) cap *= 2;
    for (size_t first = 0; first < members.size(); first += static_cast<size_t>(cap)) {
      const size_t end = std::min(members.size(), first + static_cast<size_t>(cap));
      calls.emplace_back(members.begin() + static_cast<std::ptrdiff_t>(first),
                         members.begin() + static_cast<std::ptrdiff_t>(end));
    }
  }
  return calls;
}

void fill_calls(std::vector<SdpaCall>& calls, const std::vector<Entry>& entries, int64_t budget,
                const AttentionShape& shape, int tokens, int key_rows, bool bottom_right, SdpaKeyRows keys) {
  const std::vector<std::vector<Entry>> split = split_calls(entries, budget);
  calls.resize(split.size());
  for (size_t i = 0; i < split.size(); ++i) fill_call(calls[i], split[i], shape, tokens, key_rows, bottom_right, keys);
}

}  // namespace

std::vector<const SdpaCall*> SdpaPlan::calls() const {
  std::vector<const SdpaCall*> all;
  for (const SdpaCall& call : whole) all.push_back(&call);
  for (const SdpaCall& call : later) all.push_back(&call);
  return all;
}

std::vector<int32_t> SdpaPlan::descriptor_blocks(std::vector<size_t>* offsets) const {
  std::vector<int32_t> blocks;
  offsets->clear();
  for (const SdpaCall* call : calls()) {
    offsets->push_back(blocks.size());
    const std::vector<int32_t> block = call->descriptor_block();
    blocks.insert(blocks.end(), block.begin(), block.end());
  }
  return blocks;
}

int64_t sdpa_score_budget(int tokens, int context) {
  const int longest = std::max(1, std::min(tokens, context));
  const int64_t S = sdpa_bucket(longest, kSdpaMinSeq);
  return int64_t(sdpa_bucket((std::max(tokens, 1) + longest - 1) / longest, 1)) * S * S;
}

uint64_t sdpa_workspace_estimate(const SdpaBucket& bucket, int64_t kv_row_stride, const AttentionShape& shape) {
  if (bucket.batch == 0) return 0;
  auto up64 = [](uint64_t n) { return (n + 63) / 64 * 64; };
  const uint64_t H = uint64_t(shape.n_head), group = uint64_t(shape.n_head / std::max(shape.n_kv_head, 1));
  uint64_t bytes = uint64_t(bucket.batch) * H * up64(uint64_t(bucket.seq_q)) * up64(uint64_t(bucket.seq_kv)) * 2;
  bytes += uint64_t(bucket.rows_q) * H * 4;  // the softmax sums, laid out as the Stats
  if (group > 1) bytes += 2 * uint64_t(bucket.rows_kv) * uint64_t(kv_row_stride) * group * 4;
  return bytes;
}

uint64_t sdpa_workspace_bound(const AttentionShape& shape, int tokens, int context) {
  const int longest = std::max(1, std::min(tokens, context));
  const int64_t budget = sdpa_score_budget(tokens, context), S = sdpa_bucket(longest, kSdpaMinSeq);
  const int rows = sdpa_bucket(std::max(tokens, 1), kSdpaMinSeq);
  // Whole pieces: every call within the budget (a call of one full-context piece is within it).
  SdpaBucket whole{static_cast<int>(budget / (S * S)), static_cast<int>(S), static_cast<int>(S), false, rows, rows};
  // One later part: up to `longest` queries after a prefix, up to `context` keys in all.
  const int keys = sdpa_bucket(std::max(context, 1), kSdpaMinSeq);
  SdpaBucket later{1, static_cast<int>(S), keys, true, rows, keys};
  return std::max(sdpa_workspace_estimate(whole, shape.row_width(), shape),
                  sdpa_workspace_estimate(later, shape.kv_width(), shape));
}

void plan_sdpa(SdpaPlan& plan, const int32_t* cu_seqlens, int pieces, const int32_t* pos_offset,
               const AttentionShape& shape, int64_t score_budget) {
  plan.shape = shape;
  plan.tokens = pieces > 0 ? cu_seqlens[pieces] : 0;
  plan.staging.clear();
  std::vector<Entry> whole, later;
  int staged = 0;
  for (int p = 0; p < pieces; ++p) {
    const int row = cu_seqlens[p], len = cu_seqlens[p + 1] - cu_seqlens[p];
    const int s = pos_offset == nullptr ? 0 : pos_offset[p];
    if (s == 0) {
      whole.push_back({p, row, len, row, len});
      continue;
    }
    later.push_back({p, row, len, staged, s + len});
    plan.staging.push_back({staged, s, p, /*from_prefix=*/true, 0});
    plan.staging.push_back({staged + s, len, p, /*from_prefix=*/false, row});
    staged += s + len;
  }
  plan.staged_rows = staged;
  fill_calls(plan.whole, whole, score_budget, shape, plan.tokens, plan.tokens, /*bottom_right=*/false,
             SdpaKeyRows::packed_qkv);
  fill_calls(plan.later, later, score_budget, shape, plan.tokens, staged, /*bottom_right=*/true, SdpaKeyRows::staged);
}

}  // namespace kilter::model
