// The combiner arithmetic of the fused embedding ops: forward combination, the per-key sums of
// the gradients, and the order of distinct keys, against hand-computed values.
#include "kernels/dynamic_embedding/core/combiners.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

namespace tf_ext {
namespace de {
namespace {

TEST(CombinersTest, ParsesTheFourNames) {
  Combiner c;
  EXPECT_TRUE(ParseCombiner("none", &c) && c == Combiner::kNone);
  EXPECT_TRUE(ParseCombiner("sum", &c) && c == Combiner::kSum);
  EXPECT_TRUE(ParseCombiner("mean", &c) && c == Combiner::kMean);
  EXPECT_TRUE(ParseCombiner("sqrtn", &c) && c == Combiner::kSqrtn);
  EXPECT_FALSE(ParseCombiner("max", &c));
}

// Rows [1,2], [3,4], [5,6] in segments 0, 0, 2 of 3 (segment 1 empty).
const std::vector<float> kRows = {1, 2, 3, 4, 5, 6};
const std::vector<int64_t> kSegments = {0, 0, 2};

std::vector<float> Combined(Combiner combiner) {
  std::vector<float> out(6, -1.0f);
  CombineRows(combiner, kRows.data(), kSegments.data(), 3, 3, 2, out.data());
  return out;
}

TEST(CombinersTest, CombinesBySegmentAndLeavesEmptySegmentsZero) {
  EXPECT_EQ(Combined(Combiner::kSum), (std::vector<float>{4, 6, 0, 0, 5, 6}));
  EXPECT_EQ(Combined(Combiner::kMean), (std::vector<float>{2, 3, 0, 0, 5, 6}));
  const float root2 = std::sqrt(2.0f);
  EXPECT_EQ(Combined(Combiner::kSqrtn), (std::vector<float>{4 / root2, 6 / root2, 0, 0, 5, 6}));
}

TEST(CombinersTest, NegativeSegmentIdsDropTheirRows) {
  const std::vector<int64_t> segments = {0, -1, 0};
  std::vector<float> out(2);
  CombineRows(Combiner::kMean, kRows.data(), segments.data(), 3, 1, 2, out.data());
  EXPECT_EQ(out, (std::vector<float>{3, 4}));  // (1+5)/2, (2+6)/2
}

// The fused lookup combines blocks of found rows into a column window of a concatenation: the
// same values as CombineRows, with the columns around the window untouched.
TEST(CombinersTest, BlockwiseIntoAWindowEqualsCombineRows) {
  for (Combiner combiner : {Combiner::kSum, Combiner::kMean, Combiner::kSqrtn}) {
    const std::vector<int64_t> segments = {0, 2, 0, -1, 2, 2, 1};
    std::vector<float> rows(7 * 2);
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = 0.1f * static_cast<float>(i * i % 13);
    std::vector<float> expected(3 * 2);
    CombineRows(combiner, rows.data(), segments.data(), 7, 3, 2, expected.data());
    constexpr int64_t kStride = 5, kColumn = 1;  // window: columns 1-2 of a [3, 5] matrix
    std::vector<float> matrix(3 * kStride, -1.0f);
    float* window = matrix.data() + kColumn;
    ZeroSegments(3, 2, window, kStride);
    for (int64_t block = 0; block < 7; block += 3) {  // blocks of 3, 3 and 1 rows
      const int64_t count = std::min<int64_t>(3, 7 - block);
      AddRowsToSegments(rows.data() + block * 2, segments.data() + block, count, 2, window,
                        kStride);
    }
    DivideSegments(combiner, segments.data(), 7, 3, 2, window, kStride);
    for (int64_t s = 0; s < 3; ++s) {
      for (int64_t c = 0; c < kStride; ++c) {
        const float value = matrix[s * kStride + c];
        if (c >= kColumn && c < kColumn + 2) {
          EXPECT_EQ(value, expected[s * 2 + c - kColumn]) << "segment " << s << ", column " << c;
        } else {
          EXPECT_EQ(value, -1.0f) << "segment " << s << ", column " << c;
        }
      }
    }
  }
}

// The fused apply's steps for one field: IndexDistinctKeys, then AddGradientsBySlot onto zeros.
template <typename Key, typename KeyAt>
void SumGradientsByDistinctKey(Combiner combiner, const float* output_gradients,
                               int64_t gradient_stride, const int64_t* segment_ids, int64_t n,
                               int64_t num_segments, int dim, KeyAt&& key_at,
                               std::vector<Key>* distinct, std::vector<float>* sums) {
  std::vector<int64_t> slots(static_cast<size_t>(n));
  IndexDistinctKeys(n, key_at, distinct, slots.data());
  sums->assign(distinct->size() * dim, 0.0f);
  AddGradientsBySlot(combiner, output_gradients, gradient_stride, segment_ids, n, num_segments, dim,
                     slots.data(), sums);
}

TEST(CombinersTest, SumsGradientsPerDistinctKeyInFirstOccurrenceOrder) {
  // Keys 7, 3, 7 in segments 0, 0, 1 of 2; mean: segment 0 has 2 ids, segment 1 one.
  const std::vector<int64_t> keys = {7, 3, 7};
  const std::vector<int64_t> segments = {0, 0, 1};
  const std::vector<float> output_gradients = {2, 4, 10, 20};  // [2 segments, dim 2]
  std::vector<int64_t> distinct;
  std::vector<float> sums;
  SumGradientsByDistinctKey<int64_t>(
      Combiner::kMean, output_gradients.data(), 2, segments.data(), 3, 2, 2,
      [&](int64_t i) { return keys[i]; }, &distinct, &sums);
  EXPECT_EQ(distinct, (std::vector<int64_t>{7, 3}));
  // key 7: [2,4]/2 + [10,20]/1; key 3: [2,4]/2.
  EXPECT_EQ(sums, (std::vector<float>{11, 22, 1, 2}));
}

TEST(CombinersTest, NoneTakesOneGradientRowPerKey) {
  const std::vector<std::string> keys = {"b", "a", "b"};
  const std::vector<float> output_gradients = {1, 2, 3, 4, 5, 6};
  std::vector<std::string_view> distinct;
  std::vector<float> sums;
  SumGradientsByDistinctKey<std::string_view>(
      Combiner::kNone, output_gradients.data(), 2, nullptr, 3, 0, 2,
      [&](int64_t i) { return std::string_view(keys[i]); }, &distinct, &sums);
  EXPECT_EQ(distinct, (std::vector<std::string_view>{"b", "a"}));
  EXPECT_EQ(sums, (std::vector<float>{6, 8, 3, 4}));
}

TEST(CombinersTest, GradientsReadFromAColumnWindowEqualTheContiguousOnes) {
  // Keys with repeats in 5 segments; the output gradient [5, dim 3] once contiguous, once as
  // columns 2-4 of a [5, 7] matrix whose other columns must not be read.
  const std::vector<int64_t> keys = {4, 9, 4, 4, 2, 9, 7};
  const std::vector<int64_t> segments = {0, 0, 1, 2, 2, 3, 4};
  constexpr int kDim = 3, kWidth = 7, kColumn = 2;
  std::vector<float> contiguous(5 * kDim), window(5 * kWidth, 1e30f);
  for (int r = 0; r < 5; ++r) {
    for (int d = 0; d < kDim; ++d) {
      contiguous[r * kDim + d] = window[r * kWidth + kColumn + d] = 0.25f * r - 0.5f * d + 1.0f;
    }
  }
  for (Combiner combiner : {Combiner::kSum, Combiner::kMean, Combiner::kSqrtn}) {
    std::vector<int64_t> distinct, distinct_from_window;
    std::vector<float> sums, sums_from_window;
    SumGradientsByDistinctKey<int64_t>(
        combiner, contiguous.data(), kDim, segments.data(), 7, 5, kDim,
        [&](int64_t i) { return keys[i]; }, &distinct, &sums);
    SumGradientsByDistinctKey<int64_t>(
        combiner, window.data() + kColumn, kWidth, segments.data(), 7, 5, kDim,
        [&](int64_t i) { return keys[i]; }, &distinct_from_window, &sums_from_window);
    EXPECT_EQ(distinct, (std::vector<int64_t>{4, 9, 2, 7}));
    EXPECT_EQ(distinct_from_window, distinct);
    EXPECT_EQ(sums_from_window, sums);
  }
  // kNone: one gradient row per key, 7 rows of the window.
  std::vector<float> rows(7 * kDim), rows_window(7 * kWidth, 1e30f);
  for (int r = 0; r < 7; ++r) {
    for (int d = 0; d < kDim; ++d) rows[r * kDim + d] = rows_window[r * kWidth + d] = r + 0.5f * d;
  }
  std::vector<int64_t> distinct, distinct_from_window;
  std::vector<float> sums, sums_from_window;
  SumGradientsByDistinctKey<int64_t>(
      Combiner::kNone, rows.data(), kDim, nullptr, 7, 0, kDim, [&](int64_t i) { return keys[i]; },
      &distinct, &sums);
  SumGradientsByDistinctKey<int64_t>(
      Combiner::kNone, rows_window.data(), kWidth, nullptr, 7, 0, kDim,
      [&](int64_t i) { return keys[i]; }, &distinct_from_window, &sums_from_window);
  EXPECT_EQ(sums_from_window, sums);
  // key 4: rows 0, 2, 3.
  EXPECT_EQ(std::vector<float>(sums.begin(), sums.begin() + kDim), (std::vector<float>{5, 6.5, 8}));
}

TEST(CombinersTest, DistinctKeysFollowFromTheirSlotsAndBadSlotsAreNamed) {
  const std::vector<int64_t> keys = {5, 7, 5, 9, 7};
  auto key_at = [&](int64_t i) { return keys[i]; };
  std::vector<int64_t> distinct;
  std::vector<int32_t> slots(keys.size());
  IndexDistinctKeys(5, key_at, &distinct, slots.data());
  EXPECT_EQ(distinct, (std::vector<int64_t>{5, 7, 9}));
  EXPECT_EQ(slots, (std::vector<int32_t>{0, 1, 0, 2, 1}));
  std::vector<int64_t> from_slots;
  std::string error;
  ASSERT_TRUE(DistinctKeysOfSlots(5, key_at, slots.data(), &from_slots, &error)) << error;
  EXPECT_EQ(from_slots, distinct);
  for (const auto& [bad, message] : std::vector<std::pair<std::vector<int32_t>, std::string>>{
           {{0, 2, 0, 1, 2}, "slot 2 of id 1 is out of order"},
           {{0, 1, 1, 2, 1}, "slot 1 of id 2 belongs to another id"},
           {{-1, 0, 0, 1, 0}, "slot -1 of id 0 is out of order"}}) {
    EXPECT_FALSE(DistinctKeysOfSlots(5, key_at, bad.data(), &from_slots, &error));
    EXPECT_EQ(error, message);
  }
}

// Several lookups of one table make one update: merging their distinct keys must give the
// distinct keys (and positions) of their concatenation, and summing their gradients part by part
// the sums of the concatenation's.
template <typename Key>
void ExpectMergeEqualsConcatenation(const std::vector<std::vector<Key>>& parts) {
  std::vector<Key> concatenated;
  for (const auto& part : parts) concatenated.insert(concatenated.end(), part.begin(), part.end());
  std::vector<Key> expected;
  std::vector<int64_t> expected_slots(concatenated.size());
  IndexDistinctKeys(
      static_cast<int64_t>(concatenated.size()), [&](int64_t i) { return concatenated[i]; },
      &expected, expected_slots.data());
  std::vector<std::vector<Key>> part_distinct(parts.size());
  std::vector<std::vector<int64_t>> part_slots(parts.size());
  std::vector<const std::vector<Key>*> distinct_parts;
  for (size_t k = 0; k < parts.size(); ++k) {
    part_slots[k].resize(parts[k].size());
    IndexDistinctKeys(
        static_cast<int64_t>(parts[k].size()), [&](int64_t i) { return parts[k][i]; },
        &part_distinct[k], part_slots[k].data());
    distinct_parts.push_back(&part_distinct[k]);
  }
  std::vector<Key> merged;
  std::vector<std::vector<int64_t>> to_merged;
  MergeDistinctKeys(distinct_parts, &merged, &to_merged);
  EXPECT_EQ(merged, expected);
  // Gradient row i of the concatenation (one row per key, kNone) is {i, -i}.
  const int dim = 2;
  std::vector<float> expected_sums(expected.size() * dim, 0.0f), sums(merged.size() * dim, 0.0f);
  std::vector<float> rows;
  for (size_t i = 0; i < concatenated.size(); ++i) {
    rows.insert(rows.end(), {static_cast<float>(i), -static_cast<float>(i)});
  }
  AddGradientsBySlot(Combiner::kNone, rows.data(), dim, nullptr,
                     static_cast<int64_t>(concatenated.size()), 0, dim, expected_slots.data(),
                     &expected_sums);
  size_t offset = 0;
  for (size_t k = 0; k < parts.size(); ++k) {
    std::vector<int64_t> slots;
    for (int64_t local : part_slots[k]) slots.push_back(to_merged[k][local]);
    AddGradientsBySlot(Combiner::kNone, rows.data() + offset * dim, dim, nullptr,
                       static_cast<int64_t>(parts[k].size()), 0, dim, slots.data(), &sums);
    offset += parts[k].size();
  }
  EXPECT_EQ(sums, expected_sums);
}

TEST(CombinersTest, MergedDistinctKeysOfPartsAreThoseOfTheirConcatenation) {
  ExpectMergeEqualsConcatenation<int64_t>({{5, 7, 5}, {7, 9, 9, 5}, {}, {1}});
  ExpectMergeEqualsConcatenation<int64_t>({{3}});
  const std::string a = "a", b = "bb", c = "ccc";
  ExpectMergeEqualsConcatenation<std::string_view>({{b, a}, {a, c, b}});
}

TEST(CombinersTest, ManyDistinctIntKeysKeepTheirOrder) {
  const int64_t n = 10000;
  std::vector<int64_t> keys(n);
  for (int64_t i = 0; i < n; ++i) keys[i] = (i * 7919) % 5003 - 2500;  // repeats, negatives
  std::vector<float> gradients(n, 1.0f);
  std::vector<int64_t> distinct;
  std::vector<float> sums;
  SumGradientsByDistinctKey<int64_t>(
      Combiner::kNone, gradients.data(), 1, nullptr, n, 0, 1, [&](int64_t i) { return keys[i]; },
      &distinct, &sums);
  ASSERT_EQ(distinct.size(), 5003u);
  float total = 0;
  for (size_t k = 0; k < distinct.size(); ++k) {
    EXPECT_EQ(distinct[k], keys[k]);  // the first 5003 keys are all distinct
    total += sums[k];
  }
  EXPECT_EQ(total, static_cast<float>(n));
}

}  // namespace
}  // namespace de
}  // namespace tf_ext
