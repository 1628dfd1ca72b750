// Bulk inserts (UpsertBatch, InsertOrAssignBatch): the same rows as inserting key by key, and a
// shard's lock held for short batches only, so that a lookup waiting for it gets in between them.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "kernels/dynamic_embedding/core/embedding_table.h"

namespace tf_ext {
namespace de {
namespace {

constexpr int kDim = 4;

InitializerSpec Uniform() {
  InitializerSpec spec;
  spec.kind = InitializerKind::kUniform;
  spec.a = -1.0f;
  spec.b = 1.0f;
  spec.seed = 3;
  return spec;
}

// Everything Export gives per key: the row, the slots, the update count and the last step.
template <typename Key>
std::map<Key, std::tuple<std::vector<float>, std::vector<float>, uint32_t, int64_t>> Contents(
    const EmbeddingTable<Key>& table) {
  std::map<Key, std::tuple<std::vector<float>, std::vector<float>, uint32_t, int64_t>> contents;
  const int dim = table.dim(), slots = table.num_slots();
  table.Export([](int64_t) { return true; },
               [&](int64_t, const Key& key, const RowRef& row) {
                 contents[key] = {std::vector<float>(row.embedding, row.embedding + dim),
                                  std::vector<float>(row.slots, row.slots + slots * dim),
                                  *row.update_count, *row.last_step};
               });
  return contents;
}

template <typename Key>
Key MakeKey(int64_t id) {
  if constexpr (std::is_same_v<Key, std::string>) {
    return "id-" + std::to_string(id) + std::string(id % 3 * 10, 'x');  // some on the heap
  } else {
    return id;
  }
}

// A table with trained rows (slots, counts, steps), then the same keys, new ones and duplicates
// inserted key by key into one copy and as a batch into the other: equal contents, and the same
// rows in the next delta snapshot.
template <typename Key>
void ExpectBatchEqualsKeyByKey() {
  EmbeddingTable<Key> by_key(kDim, Uniform()), batched(kDim, Uniform());
  std::vector<float> slot_init = {0.5f};
  int64_t base = 0;
  for (auto* table : {&by_key, &batched}) {
    table->EnsureSlots(1, slot_init);
    for (int64_t id = 0; id < 3000; ++id) {
      table->UpdateRow(MakeKey<Key>(id), 7 + id % 5, [&](RowRef& row) {
        for (int j = 0; j < kDim; ++j) row.slots[j] = static_cast<float>(id + j);
      });
    }
    // Deltas from here on: both tables track the insert's changes.
    base = table->Snapshot(
        EmbeddingTable<Key>::kFullSnapshot, [](int64_t, int64_t) { return true; },
        [](const Key&, const RowRef&) { return true; }, [](const Key&) { return true; });
  }
  std::mt19937_64 rng(11);
  std::vector<Key> keys;
  for (int i = 0; i < 5000; ++i) keys.push_back(MakeKey<Key>(rng() % 6000));  // duplicates too
  std::vector<float> rows(keys.size() * kDim);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<float>(i);
  for (size_t i = 0; i < keys.size(); ++i) by_key.InsertOrAssign(keys[i], rows.data() + i * kDim);
  batched.InsertOrAssignBatch(
      static_cast<int64_t>(keys.size()),
      [&](int64_t i) { return typename EmbeddingTable<Key>::KeyView(keys[i]); }, rows.data());
  EXPECT_EQ(Contents(batched), Contents(by_key));
  EXPECT_EQ(batched.Size(), by_key.Size());
  auto delta = [&](EmbeddingTable<Key>& table) {
    std::map<Key, std::vector<float>> changed;
    table.Snapshot(
        base, [](int64_t, int64_t) { return true; },
        [&](const Key& key, const RowRef& row) {
          changed[key].assign(row.embedding, row.embedding + kDim);
          return true;
        },
        [](const Key&) { return true; });
    return changed;
  };
  EXPECT_EQ(delta(batched), delta(by_key));
}

TEST(BulkInsertTest, BatchEqualsKeyByKeyInt64Keys) { ExpectBatchEqualsKeyByKey<int64_t>(); }
TEST(BulkInsertTest, BatchEqualsKeyByKeyStringKeys) { ExpectBatchEqualsKeyByKey<std::string>(); }

TEST(BulkInsertTest, UpsertBatchCountsCreatedKeys) {
  EmbeddingTable<int64_t> table(kDim, Uniform());
  std::vector<int64_t> keys = {5, 6, 5, 7, 6};
  int calls = 0;
  EXPECT_EQ(table.UpsertBatch(
                5, [&](int64_t i) { return keys[i]; }, [&](int64_t, RowRef&, bool) { ++calls; }),
            3);
  EXPECT_EQ(calls, 5);
  EXPECT_EQ(table.UpsertBatch(
                0, [&](int64_t i) { return keys[i]; }, [](int64_t, RowRef&, bool) {}),
            0);
}

// The lock hand-over, without timing: one shard, so every key of the insert is behind the same
// lock. While the insert's first key is written (its batch holds the lock), a reader starts and
// queues behind it. A batch at a time, the reader gets in when that batch ends: the later keys
// see no queued reader. Holding the shard for the whole insert, the reader would wait to its end.
TEST(BulkInsertTest, LookupQueuedBehindABatchGetsInBeforeTheNext) {
  EmbeddingTable<int64_t> table(kDim, Uniform(), /*shard_bits=*/0);
  constexpr int64_t kKeys = 4096, kShortBatch = 1024;
  constexpr int64_t kProbe = 1 << 30;
  std::vector<float> rows(kKeys * kDim, 1.0f), probe_row(kDim);
  std::vector<uint32_t> queued_at(kKeys);
  std::thread reader;
  table.UpsertBatch(
      kKeys, [](int64_t i) { return i; },
      [&](int64_t i, RowRef&, bool) {
        if (i == 0) {
          reader = std::thread([&] { table.Find(kProbe, probe_row.data()); });
          while (table.QueuedReadersForTesting(kProbe) == 0) std::this_thread::yield();
        }
        queued_at[i] = table.QueuedReadersForTesting(kProbe);
      });
  reader.join();
  EXPECT_EQ(queued_at[0], 1u);
  int64_t got_in = 0;
  while (got_in < kKeys && queued_at[got_in] != 0) ++got_in;
  EXPECT_LT(got_in, kKeys) << "the lookup waited for the whole insert";
  EXPECT_LE(got_in, kShortBatch) << "the lookup waited for " << got_in << " keys";
  for (int64_t i = got_in; i < kKeys; ++i) ASSERT_EQ(queued_at[i], 0u) << i;
  EXPECT_EQ(table.Size(), kKeys);
}

// Lookups racing a bulk insert of new keys (for the sanitizers): a key reads its initial row
// before its write and the written row after it, never anything else.
TEST(BulkInsertTest, LookupsDuringABulkInsertReadWholeRows) {
  EmbeddingTable<int64_t> table(kDim, Uniform());
  constexpr int64_t kKeys = 20000, kBatch = 256;
  std::vector<float> rows(kKeys * kDim);
  for (int64_t i = 0; i < kKeys; ++i) {
    for (int j = 0; j < kDim; ++j) rows[i * kDim + j] = static_cast<float>(10 + i);
  }
  std::atomic<bool> done{false};
  std::atomic<int64_t> wrong{0};
  std::thread reader([&] {
    std::mt19937_64 rng(5);
    std::vector<int64_t> ids(kBatch);
    std::vector<float> got(kBatch * kDim), initial(kDim);
    while (!done.load()) {
      for (auto& id : ids) id = static_cast<int64_t>(rng() % kKeys);
      table.FindBatch(
          kBatch, [&](int64_t i) { return ids[i]; }, got.data());
      for (int64_t b = 0; b < kBatch; ++b) {
        const float* row = got.data() + b * kDim;
        FillInitialRow(table.initializer(), InitialRowKeyHash(ids[b]), initial.data(), kDim);
        const bool written = row[0] == static_cast<float>(10 + ids[b]) && row[kDim - 1] == row[0];
        if (!written && std::vector<float>(row, row + kDim) != initial) wrong.fetch_add(1);
      }
    }
  });
  table.InsertOrAssignBatch(
      kKeys, [](int64_t i) { return i; }, rows.data());
  done.store(true);
  reader.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(table.Size(), kKeys);
}

}  // namespace
}  // namespace de
}  // namespace tf_ext
