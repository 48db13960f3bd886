// The padded attention groups a padded-engine backend (CUDA) runs a packed micro-batch through
// (lib/model/attention_groups.h): every token in exactly one padded row, bounded padding, and,
// on the CPU, the same attention output when computed group-padded as when computed packed.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "io/base/error.h"
#include "lib/model/attention.h"
#include "lib/model/attention_groups.h"
#include "tests/unit/model_testing.h"

namespace kilter::model {
namespace {

std::vector<int32_t> offsets_of(const std::vector<int>& lengths) {
  std::vector<int32_t> cu = {0};
  for (int len : lengths) cu.push_back(cu.back() + len);
  return cu;
}

// Later parts of cut pieces (an offset > 0) are left out: the CUDA backend runs them with their
// prefix on their own. Every other token lands once; theirs never.
TEST(AttentionGroups, LaterPartsOfCutPiecesAreLeftOut) {
  const std::vector<int> lengths = {40, 7, 40, 1, 19};
  const std::vector<int32_t> offset = {0, 30, 0, 0, 100};
  const std::vector<int32_t> cu = offsets_of(lengths);
  AttentionGroups groups;
  groups.build(cu.data(), static_cast<int>(lengths.size()), 256, offset.data());
  std::vector<int> seen(cu.back(), 0);
  for (int32_t token : groups.padded_token)
    if (token >= 0) ++seen[token];
  for (int p = 0; p < static_cast<int>(lengths.size()); ++p)
    for (int i = cu[p]; i < cu[p + 1]; ++i) ASSERT_EQ(seen[i], offset[p] > 0 ? 0 : 1) << "piece " << p << " token " << i;
  EXPECT_EQ(groups.lengths, (std::vector<int32_t>{40, 40, 1}));
}

TEST(AttentionGroups, EveryTokenOnceAndPaddingBounded) {
  const int context = 2048;
  SplitMix64 rng(3);
  std::vector<int> lengths;
  for (int i = 0; i < 300; ++i) lengths.push_back(1 + static_cast<int>(std::exp(rng.normal() * 1.3 + 5.0)) % context);
  lengths.push_back(1);
  lengths.push_back(context);
  const std::vector<int32_t> cu = offsets_of(lengths);
  AttentionGroups groups;
  groups.build(cu.data(), static_cast<int>(lengths.size()), context);
  std::vector<int> seen(cu.back(), 0);
  double packed_work = 0;
  for (int len : lengths) packed_work += double(len) * len;
  size_t row = 0, length_index = 0;
  for (size_t g = 0; g < groups.groups.size(); ++g) {
    const AttentionGroup& group = groups.groups[g];
    if (g > 0) EXPECT_LT(group.T, groups.groups[g - 1].T) << "groups longest first, one per padded length";
    EXPECT_EQ(group.first_row, row);
    EXPECT_EQ(group.first_length, static_cast<int>(length_index));
    for (int b = 0; b < group.B; ++b, ++length_index) {
      const int len = groups.lengths[length_index];
      EXPECT_EQ(attention_padded_length(len, context), group.T);
      EXPECT_LE(group.T, std::max(len, static_cast<int>(std::ceil(1.25 * len))));
      for (int t = 0; t < group.T; ++t, ++row) {
        const int32_t token = groups.padded_token[row];
        if (t < len) {
          ASSERT_GE(token, 0);
          ++seen[token];
          if (t > 0) EXPECT_EQ(token, groups.padded_token[row - 1] + 1) << "a piece's tokens stay in order";
        } else {
          EXPECT_EQ(token, -1);
        }
      }
    }
  }
  EXPECT_EQ(row, groups.padded_rows());
  for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], 1) << "token " << i;
  EXPECT_LE(groups.padded_work(), 1.5625 * packed_work);
  EXPECT_GE(groups.padded_work(), packed_work);
  EXPECT_EQ(attention_padded_length(1, context), 1);
  EXPECT_EQ(attention_padded_length(17, context), 20);
  EXPECT_EQ(attention_padded_length(2000, context), 2048);
  EXPECT_THROW(attention_padded_length(context + 1, context), kilter::Error);
}

// What the CUDA backend does, on the CPU: gather qkv into the groups' padded rows, run each
// padded row as a piece of length T (causal, so the padding after the real tokens cannot reach
// them), scatter back; forward and backward must equal the packed computation.
TEST(AttentionGroups, GroupPaddedAttentionEqualsPackedAttention) {
  const int C = 16, NH = 2, context = 40;
  const std::vector<int> lengths = {40, 1, 17, 5, 33, 19, 2, 40};
  const std::vector<int32_t> cu = offsets_of(lengths);
  const int N = cu.back(), pieces = static_cast<int>(lengths.size());
  const std::vector<float> qkv = testing::random_vector(size_t(N) * 3 * C, 11);
  const std::vector<float> dout = testing::random_vector(size_t(N) * C, 12);
  std::vector<float> out(size_t(N) * C), att(attention_saved_floats(cu.data(), pieces, NH));
  std::vector<float> dqkv(size_t(N) * 3 * C, 0.0f);
  attention_forward(out.data(), att.data(), qkv.data(), cu.data(), pieces, C, NH);
  attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), cu.data(), pieces, C, NH);

  AttentionGroups groups;
  groups.build(cu.data(), pieces, context);
  const size_t P = groups.padded_rows();
  std::vector<float> padded_qkv(P * 3 * C, 0.0f), padded_dout(P * C, 0.0f);
  for (size_t r = 0; r < P; ++r) {
    const int32_t token = groups.padded_token[r];
    if (token < 0) continue;
    for (int c = 0; c < 3 * C; ++c) padded_qkv[r * 3 * C + c] = qkv[size_t(token) * 3 * C + c];
    for (int c = 0; c < C; ++c) padded_dout[r * C + c] = dout[size_t(token) * C + c];
  }
  std::vector<int32_t> padded_cu = {0};
  for (const AttentionGroup& g : groups.groups)
    for (int b = 0; b < g.B; ++b) padded_cu.push_back(padded_cu.back() + g.T);
  const int padded_pieces = static_cast<int>(padded_cu.size()) - 1;
  std::vector<float> padded_out(P * C), padded_att(attention_saved_floats(padded_cu.data(), padded_pieces, NH));
  std::vector<float> padded_dqkv(P * 3 * C, 0.0f);
  attention_forward(padded_out.data(), padded_att.data(), padded_qkv.data(), padded_cu.data(), padded_pieces, C, NH);
  attention_backward(padded_dqkv.data(), padded_dout.data(), padded_qkv.data(), padded_att.data(), padded_cu.data(),
                     padded_pieces, C, NH);
  for (size_t r = 0; r < P; ++r) {
    const int32_t token = groups.padded_token[r];
    if (token < 0) continue;
    for (int c = 0; c < C; ++c) ASSERT_NEAR(padded_out[r * C + c], out[size_t(token) * C + c], 1e-5) << "row " << token;
    for (int c = 0; c < 3 * C; ++c)
      ASSERT_NEAR(padded_dqkv[r * 3 * C + c], dqkv[size_t(token) * 3 * C + c], 1e-5) << "row " << token;
  }
}

}  // namespace
}  // namespace kilter::model
