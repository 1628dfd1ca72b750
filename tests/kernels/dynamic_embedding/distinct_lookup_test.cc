#include "kernels/dynamic_embedding/core/distinct_lookup.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace tf_ext {
namespace de {
namespace {

constexpr int kDim = 5;

InitializerSpec Uniform(int64_t seed) {
  InitializerSpec spec;
  spec.kind = InitializerKind::kUniform;
  spec.a = -1.0f;
  spec.b = 1.0f;
  spec.seed = seed;
  return spec;
}

// Two equal tables (ids 0..199 present, exact admission at a count of 2), so that the plain and the
// distinct lookup each start from fresh statistics.
struct TwinTables {
  TwinTables()
      : plain(kDim, Uniform(11), 6, Admission()), distinct(kDim, Uniform(11), 6, Admission()) {
    for (int64_t k = 0; k < 200; ++k) {
      std::vector<float> row(kDim);
      for (int j = 0; j < kDim; ++j) row[j] = 0.25f * static_cast<float>(k) + static_cast<float>(j);
      plain.InsertOrAssign(k, row.data());
      distinct.InsertOrAssign(k, row.data());
    }
  }
  static AdmissionSpec Admission() {
    AdmissionSpec spec;
    spec.min_count = 2;
    spec.exact = true;
    return spec;
  }
  EmbeddingTable<int64_t> plain, distinct;
};

// Splits [0, n) into ranges of one or two items, as a thread pool might.
struct InSmallRanges {
  template <typename Fn>
  void operator()(int64_t n, int64_t /*cost_per_item*/, Fn&& fn) const {
    for (int64_t begin = 0; begin < n; begin += 2) fn(begin, std::min(begin + 2, n));
  }
};

// Ids drawn from few values, present (below 200) and missing (from 1000 on), each repeated.
std::vector<int64_t> RepeatingIds(int64_t n) {
  std::mt19937_64 random(5);
  std::vector<int64_t> ids(n);
  for (int64_t& id : ids) {
    const int64_t pick = static_cast<int64_t>(random() % 40);
    id = pick < 30 ? pick * 3 : 1000 + pick;
  }
  return ids;
}

TEST(DistinctLookupTest, FindsEachDistinctIdOnceWithTheRowsAndStatisticsOfAFindPerId) {
  TwinTables tables;
  const std::vector<int64_t> ids = RepeatingIds(1000);
  const int64_t n = static_cast<int64_t>(ids.size());
  auto id_at = [&](int64_t i) { return ids[i]; };

  std::vector<float> expected(n * kDim);
  tables.plain.FindBatch(n, id_at, expected.data());

  std::vector<int32_t> slots(n);
  const DistinctRows found =
      FindDistinctRows(tables.distinct, n, id_at, slots.data(), /*block=*/7, InSmallRanges());
  const int64_t num_distinct = static_cast<int64_t>(found.keys.size());
  std::vector<float> rows(n * kDim, -9.0f);
  PlaceRows(found.rows.data(), kDim, slots.data(), 0, n / 2, rows.data(), kDim);
  PlaceRows(found.rows.data(), kDim, slots.data(), n / 2, n, rows.data(), kDim);

  EXPECT_EQ(num_distinct, 40);
  EXPECT_EQ(tables.plain.Probes(), n);
  EXPECT_EQ(tables.distinct.Probes(), num_distinct);  // one probe per distinct id
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(found.keys[slots[i]], ids[i]) << "id " << i;
  // Bit-identical rows, missing ids' initial rows included.
  EXPECT_EQ(0, std::memcmp(rows.data(), expected.data(), sizeof(float) * n * kDim));
  // The statistics count every id; a find admits nothing.
  EXPECT_EQ(tables.distinct.Counters().lookups, n);
  EXPECT_EQ(tables.distinct.Counters().lookup_hits, tables.plain.Counters().lookup_hits);
  EXPECT_EQ(tables.distinct.Counters().admitted, 0);
  EXPECT_EQ(tables.distinct.Size(), 200);
}

TEST(DistinctLookupTest, DuplicatesPayForRepeatingBatchesOfNarrowRowsOnly) {
  // Repeating ids (40 values): yes, up to kDuplicateMaxDim floats a row; distinct ids: no; a batch
  // shorter than the sample: no.
  const std::vector<int64_t> repeating = RepeatingIds(4096);
  EXPECT_TRUE(DuplicatesPay(4096, 8, [&](int64_t i) { return repeating[i]; }));
  EXPECT_TRUE(DuplicatesPay(4096, kDuplicateMaxDim, [&](int64_t i) { return repeating[i]; }));
  EXPECT_FALSE(DuplicatesPay(4096, kDuplicateMaxDim + 1, [&](int64_t i) { return repeating[i]; }));
  EXPECT_FALSE(DuplicatesPay(65536, 8, [](int64_t i) { return i * 7919; }));
  EXPECT_FALSE(DuplicatesPay(kDuplicateSample - 1, 8, [](int64_t) { return int64_t{3}; }));
  // Just under and at the share of repeats in the sample (one id in eight repeats the one before).
  auto with_repeats = [](int64_t every) {
    return [every](int64_t i) {
      const int64_t s = i / (4096 / kDuplicateSample);  // the sample position of id i
      return s % every == every - 1 ? s - 1 : s;
    };
  };
  EXPECT_TRUE(DuplicatesPay(4096, 8, with_repeats(kDuplicateShare)));
  EXPECT_FALSE(DuplicatesPay(4096, 8, with_repeats(kDuplicateShare + 1)));
}

}  // namespace
}  // namespace de
}  // namespace tf_ext
