// The table's lifecycle core: admission, eviction, statistics, versions and streaming snapshots,
// and the memory of small tables.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kernels/dynamic_embedding/core/admission.h"
#include "kernels/dynamic_embedding/core/embedding_table.h"

namespace tf_ext {
namespace de {
namespace {

InitializerSpec Zeros() { return InitializerSpec(); }

AdmissionSpec MinCount(int64_t n, bool exact) {
  AdmissionSpec spec;
  spec.min_count = n;
  spec.exact = exact;
  spec.sketch_width = 1 << 16;
  return spec;
}

// One training update of `key` at `step` that adds `delta` to every element.
template <typename Key>
bool Train(EmbeddingTable<Key>& table, const Key& key, int64_t step, float delta = 1.0f) {
  return table.UpdateRow(key, step, [&](RowRef& row) {
    for (int j = 0; j < table.dim(); ++j) row.embedding[j] += delta;
  });
}

std::set<int64_t> Keys(EmbeddingTable<int64_t>& table) {
  std::set<int64_t> keys;
  table.Export([](int64_t) { return true; },
               [&](int64_t, const int64_t& key, const RowRef&) { keys.insert(key); });
  return keys;
}

class AdmissionTest : public ::testing::TestWithParam<bool> {};

TEST_P(AdmissionTest, AnIdGetsItsRowAtItsMinCountThUpdate) {
  EmbeddingTable<int64_t> table(2, Zeros(), 6, MinCount(3, GetParam()));
  EXPECT_FALSE(Train(table, int64_t{7}, 1));
  EXPECT_FALSE(Train(table, int64_t{7}, 2));
  EXPECT_EQ(table.Size(), 0);  // no entry, and the update function did not run
  EXPECT_TRUE(Train(table, int64_t{7}, 3));
  std::vector<float> row(2);
  ASSERT_TRUE(table.Find(7, row.data()));
  EXPECT_EQ(row[0], 1.0f);  // only the admitting update applied
  EXPECT_TRUE(Train(table, int64_t{7}, 4));
  const TableCounters counters = table.Counters();
  EXPECT_EQ(counters.admitted, 1);
  EXPECT_EQ(counters.rejected, 2);
}

TEST_P(AdmissionTest, StringKeys) {
  EmbeddingTable<std::string> table(2, Zeros(), 6, MinCount(2, GetParam()));
  EXPECT_FALSE(Train(table, std::string("a"), 1));
  EXPECT_TRUE(Train(table, std::string("a"), 2));
  EXPECT_FALSE(Train(table, std::string("b"), 2));
  EXPECT_TRUE(table.Contains("a"));
  EXPECT_FALSE(table.Contains("b"));
}

// UpdateBatch does what UpdateRow does key by key, in order: admission, duplicates applied twice,
// counts and the latest step; over many shards (600 keys in 64).
TEST_P(AdmissionTest, UpdateBatchMatchesUpdateRowKeyByKey) {
  EmbeddingTable<int64_t> batched(2, Zeros(), 6, MinCount(2, GetParam()));
  EmbeddingTable<int64_t> single(2, Zeros(), 6, MinCount(2, GetParam()));
  std::vector<int64_t> keys;
  for (int64_t k = 0; k < 600; ++k) keys.push_back(k * 7919 % 1000);
  for (int64_t k = 0; k < 300; ++k) keys.push_back(k);  // ids 0..299 seen twice: admitted
  for (int64_t step : {5, 3}) {
    std::vector<int64_t> ran_for;
    const int64_t ran = batched.UpdateBatch(
        static_cast<int64_t>(keys.size()), [&](int64_t i) { return keys[i]; }, step,
        [&](int64_t i, RowRef& row) {
          ran_for.push_back(i);
          row.embedding[0] += static_cast<float>(i + 1);
        });
    int64_t expected_ran = 0;
    for (size_t i = 0; i < keys.size(); ++i) {
      expected_ran += single.UpdateRow(
          keys[i], step, [&](RowRef& row) { row.embedding[0] += static_cast<float>(i + 1); });
    }
    EXPECT_EQ(ran, expected_ran);
    EXPECT_EQ(static_cast<int64_t>(ran_for.size()), ran);
  }
  EXPECT_EQ(batched.latest_step(), 5);  // the larger step stays
  EXPECT_EQ(batched.Size(), single.Size());
  EXPECT_EQ(batched.Counters().admitted, single.Counters().admitted);
  EXPECT_EQ(batched.Counters().rejected, single.Counters().rejected);
  for (int64_t k = 0; k < 1000; ++k) {
    std::vector<float> a(2), b(2);
    ASSERT_EQ(batched.Find(k, a.data()), single.Find(k, b.data())) << k;
    EXPECT_EQ(a, b) << k;
  }
}

INSTANTIATE_TEST_SUITE_P(SketchAndExact, AdmissionTest, ::testing::Bool());

TEST(CountMinSketchTest, NeverUnderCountsAlsoUnderConcurrentIncrements) {
  CountMinSketch sketch(1024, 4);  // small on purpose: many collisions
  constexpr int kThreads = 4, kKeys = 20000, kRounds = 3;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        for (int k = t; k < kKeys; k += kThreads) sketch.Increment(InitialRowKeyHash(int64_t{k}));
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int k = 0; k < kKeys; ++k) {
    ASSERT_GE(sketch.Estimate(InitialRowKeyHash(int64_t{k})), uint32_t{kRounds}) << k;
  }
}

TEST(CountMinSketchTest, ExactWithFewIds) {
  CountMinSketch sketch(1 << 16, 4);
  for (int k = 0; k < 100; ++k) {
    for (int i = 0; i <= k; ++i) sketch.Increment(InitialRowKeyHash(int64_t{k}));
  }
  for (int k = 0; k < 100; ++k) EXPECT_EQ(sketch.Estimate(InitialRowKeyHash(int64_t{k})), k + 1);
  EXPECT_EQ(sketch.Bytes(), size_t{4} * 4 * (1 << 16));
}

// A sketch of 2 MiB or more lives in mapped, huge-page-advised memory, a smaller one on the heap:
// both count alike, and copies, swaps, merges and prefetches work on either.
TEST(CountMinSketchTest, MappedAndHeapCountersAgree) {
  CountMinSketch mapped(1 << 19, 4);  // 8 MiB: mapped
  CountMinSketch heap(1 << 10, 4);    // 16 KiB: heap
  ASSERT_EQ(mapped.Bytes(), size_t{8} << 20);
  for (int k = 0; k < 50; ++k) {
    const uint64_t hash = InitialRowKeyHash(int64_t{k});
    mapped.Prefetch(hash);
    heap.Prefetch(hash);
    for (int i = 0; i <= k % 5; ++i) {
      mapped.Increment(hash);
      heap.Increment(hash);
    }
  }
  for (int k = 0; k < 50; ++k) {
    EXPECT_EQ(mapped.Estimate(InitialRowKeyHash(int64_t{k})), k % 5 + 1) << k;
    EXPECT_GE(heap.Estimate(InitialRowKeyHash(int64_t{k})), uint32_t(k % 5 + 1)) << k;
  }
  CountMinSketch copy(mapped);  // copies from mapped memory into mapped memory
  CountMinSketch other(1 << 19, 4);
  other.SwapCounters(copy);  // `other` now holds the counts, `copy` zeros
  std::vector<uint32_t> counters(mapped.NumCounters()), swapped(other.NumCounters());
  mapped.CopyCounters(0, counters.size(), counters.data());
  other.CopyCounters(0, swapped.size(), swapped.data());
  EXPECT_EQ(counters, swapped);
  EXPECT_EQ(copy.Estimate(InitialRowKeyHash(int64_t{4})), 0u);
  copy.MaxCounters(0, counters.size(), counters.data());
  EXPECT_EQ(copy.Estimate(InitialRowKeyHash(int64_t{4})), 5u);
}

// Rows 1..6: row k updated twice, last at step k (row 1 once, at step 1).
EmbeddingTable<int64_t>* SixRows(EmbeddingTable<int64_t>* table) {
  for (int64_t k = 1; k <= 6; ++k) Train(*table, k, 1);
  for (int64_t k = 2; k <= 6; ++k) Train(*table, k, k);
  return table;
}

TEST(EvictionTest, TtlBoundary) {
  EmbeddingTable<int64_t> table(2, Zeros());
  SixRows(&table);
  EvictionCriteria criteria;
  criteria.now_step = 6;
  criteria.ttl_steps = 3;
  EXPECT_EQ(table.Evict(criteria), 3);  // idle 5, 4, 3 go; idle 2 stays
  EXPECT_EQ(Keys(table), (std::set<int64_t>{4, 5, 6}));
  EXPECT_EQ(table.Counters().evicted, 3);
}

TEST(EvictionTest, MinFrequencyWaitsForItsWindow) {
  EmbeddingTable<int64_t> table(2, Zeros());
  SixRows(&table);
  EvictionCriteria criteria;
  criteria.now_step = 3;
  criteria.min_frequency = 2;
  criteria.frequency_window_steps = 3;
  EXPECT_EQ(table.Evict(criteria), 0);  // row 1 (1 update) idle only 2 steps
  criteria.now_step = 4;
  EXPECT_EQ(table.Evict(criteria), 1);
  EXPECT_FALSE(table.Contains(1));
}

TEST(EvictionTest, MinL2NormAndSlotsGoWithTheRow) {
  EmbeddingTable<int64_t> table(2, Zeros());
  table.EnsureSlots(1, {0.5f});
  const float small[] = {0.1f, 0.1f}, large[] = {3.0f, 4.0f};
  table.InsertOrAssign(1, small);
  table.InsertOrAssign(2, large);
  table.Upsert(1, [](RowRef& row, bool) { row.slots[0] = 9.0f; });
  EvictionCriteria criteria;
  criteria.min_l2_norm = 1.0f;
  EXPECT_EQ(table.Evict(criteria), 1);
  table.InsertOrAssign(1, large);  // re-created: its slot starts afresh
  table.Upsert(1, [](RowRef& row, bool created) {
    EXPECT_FALSE(created);
    EXPECT_EQ(row.slots[0], 0.5f);
  });
}

TEST(EvictionTest, MaxSizeRemovesTheLeastRecentlyUpdatedIncludingTiesAtTheCutoff) {
  EmbeddingTable<int64_t> table(2, Zeros());
  for (int64_t k = 0; k < 100; ++k) Train(table, k, k / 10);  // ten rows per step 0..9
  EvictionCriteria criteria;
  criteria.max_size = 75;
  EXPECT_EQ(table.Evict(criteria), 25);
  EXPECT_EQ(table.Size(), 75);
  for (int64_t k = 0; k < 20; ++k) EXPECT_FALSE(table.Contains(k)) << k;
  for (int64_t k = 30; k < 100; ++k) EXPECT_TRUE(table.Contains(k)) << k;
}

TEST(EvictionTest, MaxSizeWithStepsSpreadWiderThanTheHistogram) {
  EmbeddingTable<int64_t> table(2, Zeros());
  for (int64_t k = 0; k < 5000; ++k) Train(table, k, k * 1000003);  // wide, distinct steps
  EvictionCriteria criteria;
  criteria.max_size = 1234;
  EXPECT_EQ(table.Evict(criteria), 5000 - 1234);
  for (int64_t k = 0; k < 5000; ++k) ASSERT_EQ(table.Contains(k), k >= 5000 - 1234) << k;
}

TEST(EvictionTest, RunsWhileOtherThreadsLookUpAndUpdate) {
  EmbeddingTable<int64_t> table(4, Zeros());
  for (int64_t k = 0; k < 50000; ++k) Train(table, k, k % 100);
  std::atomic<bool> stop{false};
  std::atomic<int> running{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < 2; ++t) {
    workers.emplace_back([&, t] {
      std::vector<float> out(4 * 256);
      int64_t step = 1000;
      do {
        table.FindBatch(
            256, [&](int64_t i) { return (i * 197 + t) % 60000; }, out.data());
        Train(table, int64_t{50000 + t}, ++step);
        if (step == 1001) running.fetch_add(1);
      } while (!stop.load());
    });
  }
  // Evict only once both workers are in their loops (an eviction takes milliseconds).
  while (running.load() < 2) std::this_thread::yield();
  EvictionCriteria criteria;
  criteria.now_step = 100;
  criteria.ttl_steps = 50;  // rows of steps 0..50
  const int64_t removed = table.Evict(criteria);
  stop = true;
  for (auto& worker : workers) worker.join();
  EXPECT_EQ(removed, 51 * 500);
  EXPECT_EQ(table.Size(), 50000 - removed + 2);
  for (int64_t k = 0; k < 50000; ++k) ASSERT_EQ(table.Contains(k), k % 100 > 50) << k;
}

TEST(StatisticsTest, LookupsAndHits) {
  EmbeddingTable<int64_t> table(2, Zeros());
  Train(table, int64_t{1}, 1);
  std::vector<float> out(2 * 3);
  const int64_t keys[] = {1, 2, 1};
  EXPECT_EQ(table.FindBatch(
                3, [&](int64_t i) { return keys[i]; }, out.data()),
            2);
  table.Find(5, out.data());
  EXPECT_EQ(table.Counters().lookups, 4);
  EXPECT_EQ(table.Counters().lookup_hits, 2);
  EXPECT_EQ(table.latest_step(), 1);
}

struct Captured {
  std::map<int64_t, float> rows;  // key -> first element
  std::set<int64_t> tombstones;
};

Captured Capture(EmbeddingTable<int64_t>& table, int64_t since, int64_t* version) {
  Captured captured;
  int64_t announced_rows = -1, announced_tombstones = -1;
  *version = table.Snapshot(
      since,
      [&](int64_t rows, int64_t tombstones) {
        announced_rows = rows;
        announced_tombstones = tombstones;
        return true;
      },
      [&](const int64_t& key, const RowRef& row) {
        EXPECT_TRUE(captured.rows.emplace(key, row.embedding[0]).second) << "twice: " << key;
        return true;
      },
      [&](const int64_t& key) {
        captured.tombstones.insert(key);
        return true;
      });
  EXPECT_EQ(announced_rows, static_cast<int64_t>(captured.rows.size()));
  EXPECT_EQ(announced_tombstones, static_cast<int64_t>(captured.tombstones.size()));
  return captured;
}

TEST(SnapshotTest, DeltasHoldExactlyWhatChangedAndReplayToTheSameTable) {
  EmbeddingTable<int64_t> table(2, Zeros());
  for (int64_t k = 0; k < 1000; ++k) Train(table, k, 1);
  int64_t full_version, v2, v3;
  EXPECT_EQ(
      table.Snapshot(
          0, [](int64_t, int64_t) { return true; },
          [](const int64_t&, const RowRef&) { return true; }, [](const int64_t&) { return true; }),
      (EmbeddingTable<int64_t>::kSnapshotNoBase));  // no base yet
  const Captured full = Capture(table, EmbeddingTable<int64_t>::kFullSnapshot, &full_version);
  EXPECT_EQ(full.rows.size(), 1000u);
  table.CommitSnapshot(full_version);
  Train(table, int64_t{5}, 2);
  table.Remove(6);
  table.Remove(7);
  Train(table, int64_t{7}, 2);  // removed and back in the same interval
  Train(table, int64_t{2000}, 2);
  const Captured delta1 = Capture(table, full_version, &v2);
  EXPECT_EQ(delta1.rows, (std::map<int64_t, float>{{5, 2.0f}, {7, 1.0f}, {2000, 1.0f}}));
  EXPECT_EQ(delta1.tombstones, (std::set<int64_t>{6, 7}));
  // Not committed: a second delta from the same base still has everything, plus later changes.
  Train(table, int64_t{8}, 3);
  const Captured delta1b = Capture(table, full_version, &v3);
  EXPECT_EQ(delta1b.rows.size(), 4u);
  table.CommitSnapshot(v3);
  EXPECT_EQ(
      table.Snapshot(
          full_version, [](int64_t, int64_t) { return true; },
          [](const int64_t&, const RowRef&) { return true; }, [](const int64_t&) { return true; }),
      (EmbeddingTable<int64_t>::kSnapshotNoBase));  // older than the last commit
  table.Remove(5);
  int64_t v4;
  const Captured delta2 = Capture(table, v3, &v4);
  EXPECT_TRUE(delta2.rows.empty());
  EXPECT_EQ(delta2.tombstones, (std::set<int64_t>{5}));

  // Replay: the full snapshot, then each delta's tombstones, then its rows.
  std::map<int64_t, float> replayed = full.rows;
  for (const Captured* delta : {&delta1b, &delta2}) {
    for (int64_t key : delta->tombstones) replayed.erase(key);
    for (const auto& [key, value] : delta->rows) replayed[key] = value;
  }
  int64_t now_version;
  EXPECT_EQ(Capture(table, EmbeddingTable<int64_t>::kFullSnapshot, &now_version).rows, replayed);
}

// The version advances at a walk's instant, before it streams (writes during it get the next one),
// so a stopped walk advances it too; it returns no version to take a delta from.
TEST(SnapshotTest, AStoppedWalkStillAdvancesTheVersion) {
  EmbeddingTable<int64_t> table(2, Zeros());
  Train(table, int64_t{1}, 1);
  Train(table, int64_t{2}, 1);
  EXPECT_EQ(
      table.Snapshot(
          EmbeddingTable<int64_t>::kFullSnapshot, [](int64_t, int64_t) { return true; },
          [](const int64_t&, const RowRef&) { return false; }, [](const int64_t&) { return true; }),
      (EmbeddingTable<int64_t>::kSnapshotStopped));
  int64_t version;
  EXPECT_EQ(Capture(table, EmbeddingTable<int64_t>::kFullSnapshot, &version).rows.size(), 2u);
  EXPECT_EQ(version, 2);
}

TEST(SmallTableTest, AThousandIdsCostAtMostTwiceTheirPayload) {
  for (int slots : {0, 2}) {
    EmbeddingTable<int64_t> table(16, Zeros());
    if (slots) table.EnsureSlots(slots, std::vector<float>(slots, 0.0f));
    std::vector<float> row(16, 1.0f);
    for (int64_t k = 0; k < 1000; ++k) table.InsertOrAssign(k * 7919 + 13, row.data());
    const size_t payload = 1000 * (8 + 4 * 16 * (1 + slots));
    EXPECT_LE(table.BytesInUse(), 2 * payload) << "slots " << slots;
    // Correct across the small/large chunk boundary, with removals and re-inserts.
    for (int64_t k = 0; k < 1000; k += 3) ASSERT_TRUE(table.Remove(k * 7919 + 13));
    for (int64_t k = 0; k < 1000; k += 3) table.InsertOrAssign(k * 7919 + 13, row.data());
    table.EnsureSlots(3, {0.0f, 0.0f, 0.0f});
    std::vector<float> out(16);
    for (int64_t k = 0; k < 1000; ++k) {
      ASSERT_TRUE(table.Find(k * 7919 + 13, out.data()));
      ASSERT_EQ(out, row);
    }
  }
}

}  // namespace
}  // namespace de
}  // namespace tf_ext
