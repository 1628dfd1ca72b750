// The snapshot file format: round trips of full and delta snapshots of real tables, chunking,
// and every corruption or truncation detected (never a crash, never a silent wrong table).
#include "kernels/dynamic_embedding/core/snapshot_file.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "kernels/dynamic_embedding/core/embedding_table.h"

namespace tf_ext {
namespace de {
namespace {

class StringSink : public ByteSink {
 public:
  bool Append(const char* data, size_t n) override {
    bytes.append(data, n);
    return true;
  }
  std::string bytes;
};

class StringSource : public ByteSource {
 public:
  explicit StringSource(const std::string& bytes) : bytes_(bytes) {}
  bool Read(char* out, size_t n) override {
    if (bytes_.size() - offset_ < n) return false;
    std::memcpy(out, bytes_.data() + offset_, n);
    offset_ += n;
    return true;
  }

 private:
  const std::string& bytes_;
  size_t offset_ = 0;
};

template <typename Key>
SnapshotKeyType KeyType() {
  return std::is_same_v<Key, int64_t> ? SnapshotKeyType::kInt64 : SnapshotKeyType::kString;
}

// Writes table.Snapshot(since) into a file image; returns the version (or the error code).
template <typename Key>
int64_t Write(EmbeddingTable<Key>& table, int64_t since, uint64_t sequence, std::string* out) {
  StringSink sink;
  SnapshotWriter writer(&sink);
  SnapshotHeader header;
  header.kind = since < 0 ? SnapshotKind::kFull : SnapshotKind::kDelta;
  header.key_type = KeyType<Key>();
  header.dim = table.dim();
  header.chain_id = 42;
  header.sequence = sequence;
  header.step = 100 + sequence;
  header.table_name = "t";
  const int64_t version = table.Snapshot(
      since,
      [&](int64_t rows, int64_t tombstones) {
        header.num_slots = table.num_slots();
        header.slot_initial_values = table.slot_initial_values();
        header.rows = rows;
        header.tombstones = tombstones;
        return writer.Begin(header);
      },
      [&](const Key& key, const RowRef& row) {
        return writer.Row(key, *row.update_count, *row.last_step, row.embedding, row.slots);
      },
      [&](const Key& key) { return writer.Tombstone(key); });
  EXPECT_GE(version, 1);
  EXPECT_TRUE(writer.Finish());
  EXPECT_EQ(writer.bytes_written(), sink.bytes.size());
  table.CommitSnapshot(version);
  *out = sink.bytes;
  return version;
}

// Replays file images into `table` (tombstones remove, rows upsert); returns "" or the error.
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
  if constexpr (std::is_same_v<Key, int64_t>) {
    return reader.ReadRecords(tombstone, row, {}, {});
  } else {
    return reader.ReadRecords({}, {}, tombstone, row);
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
