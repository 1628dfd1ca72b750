// Concurrent lookup / insert / update / remove on one table. Invariants checked:
//  - no torn rows: writers always write a row whose elements are all equal, readers must
//    never see a row with differing elements;
//  - nothing lost or invented: each writer owns a key range and keeps a reference map;
//    after the threads join, the table equals the union of the maps.
// Then lookups while a writer evicts and removes rows (RunLookupsDuringEviction).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/dynamic_embedding/core/embedding_table.h"

namespace tf_ext {
namespace de {
namespace {

constexpr int kDim = 16;
constexpr int kWriters = 4;
constexpr int kReaders = 4;
constexpr int64_t kKeysPerWriter = 5000;

template <typename Key>
Key MakeKey(int64_t k);
template <>
int64_t MakeKey<int64_t>(int64_t k) {
  return k * 1000003;
}
template <>
std::string MakeKey<std::string>(int64_t k) {
  return "user-" + std::to_string(k) + "-suffix-long-enough";
}

template <typename Key>
void RunStress() {
  EmbeddingTable<Key> table(kDim, InitializerSpec());  // missing rows read as all zeros
  std::atomic<bool> stop{false};
  std::atomic<int64_t> torn{0}, reads{0};
  std::vector<std::map<int64_t, float>> expected(kWriters);

  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([&, w] {
      std::mt19937_64 rng(w);
      auto& mine = expected[w];
      for (int op = 0; op < 60000; ++op) {
        const int64_t k = w * kKeysPerWriter + static_cast<int64_t>(rng() % kKeysPerWriter);
        const Key key = MakeKey<Key>(k);
        const int choice = static_cast<int>(rng() % 10);
        if (choice < 2) {
          table.Remove(key);
          mine.erase(k);
        } else if (choice < 6) {
          const float value = static_cast<float>(op + 1);
          table.InsertOrAssign(key, std::vector<float>(kDim, value).data());
          mine[k] = value;
        } else if (choice < 8) {
          // Read-modify-write under the entry lock.
          table.Upsert(key, [&](RowRef& row, bool) {
            const float value = row.embedding[0] + 1.0f;
            for (int j = 0; j < kDim; ++j) row.embedding[j] = value;
            ++*row.update_count;
            mine[k] = value;
          });
        } else {
          // A batch of training updates across shards, as the optimizer kernel runs them; a key
          // may come twice and is then updated twice.
          int64_t batch[4];
          for (auto& b : batch)
            b = w * kKeysPerWriter + static_cast<int64_t>(rng() % kKeysPerWriter);
          std::vector<Key> keys;
          for (int64_t b : batch) keys.push_back(MakeKey<Key>(b));
          table.UpdateBatch(
              4, [&](int64_t i) { return typename KeyTraits<Key>::View(keys[i]); }, op,
              [&](int64_t i, RowRef& row) {
                const float value = row.embedding[0] + 1.0f;
                for (int j = 0; j < kDim; ++j) row.embedding[j] = value;
                mine[batch[i]] = value;
              });
        }
        if (op == 30000) table.EnsureSlots(1, {0.0f});  // a layout change mid-flight
      }
    });
  }
  for (int r = 0; r < kReaders; ++r) {
    threads.emplace_back([&, r] {
      std::mt19937_64 rng(100 + r);
      // Half the readers use the per-key Find, half the batched FindBatch of the lookup kernel.
      constexpr int kBatch = 64;
      std::vector<float> rows(kDim * kBatch);
      std::vector<Key> keys(kBatch);
      while (!stop.load()) {
        if (r % 2 == 0) {
          const int64_t k = static_cast<int64_t>(rng() % (kWriters * kKeysPerWriter));
          table.Find(MakeKey<Key>(k), rows.data());
        } else {
          for (auto& key : keys)
            key = MakeKey<Key>(static_cast<int64_t>(rng() % (kWriters * kKeysPerWriter)));
          table.FindBatch(
              kBatch, [&](int64_t i) { return typename KeyTraits<Key>::View(keys[i]); },
              rows.data());
        }
        const int rows_read = r % 2 == 0 ? 1 : kBatch;
        for (int b = 0; b < rows_read; ++b) {
          for (int j = 1; j < kDim; ++j) {
            if (rows[b * kDim + j] != rows[b * kDim]) {
              torn.fetch_add(1);
              break;
            }
          }
        }
        reads.fetch_add(rows_read, std::memory_order_relaxed);
      }
    });
  }
  for (int w = 0; w < kWriters; ++w) threads[w].join();
  stop.store(true);
  for (size_t t = kWriters; t < threads.size(); ++t) threads[t].join();

