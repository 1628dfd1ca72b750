#include "kernels/dynamic_embedding/core/embedding_table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kernels/dynamic_embedding/core/optimizers.h"

namespace tf_ext {
namespace de {
namespace {

InitializerSpec Uniform(int64_t seed) {
  InitializerSpec spec;
  spec.kind = InitializerKind::kUniform;
  spec.a = -1.0f;
  spec.b = 1.0f;
  spec.seed = seed;
  return spec;
}

std::vector<float> Row(int dim, float base) {
  std::vector<float> row(dim);
  for (int j = 0; j < dim; ++j) row[j] = base + j;
  return row;
}

TEST(EmbeddingTableTest, MissingKeyReadsInitialValueAndDoesNotInsert) {
  EmbeddingTable<int64_t> table(8, Uniform(7));
  std::vector<float> a(8), b(8);
  EXPECT_FALSE(table.Find(42, a.data()));
  EXPECT_FALSE(table.Find(42, b.data()));
  EXPECT_EQ(a, b);
  EXPECT_EQ(table.Size(), 0);
  for (float v : a) {
    EXPECT_GE(v, -1.0f);
    EXPECT_LT(v, 1.0f);
  }
}

TEST(EmbeddingTableTest, InitialValueDependsOnKeyAndSeedOnly) {
  EmbeddingTable<int64_t> t1(16, Uniform(1)), t2(16, Uniform(1)), t3(16, Uniform(2));
  std::vector<float> r1(16), r2(16), r3(16), other(16);
  t1.Find(5, r1.data());
  t2.Find(5, r2.data());
  t3.Find(5, r3.data());
  t1.Find(6, other.data());
  EXPECT_EQ(r1, r2);
  EXPECT_NE(r1, r3);
  EXPECT_NE(r1, other);
  // Creating the row through an update starts from the same value.
  t2.Upsert(5, [&](RowRef& row, bool created) {
    EXPECT_TRUE(created);
    EXPECT_EQ(std::vector<float>(row.embedding, row.embedding + 16), r1);
  });
}

TEST(EmbeddingTableTest, InitializerDistributions) {
  for (InitializerKind kind : {InitializerKind::kNormal, InitializerKind::kTruncatedNormal}) {
    InitializerSpec spec;
    spec.kind = kind;
    spec.a = 1.0f;
    spec.b = 0.5f;
    spec.seed = 3;
    const int dim = 4096;
    std::vector<float> row(dim);
    double sum = 0, sq = 0, max_dev = 0;
    for (int64_t key = 0; key < 16; ++key) {
      FillInitialRow(spec, InitialRowKeyHash(key), row.data(), dim);
      for (float v : row) {
        sum += v;
        sq += (v - 1.0) * (v - 1.0);
        max_dev = std::max(max_dev, std::fabs(v - 1.0));
      }
    }
    const double n = 16.0 * dim, mean = sum / n, stddev = std::sqrt(sq / n);
    EXPECT_NEAR(mean, 1.0, 0.01);
    if (kind == InitializerKind::kNormal) {
      EXPECT_NEAR(stddev, 0.5, 0.01);
      EXPECT_GT(max_dev, 1.0);
    } else {
      EXPECT_LE(max_dev, 1.0 + 1e-6);  // two standard deviations
      EXPECT_NEAR(stddev, 0.5 * 0.8796, 0.01);
    }
  }
}

TEST(EmbeddingTableTest, InsertFindRemoveExactInt64IncludingExtremes) {
  EmbeddingTable<int64_t> table(4, InitializerSpec());
  const std::vector<int64_t> keys = {
      0,        -1, 1, std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min(),
      1LL << 62};
  for (size_t i = 0; i < keys.size(); ++i) table.InsertOrAssign(keys[i], Row(4, i * 10.0f).data());
  EXPECT_EQ(table.Size(), static_cast<int64_t>(keys.size()));
  std::vector<float> out(4);
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(table.Find(keys[i], out.data()));
    EXPECT_EQ(out, Row(4, i * 10.0f));
  }
  EXPECT_TRUE(table.Remove(-1));
  EXPECT_FALSE(table.Remove(-1));
  EXPECT_FALSE(table.Find(-1, out.data()));
  EXPECT_EQ(out, std::vector<float>(4, 0.0f));
  EXPECT_EQ(table.Size(), static_cast<int64_t>(keys.size()) - 1);
}

TEST(EmbeddingTableTest, StringKeysAreExact) {
  EmbeddingTable<std::string> table(2, InitializerSpec());
  const std::string long_key(100, 'x');
  std::string with_nul("a\0b", 3);
  table.InsertOrAssign("a", Row(2, 1).data());
  table.InsertOrAssign(std::string_view(with_nul), Row(2, 2).data());
  table.InsertOrAssign(long_key, Row(2, 3).data());
  table.InsertOrAssign("", Row(2, 4).data());
  std::vector<float> out(2);
  ASSERT_TRUE(table.Find("a", out.data()));
  EXPECT_EQ(out, Row(2, 1));
  ASSERT_TRUE(table.Find(std::string_view(with_nul), out.data()));
  EXPECT_EQ(out, Row(2, 2));
  EXPECT_FALSE(table.Find(std::string_view("a\0c", 3), out.data()));
  ASSERT_TRUE(table.Find(long_key, out.data()));
  EXPECT_EQ(out, Row(2, 3));
  ASSERT_TRUE(table.Find("", out.data()));
  EXPECT_EQ(out, Row(2, 4));
  EXPECT_EQ(table.Size(), 4);
  EXPECT_TRUE(table.Remove(long_key));
  EXPECT_EQ(table.Size(), 3);
}

TEST(EmbeddingTableTest, ManyKeysMatchAReferenceMapThroughGrowthAndRemoval) {
  EmbeddingTable<int64_t> table(3, InitializerSpec());
  std::map<int64_t, float> reference;
  std::mt19937_64 rng(1);
  for (int step = 0; step < 200000; ++step) {
    const int64_t key = static_cast<int64_t>(rng() % 50000) * 7919 - 100000;
    if (rng() % 3 == 0) {
      EXPECT_EQ(table.Remove(key), reference.erase(key) == 1);
    } else {
      const float value = static_cast<float>(step);
      table.InsertOrAssign(key, std::vector<float>(3, value).data());
      reference[key] = value;
    }
  }
  ASSERT_EQ(table.Size(), static_cast<int64_t>(reference.size()));
  std::vector<float> out(3);
  for (const auto& [key, value] : reference) {
    ASSERT_TRUE(table.Find(key, out.data()));
    EXPECT_EQ(out[2], value);
  }
  int64_t exported = 0;
  table.Export(
      [&](int64_t n) {
        EXPECT_EQ(n, static_cast<int64_t>(reference.size()));
        return true;
      },
      [&](int64_t, const int64_t& key, const RowRef& row) {
        ++exported;
        EXPECT_EQ(row.embedding[0], reference.at(key));
      });
  EXPECT_EQ(exported, static_cast<int64_t>(reference.size()));
}

// FindBatch, both ways (keys in order, and grouped by shard as during a bulk removal): each row
// must land at its key's position, with duplicates and missing keys among them, and every
// present position counts as a hit.
template <typename Key>
void ExpectFindBatchMatchesFind(Key (*make_key)(int64_t)) {
  constexpr int kDim = 5;
  EmbeddingTable<Key> table(kDim, Uniform(11));  // missing keys read distinct initial rows
  for (int64_t k = 0; k < 3000; ++k) table.InsertOrAssign(make_key(k), Row(kDim, k).data());
  std::mt19937_64 rng(2);
  int64_t looked_up = 0;
  // Up to more than a lookup kernel's block (4,096 keys): keys in every shard.
  for (int64_t n : {0, 1, 2, 17, 300, 5000}) {
    std::vector<Key> keys;
    for (int64_t i = 0; i < n; ++i) {
      // Every seventh a repeat of an earlier one; the others half present, half missing.
      keys.push_back(i % 7 == 6 ? keys[rng() % i] : make_key(static_cast<int64_t>(rng() % 6000)));
    }
    int64_t present = 0;
    for (const Key& key : keys) present += table.Contains(key);
    auto key_at = [&](int64_t i) { return typename KeyTraits<Key>::View(keys[i]); };
    std::vector<float> in_order(n * kDim, -7.0f), by_shard(n * kDim, -7.0f), expected(kDim);
    EXPECT_EQ(table.FindBatch(n, key_at, in_order.data()), present) << "n " << n;
    EXPECT_EQ(table.FindBatchByShardForTesting(n, key_at, by_shard.data()), present) << "n " << n;
    // Into a column window of a wider matrix (rows kStride floats apart), both ways.
    constexpr int64_t kStride = kDim + 3;
    std::vector<float> strided(n * kStride, -7.0f), strided_by_shard(n * kStride, -7.0f);
    EXPECT_EQ(table.FindBatch(n, key_at, strided.data(), kStride), present) << "n " << n;
    EXPECT_EQ(table.FindBatchByShardForTesting(n, key_at, strided_by_shard.data(), kStride),
              present)
        << "n " << n;
    for (int64_t i = 0; i < n; ++i) {
      table.Find(keys[i], expected.data());
      const auto row = [&](const std::vector<float>& rows, int64_t stride, int64_t width) {
        return std::vector<float>(rows.begin() + i * stride, rows.begin() + i * stride + width);
      };
      ASSERT_EQ(row(in_order, kDim, kDim), expected) << "n " << n << ", position " << i;
      ASSERT_EQ(row(by_shard, kDim, kDim), expected) << "n " << n << ", position " << i;
      std::vector<float> padded = expected;
      padded.resize(kStride, -7.0f);  // the columns past the row stay untouched
      ASSERT_EQ(row(strided, kStride, kStride), padded) << "n " << n << ", position " << i;
      ASSERT_EQ(row(strided_by_shard, kStride, kStride), padded) << "n " << n << ", position " << i;
    }
    looked_up += 3 * n;  // FindBatch twice and Find; the testing entry point counts none
  }
  EXPECT_EQ(table.Size(), 3000);
  EXPECT_EQ(table.Counters().lookups, looked_up);
}

int64_t SpreadInt64Key(int64_t k) { return k * 7919 - 1000; }
std::string SpreadStringKey(int64_t k) { return "id-" + std::to_string(k); }

TEST(EmbeddingTableTest, FindBatchMatchesFindWithDuplicatesAndMissingKeys) {
  ExpectFindBatchMatchesFind<int64_t>(SpreadInt64Key);
  ExpectFindBatchMatchesFind<std::string>(SpreadStringKey);
}

TEST(EmbeddingTableTest, FindDistinctBatchServesFindBatchRowsAndCountsEveryOccurrence) {
  constexpr int kDim = 4;
  EmbeddingTable<int64_t> table(kDim, Uniform(3));
  for (int64_t k = 0; k < 100; ++k) table.InsertOrAssign(k, Row(kDim, k).data());
  // Present keys 5 and 60, missing 500 and 501 (initial rows), each standing for some lookups.
  const std::vector<int64_t> keys = {5, 500, 60, 501};
  const std::vector<int64_t> occurrences = {3, 2, 1, 4};
  std::vector<float> distinct_rows(keys.size() * kDim), batch_rows(keys.size() * kDim);
  table.FindDistinctBatch(
      static_cast<int64_t>(keys.size()), [&](int64_t k) { return keys[k]; }, occurrences.data(),
      distinct_rows.data());
  EXPECT_EQ(table.Counters().lookups, 10);
  EXPECT_EQ(table.Counters().lookup_hits, 4);  // 3 of key 5 and 1 of key 60
  EXPECT_EQ(
      table.FindBatch(
          static_cast<int64_t>(keys.size()), [&](int64_t k) { return keys[k]; }, batch_rows.data()),
      2);
  EXPECT_EQ(distinct_rows, batch_rows);
  EXPECT_EQ(table.Size(), 100);  // a lookup inserts nothing
}

TEST(EmbeddingTableTest, RemoveBatchRemovesEachPresentKeyOnce) {
  EmbeddingTable<int64_t> table(3, InitializerSpec());
  std::map<int64_t, float> reference;
  for (int64_t k = 0; k < 4000; ++k) {
    table.InsertOrAssign(k * 31, Row(3, k).data());
    reference[k * 31] = k;
  }
  // Every third id of twice the range (present and missing ones), a few of them twice.
  std::vector<int64_t> victims;
  for (int64_t k = 0; k < 8000; k += 3) victims.push_back(k * 31);
  for (int i = 0; i < 50; ++i) victims.push_back(victims[i * 7]);
  std::shuffle(victims.begin(), victims.end(), std::mt19937_64(3));
  int64_t present = 0;
  for (int64_t key : victims) present += reference.erase(key);
  const int64_t n = static_cast<int64_t>(victims.size());
  EXPECT_EQ(table.RemoveBatch(n, [&](int64_t i) { return victims[i]; }), present);
  EXPECT_EQ(table.RemoveBatch(n, [&](int64_t i) { return victims[i]; }), 0);
  EXPECT_EQ(table.RemoveBatch(0, [&](int64_t i) { return victims[i]; }), 0);
  ASSERT_EQ(table.Size(), static_cast<int64_t>(reference.size()));
  std::vector<float> out(3);
  for (int64_t k = 0; k < 4000; ++k) {
    const auto it = reference.find(k * 31);
    ASSERT_EQ(table.Find(k * 31, out.data()), it != reference.end()) << k;
    if (it != reference.end()) {
      EXPECT_EQ(out, Row(3, it->second));
    }
  }
}

TEST(EmbeddingTableTest, RemovedMemoryIsReused) {
  EmbeddingTable<int64_t> table(64, InitializerSpec());
  std::vector<float> row(64, 1.0f);
  for (int64_t k = 0; k < 100000; ++k) table.InsertOrAssign(k, row.data());
  const size_t full = table.BytesInUse();
  for (int round = 0; round < 3; ++round) {
    for (int64_t k = 0; k < 100000; ++k) table.Remove(k + round * 100000);
    EXPECT_EQ(table.Size(), 0);
    for (int64_t k = 0; k < 100000; ++k) table.InsertOrAssign(k + (round + 1) * 100000, row.data());
    EXPECT_LE(table.BytesInUse(), full * 11 / 10);
  }
}

TEST(EmbeddingTableTest, MemoryPerEntryIsCloseToPayload) {
  const int dim = 64;
  EmbeddingTable<int64_t> table(dim, InitializerSpec());
  std::vector<float> row(dim, 1.0f);
  const int64_t n = 1 << 20;
  for (int64_t k = 0; k < n; ++k) table.InsertOrAssign(k * 2654435761LL, row.data());
  const double payload = static_cast<double>(n) * (sizeof(int64_t) + sizeof(float) * dim);
  EXPECT_LE(table.BytesInUse() / payload, 1.25);
}

TEST(EmbeddingTableTest, EnsureSlotsKeepsEmbeddingsAndInitializesSlots) {
  EmbeddingTable<std::string> table(4, InitializerSpec());
  for (int k = 0; k < 1000; ++k) table.InsertOrAssign(std::to_string(k), Row(4, k).data());
  table.EnsureSlots(2, {0.5f, 0.25f});
  EXPECT_EQ(table.num_slots(), 2);
  std::vector<float> out(4);
  for (int k = 0; k < 1000; ++k) {
    ASSERT_TRUE(table.Find(std::to_string(k), out.data()));
    EXPECT_EQ(out, Row(4, k));
    table.Upsert(std::to_string(k), [&](RowRef& row, bool created) {
      EXPECT_FALSE(created);
      EXPECT_EQ(row.slots[0], 0.5f);
      EXPECT_EQ(row.slots[7], 0.25f);
    });
  }
  table.Upsert("new", [&](RowRef& row, bool created) {
    EXPECT_TRUE(created);
    EXPECT_EQ(row.slots[3], 0.5f);
    EXPECT_EQ(row.slots[4], 0.25f);
  });
}

TEST(EmbeddingTableTest, SwapContentsReplacesEverything) {
  EmbeddingTable<int64_t> a(2, InitializerSpec()), b(2, InitializerSpec());
  a.InsertOrAssign(1, Row(2, 1).data());
  b.EnsureSlots(1, {3.0f});
  b.InsertOrAssign(2, Row(2, 2).data());
  b.InsertOrAssign(3, Row(2, 3).data());
  a.SwapContents(b);
  EXPECT_EQ(a.Size(), 2);
  EXPECT_EQ(b.Size(), 1);
  EXPECT_EQ(a.num_slots(), 1);
  EXPECT_TRUE(a.Contains(2));
  EXPECT_FALSE(a.Contains(1));
  EXPECT_TRUE(b.Contains(1));
}

TEST(OptimizerTest, AdamUsesRowUpdateCountForBiasCorrection) {
  OptimizerParams p;
  p.kind = OptimizerKind::kAdam;
  p.learning_rate = 0.1f;
  p.epsilon = 1e-8f;
  float emb[1] = {1.0f}, slots[2] = {0.0f, 0.0f}, grad[1] = {2.0f};
  ApplyGradient(p, 0, grad, 1, emb, slots);
  // First step: m_hat = g, v_hat = g^2, so the step is lr * sign(g).
  EXPECT_NEAR(emb[0], 0.9f, 1e-6);
  EXPECT_NEAR(slots[0], 0.2f, 1e-6);
  EXPECT_NEAR(slots[1], 0.004f, 1e-7);
}

TEST(OptimizerTest, AdagradEpsilonPlacement) {
  OptimizerParams p;
  p.kind = OptimizerKind::kAdagrad;
  p.learning_rate = 1.0f;
  p.epsilon = 1.0f;
  float emb[1] = {0.0f}, acc[1] = {3.0f}, grad[1] = {1.0f};
  ApplyGradient(p, 0, grad, 1, emb, acc);  // 1 / (sqrt(4) + 1)
  EXPECT_NEAR(emb[0], -1.0f / 3.0f, 1e-6);
  p.epsilon_inside_sqrt = true;
  emb[0] = 0.0f;
  acc[0] = 3.0f;
  ApplyGradient(p, 0, grad, 1, emb, acc);  // 1 / sqrt(4 + 1)
  EXPECT_NEAR(emb[0], -1.0f / std::sqrt(5.0f), 1e-6);
}

}  // namespace
}  // namespace de
}  // namespace tf_ext
