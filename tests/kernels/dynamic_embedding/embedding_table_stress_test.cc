// Concurrent lookup / insert / update / remove on one table. Invariants checked:
//  - no torn rows: writers always write a row whose elements are all equal, readers must
//    never see a row with differing elements;
//  - nothing lost or invented: each writer owns a key range and keeps a reference map;
//    after the threads join, the table equals the union of the maps.
#include <gtest/gtest.h>

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
        } else {
          // Read-modify-write under the entry lock, as the optimizer kernels do.
          table.Upsert(key, [&](RowRef& row, bool) {
            const float value = row.embedding[0] + 1.0f;
            for (int j = 0; j < kDim; ++j) row.embedding[j] = value;
            ++*row.update_count;
            mine[k] = value;
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

TEST(EmbeddingTableStressTest, Int64Keys) { RunStress<int64_t>(); }
TEST(EmbeddingTableStressTest, StringKeys) { RunStress<std::string>(); }

}  // namespace
}  // namespace de
}  // namespace tf_ext
