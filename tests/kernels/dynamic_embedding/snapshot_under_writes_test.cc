// A snapshot is the table at one instant, the start of the save, while training writes go on:
// updates, inserts (also into ids freed before the instant), removals and evictions run while the
// save is paused inside its row callback, and must complete there (on a save that held the shards
// for the whole walk they would wait for it to end).
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "kernels/dynamic_embedding/core/admission.h"
#include "kernels/dynamic_embedding/core/embedding_table.h"

namespace tf_ext {
namespace de {
namespace {

// What a row holds, as a snapshot or an export reports it.
using Row = std::tuple<float, float, uint32_t, int64_t>;  // embedding[0], slot[0], count, step
using Rows = std::map<int64_t, Row>;

Row RowOfRef(const EmbeddingTable<int64_t>& table, const RowRef& row) {
  return Row{row.embedding[0], table.num_slots() > 0 ? row.slots[0] : 0.0f, *row.update_count,
             *row.last_step};
}

Rows Export(EmbeddingTable<int64_t>& table) {
  Rows rows;
  table.Export([](int64_t) { return true; },
               [&](int64_t, const int64_t& key, const RowRef& row) {
                 rows.emplace(key, RowOfRef(table, row));
               });
  return rows;
}

bool Train(EmbeddingTable<int64_t>& table, int64_t key, int64_t step, float delta) {
  return table.UpdateRow(key, step, [&](RowRef& row) {
    for (int j = 0; j < table.dim(); ++j) row.embedding[j] += delta;
    row.slots[0] += 1.0f;
  });
}

struct Saved {
  Rows rows;
  std::set<int64_t> tombstones;
  int64_t version = 0;
  bool writes_finished_during_save = false;
};

// Saves the table (a delta since `since`, or full); at its first row, `writes` runs in a second
// thread, and with `pause` the save waits in its row callback until they are done. On a save that
// blocks writers they cannot be done: the wait gives up after a minute and the save says so.
// Without `pause` the writes and the save's walk interleave freely.
Saved SaveWhile(EmbeddingTable<int64_t>& table, int64_t since, const std::function<void()>& writes,
                bool pause = true) {
  Saved saved;
  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;
  std::thread writer;
  int64_t announced_rows = -1, announced_tombstones = -1;
  saved.version = table.Snapshot(
      since,
      [&](int64_t rows, int64_t tombstones) {
        announced_rows = rows;
        announced_tombstones = tombstones;
        return true;
      },
      [&](const int64_t& key, const RowRef& row) {
        if (!writer.joinable()) {
          writer = std::thread([&] {
            writes();
            std::lock_guard<std::mutex> guard(mutex);
            done = true;
            done_cv.notify_all();
          });
          std::unique_lock<std::mutex> lock(mutex);
          if (pause) {
            saved.writes_finished_during_save =
                done_cv.wait_for(lock, std::chrono::seconds(60), [&] { return done; });
          }
        }
        EXPECT_TRUE(saved.rows.emplace(key, RowOfRef(table, row)).second) << "twice: " << key;
        return true;
      },
      [&](const int64_t& key) {
        EXPECT_TRUE(saved.tombstones.insert(key).second) << "twice: " << key;
        return true;
      });
  if (writer.joinable()) writer.join();
  EXPECT_EQ(announced_rows, static_cast<int64_t>(saved.rows.size()));
  EXPECT_EQ(announced_tombstones, static_cast<int64_t>(saved.tombstones.size()));
  return saved;
}

// 5000 per shard of 4, and rows of 536 bytes: three save batches (1 MiB) per shard.
constexpr int64_t kKeys = 20000;

// Keys 0..kKeys-1 trained once at step 1 (value k), then every seventh removed: free ids at the
// instant, which inserts during the save reuse.
void Fill(EmbeddingTable<int64_t>& table) {
  table.EnsureSlots(1, {0.5f});
  for (int64_t k = 0; k < kKeys; ++k) Train(table, k, 1, static_cast<float>(k));
  for (int64_t k = 0; k < kKeys; k += 7) table.Remove(k);
}

// Everything a training process does to the table, after the instant.
void WriteEverything(EmbeddingTable<int64_t>& table) {
  for (int64_t k = 0; k < kKeys; ++k) Train(table, k, 9, 1000.0f);  // also re-creates k % 7 == 0
  for (int64_t k = kKeys; k < kKeys + 3000; ++k) Train(table, k, 9, 1.0f);
  for (int64_t k = 1; k < kKeys; k += 5) table.Remove(k);
  std::vector<int64_t> batch;
  for (int64_t k = 2; k < kKeys; k += 11) batch.push_back(k);
  table.RemoveBatch(static_cast<int64_t>(batch.size()), [&](int64_t i) { return batch[i]; });
  const std::vector<float> row(table.dim(), -1.0f);
  for (int64_t k = 3; k < kKeys; k += 13) table.InsertOrAssign(k, row.data());
  EvictionCriteria criteria;
  criteria.max_size = kKeys / 2;
  table.Evict(criteria);
}

TEST(SnapshotUnderWritesTest, AFullSaveIsTheTableAtItsInstant) {
  EmbeddingTable<int64_t> table(64, InitializerSpec(), /*shard_bits=*/2);
  Fill(table);
  const Rows at_instant = Export(table);
  const Saved saved =
      SaveWhile(table, EmbeddingTable<int64_t>::kFullSnapshot, [&] { WriteEverything(table); });
  EXPECT_TRUE(saved.writes_finished_during_save) << "training writes waited for the save";
  EXPECT_EQ(saved.rows.size(), at_instant.size());
  EXPECT_TRUE(saved.rows == at_instant) << "the save is not the table at its instant";
  EXPECT_TRUE(saved.tombstones.empty());
  EXPECT_FALSE(Export(table) == at_instant);  // the writes did land
  // The next save is whole again, and of the table now.
  const Rows now = Export(table);
  const Saved next = SaveWhile(table, EmbeddingTable<int64_t>::kFullSnapshot, [] {});
  EXPECT_GT(next.version, saved.version);
  EXPECT_TRUE(next.rows == now);
}

TEST(SnapshotUnderWritesTest, ADeltaSaveIsTheChangesUpToItsInstant) {
  EmbeddingTable<int64_t> table(64, InitializerSpec(), /*shard_bits=*/2);
  Fill(table);
  const Saved base = SaveWhile(table, EmbeddingTable<int64_t>::kFullSnapshot, [] {});
  ASSERT_GE(base.version, 1);
  table.CommitSnapshot(base.version);
  // Changes since the base: every third key updated, every fourth removed, new keys.
  for (int64_t k = 0; k < kKeys; k += 3) Train(table, k, 5, 0.25f);
  std::set<int64_t> removed;
  for (int64_t k = 0; k < kKeys; k += 4) {
    if (table.Remove(k)) removed.insert(k);
  }
  for (int64_t k = kKeys + 5000; k < kKeys + 5100; ++k) Train(table, k, 5, 2.0f);
  const Rows at_instant = Export(table);
  Rows changed;
  for (const auto& [key, row] : at_instant) {
    if (std::get<3>(row) == 5) changed.emplace(key, row);
  }
  const Saved delta = SaveWhile(table, base.version, [&] { WriteEverything(table); });
  EXPECT_TRUE(delta.writes_finished_during_save) << "training writes waited for the save";
  EXPECT_TRUE(delta.rows == changed) << "the delta is not the changes up to its instant";
  EXPECT_EQ(delta.tombstones, removed);  // and none of the removals after the instant
}

TEST(SnapshotUnderWritesTest, WritesInterleavedWithTheWalkLeaveItAtItsInstant) {
  for (const bool full : {true, false}) {
    EmbeddingTable<int64_t> table(64, InitializerSpec(), /*shard_bits=*/2);
    Fill(table);
    const Saved base = SaveWhile(table, EmbeddingTable<int64_t>::kFullSnapshot, [] {});
    for (int64_t k = 0; k < kKeys; k += 2) Train(table, k, 5, 0.25f);
    Rows expected = Export(table);
    if (!full) {  // the delta: the rows trained since the base
      for (auto it = expected.begin(); it != expected.end();) {
        it = std::get<3>(it->second) == 5 ? std::next(it) : expected.erase(it);
      }
    }
    const Saved saved = SaveWhile(
        table, full ? EmbeddingTable<int64_t>::kFullSnapshot : base.version,
        [&] { WriteEverything(table); }, /*pause=*/false);
    EXPECT_TRUE(saved.rows == expected) << (full ? "full" : "delta");
  }
}

// The admission counts saved are those of the instant too, also while updates count ids on.
TEST(SnapshotUnderWritesTest, AdmissionCountsAreThoseOfTheInstant) {
  AdmissionSpec exact;
  exact.min_count = 3;
  exact.exact = true;
  EmbeddingTable<int64_t> table(4, InitializerSpec(), /*shard_bits=*/2, exact);
  for (int64_t k = 0; k < 100; ++k) {  // admitted: rows to walk
    for (int64_t step = 1; step <= 3; ++step) Train(table, k, step, 1.0f);
  }
  for (int64_t k = 100; k < 200; ++k) Train(table, k, 4, 1.0f);  // waiting, counted once
  std::map<int64_t, uint32_t> pending;
  std::thread writer;
  const int64_t version = table.Snapshot(
      EmbeddingTable<int64_t>::kFullSnapshot, [](int64_t, int64_t) { return true; },
      [&](const int64_t&, const RowRef&) {
        if (!writer.joinable()) {  // counts every waiting id again, and a new one
          writer = std::thread([&] {
            for (int64_t k = 100; k <= 200; ++k) Train(table, k, 5, 1.0f);
          });
          writer.join();
        }
        return true;
      },
      [](const int64_t&) { return true; }, /*track=*/false,
      [&](const int64_t& key, uint32_t count) { return pending.emplace(key, count).second; },
      [](const CountMinSketch&) { return true; });
  EXPECT_GE(version, 1);
  std::map<int64_t, uint32_t> expected;
  for (int64_t k = 100; k < 200; ++k) expected[k] = 1;
  EXPECT_EQ(pending, expected);
}

TEST(SnapshotUnderWritesTest, AStoppedSaveLeavesTheNextOneWhole) {
  EmbeddingTable<int64_t> table(64, InitializerSpec(), /*shard_bits=*/2);
  Fill(table);
  int rows_left = 3;
  EXPECT_EQ(table.Snapshot(
                EmbeddingTable<int64_t>::kFullSnapshot, [](int64_t, int64_t) { return true; },
                [&](const int64_t&, const RowRef&) { return --rows_left > 0; },
                [](const int64_t&) { return true; }),
            (EmbeddingTable<int64_t>::kSnapshotStopped));
  WriteEverything(table);  // keeps nothing for the stopped save
  const Rows now = Export(table);
  const Saved next = SaveWhile(table, EmbeddingTable<int64_t>::kFullSnapshot, [] {});
  EXPECT_TRUE(next.rows == now);
}

}  // namespace
}  // namespace de
}  // namespace tf_ext