  EXPECT_EQ(torn.load(), 0);
  EXPECT_GT(reads.load(), 0);
  int64_t total = 0;
  std::vector<float> row(kDim);
  for (int w = 0; w < kWriters; ++w) {
    total += static_cast<int64_t>(expected[w].size());
    for (int64_t k = w * kKeysPerWriter; k < (w + 1) * kKeysPerWriter; ++k) {
      const auto it = expected[w].find(k);
      const bool found = table.Find(MakeKey<Key>(k), row.data());
      ASSERT_EQ(found, it != expected[w].end()) << "key " << k;
      if (found) {
        ASSERT_EQ(row[kDim - 1], it->second) << "key " << k;
      }
    }
  }
  EXPECT_EQ(table.Size(), total);
  int64_t exported = 0;
  table.Export(
      [&](int64_t n) {
        EXPECT_EQ(n, total);
        return true;
      },
      [&](int64_t, const Key&, const RowRef&) { ++exported; });
  EXPECT_EQ(exported, total);
}

// Lookups while a writer evicts and removes rows, in every way the table has: a key nobody
// removes must always be found with its row, a removed one read either its row or its initial
// row (zeros), and the hit count must lie between the two.
template <typename Key>
void RunLookupsDuringEviction() {
  constexpr int64_t kStable = 10000, kChurn = 10000, kRounds = 8;
  constexpr int kBatch = 512;
  EmbeddingTable<Key> table(kDim, InitializerSpec());  // missing rows read as all zeros
  auto value_of = [](int64_t k) { return static_cast<float>(k + 1); };
  auto train = [&](int64_t k, int64_t step) {
    table.UpdateRow(MakeKey<Key>(k), step, [&](RowRef& row) {
      std::fill(row.embedding, row.embedding + kDim, value_of(k));
    });
  };
  for (int64_t k = 0; k < kStable; ++k) train(k, 1000);  // later than any churn step
  std::atomic<bool> stop{false};
  std::atomic<int64_t> wrong{0}, batches{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&, r] {
      std::mt19937_64 rng(r);
      std::vector<int64_t> ids(kBatch);
      std::vector<Key> keys(kBatch);
      std::vector<float> rows(kBatch * kDim);
      while (!stop.load()) {
        int64_t stable = 0;
        for (int b = 0; b < kBatch; ++b) {
          ids[b] = b % 8 == 7 ? ids[b - 1] : static_cast<int64_t>(rng() % (kStable + kChurn));
          keys[b] = MakeKey<Key>(ids[b]);
          stable += ids[b] < kStable;
        }
        const int64_t hits = table.FindBatch(
            kBatch, [&](int64_t i) { return typename KeyTraits<Key>::View(keys[i]); }, rows.data());
        if (hits < stable || hits > kBatch) wrong.fetch_add(1);
        for (int b = 0; b < kBatch; ++b) {
          const float first = rows[b * kDim];
          bool ok = first == value_of(ids[b]) || (ids[b] >= kStable && first == 0.0f);
          for (int j = 1; j < kDim; ++j) ok = ok && rows[b * kDim + j] == first;
          if (!ok) wrong.fetch_add(1);
        }
        batches.fetch_add(1);
      }
    });
  }
  while (batches.load() == 0) std::this_thread::yield();
  std::vector<Key> churn;
  for (int64_t k = kStable; k < kStable + kChurn; ++k) churn.push_back(MakeKey<Key>(k));
  for (int64_t round = 0; round < kRounds; ++round) {
    for (int64_t k = kStable; k < kStable + kChurn; ++k) train(k, round);
    EvictionCriteria criteria;
    int64_t removed = 0;
    switch (round % 4) {
      case 0:  // by TTL: the churn rows are idle for 1000 - round steps at now_step 1000
        criteria.now_step = 1000;
        criteria.ttl_steps = 100;
        removed = table.Evict(criteria);
        break;
      case 1:  // least recently updated first
        criteria.max_size = kStable;
        removed = table.Evict(criteria);
        break;
      case 2:
        removed = table.RemoveBatch(
            kChurn, [&](int64_t i) { return typename KeyTraits<Key>::View(churn[i]); });
        break;
      default:
        for (const Key& key : churn) removed += table.Remove(key);
    }
    EXPECT_EQ(removed, kChurn) << "round " << round;
    EXPECT_EQ(table.Size(), kStable) << "round " << round;
  }
  const int64_t during = batches.load();
  stop.store(true);
  for (auto& reader : readers) reader.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(during, 1);
  std::vector<float> row(kDim);
  for (int64_t k = 0; k < kStable + kChurn; ++k) {
    ASSERT_EQ(table.Find(MakeKey<Key>(k), row.data()), k < kStable) << "key " << k;
  }
}

TEST(EmbeddingTableStressTest, LookupsDuringEvictionInt64Keys) {
  RunLookupsDuringEviction<int64_t>();
}
TEST(EmbeddingTableStressTest, LookupsDuringEvictionStringKeys) {
  RunLookupsDuringEviction<std::string>();
}

TEST(EmbeddingTableStressTest, Int64Keys) { RunStress<int64_t>(); }
TEST(EmbeddingTableStressTest, StringKeys) { RunStress<std::string>(); }

}  // namespace
}  // namespace de
}  // namespace tf_ext
