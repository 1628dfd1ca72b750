// The snapshot file format: round trips of full and delta snapshots of real tables, chunking,
// and every corruption or truncation detected (never a crash, never a silent wrong table).
#include "kernels/dynamic_embedding/core/snapshot_file.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "kernels/dynamic_embedding/core/embedding_table.h"
#include "tests/kernels/dynamic_embedding/snapshot_images.h"
#include "tests/kernels/dynamic_embedding/string_bytes.h"

namespace tf_ext {
namespace de {
namespace {

// Replays file images into `table` (tombstones remove, rows upsert, admission state replaces the
// table's, as the restore kernel does); returns "" or the error.
template <typename Key>
std::string Replay(const std::string& image, EmbeddingTable<Key>* table, SnapshotHeader* header) {
  StringSource source(image);
  SnapshotReader reader(&source);
  std::string problem = reader.ReadHeader(header);
  if (!problem.empty()) return problem;
  if (static_cast<int>(header->num_slots) > table->num_slots()) {
    table->EnsureSlots(header->num_slots, header->slot_initial_values);
  }
  const int dim = table->dim(), values = dim * (1 + header->num_slots);
  auto row = [&](auto key, uint32_t count, int64_t step, const float* data) {
    table->Upsert(key, [&](RowRef& r, bool) {
      std::copy(data, data + values, r.embedding);
      *r.update_count = count;
      *r.last_step = step;
    });
    return true;
  };
  auto tombstone = [&](auto key) {
    table->Remove(key);
    return true;
  };
  if (header->admission != SnapshotAdmission::kNone) table->ClearAdmission();
  SnapshotReader::AdmissionRecords admission;
  auto pending = [&](auto key, uint32_t count) {
    table->RestorePending(key, count);
    return true;
  };
  admission.sketch = [&](uint64_t first, const uint32_t* counters, size_t n) {
    return table->RestoreSketch(header->sketch_width, header->sketch_depth, first, n, counters);
  };
  if constexpr (std::is_same_v<Key, int64_t>) {
    admission.int64_pending = pending;
    return reader.ReadRecords(tombstone, row, {}, {}, &admission);
  } else {
    admission.string_pending = pending;
    return reader.ReadRecords({}, {}, tombstone, row, &admission);
  }
}

struct Entry {
  std::vector<float> values;  // embedding and slots
  uint32_t count;
  int64_t step;
  bool operator==(const Entry& o) const {
    return values == o.values && count == o.count && step == o.step;
  }
};

template <typename Key>
std::map<Key, Entry> Contents(EmbeddingTable<Key>& table) {
  std::map<Key, Entry> contents;
  const int width = table.dim() * (1 + table.num_slots());
  table.Export([](int64_t) { return true; },
               [&](int64_t, const Key& key, const RowRef& row) {
                 contents[key] = Entry{std::vector<float>(row.embedding, row.embedding + width),
                                       *row.update_count, *row.last_step};
               });
  return contents;
}

template <typename Key>
Key MakeKey(int64_t i);
template <>
int64_t MakeKey<int64_t>(int64_t i) {
  return i * 7919 - 500;
}
template <>
std::string MakeKey<std::string>(int64_t i) {
  return "id-" + std::to_string(i) + std::string(i % 40, 'x');  // some beyond the SSO buffer
}

template <typename Key>
class SnapshotFileTest : public ::testing::Test {};
using KeyTypes = ::testing::Types<int64_t, std::string>;
TYPED_TEST_SUITE(SnapshotFileTest, KeyTypes);

// Training-like updates: add `delta` to the row and to both slots.
template <typename Key>
void Train(EmbeddingTable<Key>& table, int64_t i, int64_t step, float delta) {
  table.UpdateRow(MakeKey<Key>(i), step, [&](RowRef& row) {
    for (int j = 0; j < table.dim() * (1 + table.num_slots()); ++j) row.embedding[j] += delta * j;
  });
}

TYPED_TEST(SnapshotFileTest, AFullSnapshotAndItsDeltasReplayToTheSameTable) {
  using Key = TypeParam;
  EmbeddingTable<Key> table(5, InitializerSpec());
  table.EnsureSlots(2, {0.1f, 0.0f});
  // Enough rows for several 1 MiB chunks.
  for (int64_t i = 0; i < 30000; ++i) Train(table, i, 1, 0.5f);
  std::vector<std::string> images(3);
  const int64_t v0 = Write(table, -1, 0, &images[0]);
  // Changes, removals, an id removed and added again, an eviction, new ids.
  for (int64_t i = 0; i < 300; ++i) Train(table, i * 3, 2, 1.0f);
  for (int64_t i = 1; i < 200; i += 7) table.Remove(MakeKey<Key>(i));
  table.Remove(MakeKey<Key>(9));
  Train(table, 9, 2, 2.0f);
  for (int64_t i = 40000; i < 40100; ++i) Train(table, i, 2, 1.0f);
  const int64_t v1 = Write(table, v0, 1, &images[1]);
  EvictionCriteria ttl;
  ttl.now_step = 3;
  ttl.ttl_steps = 2;  // everything last updated at step 1
  EXPECT_GT(table.Evict(ttl), 20000);
  Train(table, 5, 3, 1.0f);  // evicted, then re-admitted
  Write(table, v1, 2, &images[2]);
  EXPECT_LT(images[1].size() * 20, images[0].size());  // deltas hold only what changed

  EmbeddingTable<Key> replayed(5, InitializerSpec());
  for (size_t i = 0; i < images.size(); ++i) {
    SnapshotHeader header;
    ASSERT_EQ(Replay(images[i], &replayed, &header), "") << "file " << i;
    EXPECT_EQ(header.sequence, i);
    EXPECT_EQ(header.kind, i == 0 ? SnapshotKind::kFull : SnapshotKind::kDelta);
    EXPECT_EQ(header.slot_initial_values, (std::vector<float>{0.1f, 0.0f}));
  }
  EXPECT_EQ(Contents(replayed), Contents(table));
  EXPECT_EQ(replayed.Size(), table.Size());
}

TYPED_TEST(SnapshotFileTest, EveryFlippedByteAndEveryTruncationIsDetected) {
  using Key = TypeParam;
  EmbeddingTable<Key> table(3, InitializerSpec());
  table.EnsureSlots(1, {0.0f});
  for (int64_t i = 0; i < 40; ++i) Train(table, i, 1, 1.0f);
  std::string full;
  const int64_t v0 = Write(table, -1, 0, &full);
  table.Remove(MakeKey<Key>(3));
  Train(table, 50, 2, 1.0f);
  std::string delta;
  Write(table, v0, 1, &delta);
  for (const std::string* image : {&full, &delta}) {
    for (size_t at = 0; at < image->size(); ++at) {
      std::string bad = *image;
      bad[at] ^= 0x20;
      EmbeddingTable<Key> target(3, InitializerSpec());
      SnapshotHeader header;
      EXPECT_NE(Replay(bad, &target, &header), "") << "byte " << at << " flipped";
    }
    for (size_t length = 0; length < image->size(); ++length) {
      EmbeddingTable<Key> target(3, InitializerSpec());
      SnapshotHeader header;
      EXPECT_NE(Replay(image->substr(0, length), &target, &header), "") << "cut at " << length;
    }
  }
}

template <typename Key>
int64_t Walk(EmbeddingTable<Key>& table, int64_t since, bool track, int64_t* rows) {
  *rows = 0;
  return table.Snapshot(
      since, [](int64_t, int64_t) { return true; },
      [&](const Key&, const RowRef&) {
        ++*rows;
        return true;
      },
      [](const Key&) { return true; }, track);
}

TEST(SnapshotTrackingTest, APlainFullSnapshotStartsNoTracking) {
  EmbeddingTable<int64_t> table(2, InitializerSpec());
  Train(table, 1, 1, 1.0f);
  int64_t rows;
  const int64_t plain = Walk(table, EmbeddingTable<int64_t>::kFullSnapshot, false, &rows);
  ASSERT_GE(plain, 1);
  Train(table, 2, 2, 1.0f);
  EXPECT_EQ(Walk(table, plain, true, &rows), (EmbeddingTable<int64_t>::kSnapshotNoBase));
}

TEST(SnapshotTrackingTest, ARestoredTableContinuesItsChainFromMarkSnapshotBase) {
  EmbeddingTable<int64_t> source(2, InitializerSpec());
  for (int64_t i = 0; i < 100; ++i) Train(source, i, 1, 1.0f);
  std::string full;
  Write(source, -1, 0, &full);
  // A new table restored from the file (built aside, then swapped in, as the kernel does).
  EmbeddingTable<int64_t> live(2, InitializerSpec());
  EmbeddingTable<int64_t> fresh(2, InitializerSpec());
  SnapshotHeader header;
  ASSERT_EQ(Replay(full, &fresh, &header), "");
  live.SwapContents(fresh);
  const int64_t base = live.MarkSnapshotBase();
  Train(live, 5, 2, 1.0f);
  Train(live, 500, 2, 1.0f);
  live.Remove(MakeKey<int64_t>(7));
  std::string delta;
  Write(live, base, 1, &delta);
  EmbeddingTable<int64_t> replayed(2, InitializerSpec());
  ASSERT_EQ(Replay(full, &replayed, &header), "");
  ASSERT_EQ(Replay(delta, &replayed, &header), "");
  EXPECT_EQ(header.rows, 2u);  // only what changed since the restore
  EXPECT_EQ(header.tombstones, 1u);
  EXPECT_EQ(Contents(replayed), Contents(live));
}

// Sketches wide enough that the tests' ids never share all their counters (estimates are exact).
AdmissionSpec Admission(bool exact, int64_t sketch_width = 1 << 16, int sketch_depth = 4) {
  AdmissionSpec spec;
  spec.min_count = 5;
  spec.exact = exact;
  spec.sketch_width = sketch_width;
  spec.sketch_depth = sketch_depth;
  return spec;
}

// Updates ids 0..n-1, id i (1 + i % 4) times: every id waits for admission (min_count 5).
template <typename Key>
void CountWaitingIds(EmbeddingTable<Key>& table, int64_t n) {
  for (int round = 0; round < 4; ++round) {
    for (int64_t i = 0; i < n; ++i) {
      if (1 + i % 4 > round) Train(table, i, 1, 1.0f);
    }
  }
  ASSERT_EQ(table.Size(), 0);
}

// Each id i must get its row at its (5 - counts(i))-th further update, not earlier or later.
template <typename Key, typename Counts>
void ExpectAdmittedOnTime(EmbeddingTable<Key>& table, int64_t n, Counts&& counts) {
  for (int further = 1; further <= 5; ++further) {
    for (int64_t i = 0; i < n; ++i) Train(table, i, 2, 1.0f);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(table.Contains(MakeKey<Key>(i)), counts(i) + further >= 5)
          << "id " << i << " counted " << counts(i) << " times, then " << further << " more";
    }
  }
}

TYPED_TEST(SnapshotFileTest, AdmissionCountsOfFullAndDeltaSnapshotsRestoreExactly) {
  using Key = TypeParam;
  for (const bool exact : {false, true}) {
    SCOPED_TRACE(exact ? "exact" : "sketch");
    EmbeddingTable<Key> table(2, InitializerSpec(), 6, Admission(exact));
    CountWaitingIds(table, 50);
    std::vector<std::string> images(2);
    const int64_t v0 = Write(table, -1, 0, &images[0]);
    SnapshotHeader header;
    {
      EmbeddingTable<Key> restored(2, InitializerSpec(), 6, Admission(exact));
      ASSERT_EQ(Replay(images[0], &restored, &header), "");
      EXPECT_EQ(header.admission, exact ? SnapshotAdmission::kExact : SnapshotAdmission::kSketch);
      ExpectAdmittedOnTime(restored, 50, [](int64_t i) { return 1 + i % 4; });
    }
    // One more update of every id: those counted 4 times get rows, the others wait. The delta
    // holds the whole admission state: it replaces the full snapshot's.
    for (int64_t i = 0; i < 50; ++i) Train(table, i, 2, 1.0f);
    Write(table, v0, 1, &images[1]);
    EmbeddingTable<Key> restored(2, InitializerSpec(), 6, Admission(exact));
    for (const std::string& image : images) ASSERT_EQ(Replay(image, &restored, &header), "");
    EXPECT_EQ(Contents(restored), Contents(table));
    ExpectAdmittedOnTime(restored, 50, [](int64_t i) { return 2 + i % 4; });
  }
}

TEST(SnapshotAdmissionTest, ShardsSketchesMergeByMaxAndExactCountsRaiseASketch) {
  // Two tables standing for two shards: ids 0..49 counted in one, 50..99 in the other.
  EmbeddingTable<int64_t> first(2, InitializerSpec(), 6, Admission(false));
  EmbeddingTable<int64_t> second(2, InitializerSpec(), 6, Admission(false));
  CountWaitingIds(first, 50);
  for (int round = 0; round < 4; ++round) {
    for (int64_t i = 50; i < 100; ++i) {
      if (1 + i % 4 > round) Train(second, i, 1, 1.0f);
    }
  }
  std::string images[2];
  Write(first, -1, 0, &images[0]);
  Write(second, -1, 0, &images[1]);
  EmbeddingTable<int64_t> merged(2, InitializerSpec(), 6, Admission(false));
  SnapshotHeader header;
  for (const std::string& image : images) {
    StringSource source(image);
    SnapshotReader reader(&source);
    ASSERT_EQ(reader.ReadHeader(&header), "");
    SnapshotReader::AdmissionRecords admission;
    admission.sketch = [&](uint64_t at, const uint32_t* counters, size_t n) {
      return merged.RestoreSketch(header.sketch_width, header.sketch_depth, at, n, counters);
    };
    ASSERT_EQ(reader.ReadRecords({}, {}, {}, {}, &admission), "");
  }
  ExpectAdmittedOnTime(merged, 100, [](int64_t i) { return 1 + i % 4; });

  // Exact counts restored into a sketch; a sketch of another width is dropped.
  EmbeddingTable<int64_t> exact(2, InitializerSpec(), 6, Admission(true));
  CountWaitingIds(exact, 50);
  std::string exact_image, narrow_image;
  Write(exact, -1, 0, &exact_image);
  EmbeddingTable<int64_t> sketch(2, InitializerSpec(), 6, Admission(false));
  ASSERT_EQ(Replay(exact_image, &sketch, &header), "");
  ExpectAdmittedOnTime(sketch, 50, [](int64_t i) { return 1 + i % 4; });
  EmbeddingTable<int64_t> narrow(2, InitializerSpec(), 6, Admission(false, 2048));
  CountWaitingIds(narrow, 50);
  Write(narrow, -1, 0, &narrow_image);
  EmbeddingTable<int64_t> other_width(2, InitializerSpec(), 6, Admission(false));
  StringSource source(narrow_image);
  SnapshotReader reader(&source);
  ASSERT_EQ(reader.ReadHeader(&header), "");
  EXPECT_FALSE(other_width.RestoreSketch(header.sketch_width, header.sketch_depth, 0, 1,
                                         std::vector<uint32_t>(1, 3).data()));
  ExpectAdmittedOnTime(other_width, 50, [](int64_t) { return 0; });
}

TEST(SnapshotAdmissionTest, AFlippedByteOrACutInTheAdmissionStateIsDetected) {
  for (const bool exact : {false, true}) {
    // A small sketch (4 KiB): some ids may be admitted early, which this test does not mind.
    EmbeddingTable<int64_t> table(1, InitializerSpec(), 6, Admission(exact, 1024, 1));
    for (int round = 0; round < 5; ++round) {
      for (int64_t i = 0; i < 30; ++i) {
        if (i % 5 >= round) Train(table, i, 1, 1.0f);
      }
    }
    ASSERT_GT(table.Size(), 0);
    std::string image;
    Write(table, -1, 0, &image);
    // The header (93 bytes: no slots, the name "t"), one block of rows, the admission blocks,
    // the end block (16-byte head, 32-byte payload).
    uint32_t rows_bytes;
    std::memcpy(&rows_bytes, image.data() + 93 + 8, 4);
    const size_t rows_end = 93 + 16 + rows_bytes;
    ASSERT_LT(rows_end + 16, image.size() - 48);
    for (size_t at = rows_end; at < image.size(); ++at) {
      std::string bad = image;
      bad[at] ^= 0x01;
      EmbeddingTable<int64_t> target(1, InitializerSpec(), 6, Admission(exact, 1024, 1));
      SnapshotHeader header;
      const std::string problem = Replay(bad, &target, &header);
      EXPECT_NE(problem, "") << "byte " << at << " flipped";
      if (at >= rows_end + 16 && at < image.size() - 48) {  // an admission block's payload
        EXPECT_EQ(problem, "block checksum mismatch") << "byte " << at << " flipped";
      }
    }
    for (size_t length = rows_end; length < image.size(); ++length) {
      EmbeddingTable<int64_t> target(1, InitializerSpec(), 6, Admission(exact, 1024, 1));
      SnapshotHeader header;
      EXPECT_NE(Replay(image.substr(0, length), &target, &header), "") << "cut at " << length;
    }
  }
}

// A snapshot written by tf_ext before format version 2 (dim 2, one slot of initial value 0.5,
// rows 5 and -9): it still reads, and a table without admission still writes exactly this.
const char kVersion1File[] =
    "\x54\x46\x45\x58\x54\x53\x4e\x50\x01\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x02\x00\x00\x00\x01\x00\x00\x00\x07\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x0b\x00\x00\x00"
    "\x00\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x3f\x03\x00\x00\x00\x6f\x6c\x64\xdf"
    "\xad\x30\xac\x02\x00\x00\x00\x02\x00\x00\x00\x48\x00\x00\x00\xbd"
    "\x79\xce\xce\x05\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x0a"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x80\x3f\x00\x00\x00\x40\x00"
    "\x00\x40\x40\x00\x00\x80\x40\xf7\xff\xff\xff\xff\xff\xff\xff\x01"
    "\x00\x00\x00\x0b\x00\x00\x00\x00\x00\x00\x00\x00\x00\x80\xbf\x00"
    "\x00\x00\xc0\x00\x00\x80\x3e\x00\x00\x00\x41\x03\x00\x00\x00\x00"
    "\x00\x00\x00\x10\x00\x00\x00\x0a\xa1\xe4\x8f\x02\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00";

TEST(SnapshotReaderTest, AVersion1FileStillReadsIntoATableWithAdmission) {
  const std::string image(kVersion1File, sizeof(kVersion1File) - 1);
  EmbeddingTable<int64_t> table(2, InitializerSpec(), 6, Admission(false));
  SnapshotHeader header;
  ASSERT_EQ(Replay(image, &table, &header), "");
  EXPECT_EQ(header.admission, SnapshotAdmission::kNone);
  EXPECT_EQ((std::vector<float>{0.5f}), header.slot_initial_values);
  const std::map<int64_t, Entry> expected = {{5, Entry{{1, 2, 3, 4}, 3, 10}},
                                             {-9, Entry{{-1, -2, 0.25f, 8}, 1, 11}}};
  EXPECT_EQ(Contents(table), expected);
  ExpectAdmittedOnTime(table, 20, [](int64_t) { return 0; });  // no counts: they start at 0

  // Without admission state the writer still writes version 1, byte for byte.
  StringSink sink;
  SnapshotWriter writer(&sink);
  header.rows = 2;
  ASSERT_TRUE(writer.Begin(header));
  const float a[4] = {1, 2, 3, 4}, b[4] = {-1, -2, 0.25f, 8};
  ASSERT_TRUE(writer.Row(int64_t{5}, 3, 10, a, a + 2));
  ASSERT_TRUE(writer.Row(int64_t{-9}, 1, 11, b, b + 2));
  ASSERT_TRUE(writer.Finish());
  EXPECT_EQ(sink.bytes, image);
}

TEST(SnapshotReaderTest, AFutureFormatVersionIsRefusedByNumber) {
  std::string image(kVersion1File, sizeof(kVersion1File) - 1);
  image[8] = 4;
  SnapshotHeader header;
  StringSource source(image);
  EXPECT_EQ(SnapshotReader(&source).ReadHeader(&header),
            "snapshot format version 4, this build reads versions 1 to 3");
}

// A table of initializer version 2 writes format 3, which records it (with or without admission
// state); a file of an earlier format comes from a version 1 table.
TEST(SnapshotReaderTest, TheInitializerVersionRoundTripsAndOlderFilesAreVersion1) {
  const std::string version1_image(kVersion1File, sizeof(kVersion1File) - 1);
  SnapshotHeader header;
  StringSource version1_source(version1_image);
  ASSERT_EQ(SnapshotReader(&version1_source).ReadHeader(&header), "");
  EXPECT_EQ(header.initializer_version, 1u);

  for (bool with_admission : {false, true}) {
    SnapshotHeader written = header;
    written.initializer_version = 2;
    written.rows = 1;
    if (with_admission) DescribeAdmission(Admission(/*exact=*/true), &written);
    StringSink sink;
    SnapshotWriter writer(&sink);
    ASSERT_TRUE(writer.Begin(written));
    const float row[4] = {1, 2, 3, 4};
    ASSERT_TRUE(writer.Row(int64_t{5}, 3, 10, row, row + 2));
    ASSERT_TRUE(writer.Finish());
    EXPECT_EQ(sink.bytes[8], 3) << "format version";
    EXPECT_EQ(sink.bytes.size(), MinimumSnapshotBytes(written) + 16) << "and the rows' block head";
    EmbeddingTable<int64_t> table(2, InitializerSpec(), 6,
                                  with_admission ? Admission(true) : AdmissionSpec());
    SnapshotHeader read;
    ASSERT_EQ(Replay(sink.bytes, &table, &read), "");
    EXPECT_EQ(read.initializer_version, 2u);
    EXPECT_EQ(read.admission, written.admission);
    EXPECT_EQ(Contents(table).size(), 1u);

    std::string future = sink.bytes;  // an initializer version this build does not know
    const size_t field = 8 + 5 * 4 + 5 * 8 + 16;
    future[field] = 9;
    StringSource future_source(future);
    EXPECT_EQ(SnapshotReader(&future_source).ReadHeader(&read),
              "initializer version 9, this build knows versions 1 to 2");
  }
}

TEST(SnapshotWriterTest, RefusesTombstonesAfterRowsAndCountsThatDisagree) {
  StringSink sink;
  SnapshotWriter writer(&sink);
  SnapshotHeader header;
  header.dim = 1;
  header.rows = 2;
  ASSERT_TRUE(writer.Begin(header));
  const float value = 1.0f;
  ASSERT_TRUE(writer.Row(int64_t{1}, 0, 0, &value, &value));
  EXPECT_FALSE(writer.Tombstone(int64_t{2}));
  EXPECT_FALSE(writer.Finish());  // one row of the two announced
}

TEST(SnapshotReaderTest, RejectsOtherFilesAndFormatVersions) {
  const std::string not_a_snapshot(200, 'x');  // long enough for a header
  SnapshotHeader header;
  StringSource source(not_a_snapshot);
  EXPECT_NE(SnapshotReader(&source).ReadHeader(&header).find("bad magic"), std::string::npos);
}

// Found by tests/kernels/dynamic_embedding/fuzz/snapshot_file_fuzzer.cc: a block header declaring
// 48 MiB in a file of a few bytes made the reader allocate the 48 MiB before finding the file
// short. It reads a payload in pieces of at most a chunk now, so memory follows the data present.
TEST(SnapshotReaderTest, AllocatesForTheBytesAFileHoldsNotForTheSizeItDeclares) {
  StringSink sink;
  SnapshotWriter writer(&sink);
  SnapshotHeader header;
  header.dim = 1;
  ASSERT_TRUE(writer.Begin(header));
  const uint32_t block_head[4] = {SnapshotWriter::kRows, 1, 48u << 20, 0};
  std::string file = sink.bytes + std::string(reinterpret_cast<const char*>(block_head), 16);
  file += std::string(100, 'x');  // far fewer bytes than declared

  class LargestReadSource : public StringSource {
   public:
    using StringSource::StringSource;
    bool Read(char* out, size_t n) override {
      largest = std::max(largest, n);
      return StringSource::Read(out, n);
    }
    size_t largest = 0;
  } source(file);
  SnapshotReader reader(&source);
  ASSERT_EQ(reader.ReadHeader(&header), "");
  EXPECT_EQ(reader.ReadRecords(nullptr, nullptr, nullptr, nullptr), "truncated block");
  EXPECT_LE(source.largest, kSnapshotChunkBytes);
}

TEST(Crc32cTest, KnownValuesAndSplitsAgree) {
  const std::string check = "123456789";
  EXPECT_EQ(Crc32c(0, check.data(), check.size()), 0xE3069283u);  // the CRC-32C check value
  const std::string text(1000, 'a');
  EXPECT_EQ(Crc32c(Crc32c(0, text.data(), 333), text.data() + 333, 667),
            Crc32c(0, text.data(), text.size()));
}

}  // namespace
}  // namespace de
}  // namespace tf_ext
