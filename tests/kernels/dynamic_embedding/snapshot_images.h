// A CPU table's snapshot written into memory as the save kernel writes it, for the C++ tests of
// the snapshot format and of restores.
#ifndef TF_EXT_TESTS_KERNELS_DYNAMIC_EMBEDDING_SNAPSHOT_IMAGES_H_
#define TF_EXT_TESTS_KERNELS_DYNAMIC_EMBEDDING_SNAPSHOT_IMAGES_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "kernels/dynamic_embedding/core/embedding_table.h"
#include "kernels/dynamic_embedding/core/snapshot_file.h"
#include "tests/kernels/dynamic_embedding/string_bytes.h"

namespace tf_ext {
namespace de {

template <typename Key>
inline SnapshotKeyType KeyType() {
  return std::is_same_v<Key, int64_t> ? SnapshotKeyType::kInt64 : SnapshotKeyType::kString;
}

// Writes table.Snapshot(since) into a file image as the save kernel does (tracked, then committed:
// chain 42, its `sequence`, step 100 + sequence); returns the version (or the error code).
template <typename Key>
inline int64_t Write(EmbeddingTable<Key>& table, int64_t since, uint64_t sequence,
                     std::string* out) {
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
  DescribeAdmission(table.admission(), &header);
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
      [&](const Key& key) { return writer.Tombstone(key); }, /*track=*/true,
      [&](const Key& key, uint32_t count) { return writer.Pending(key, count); },
      [&](const CountMinSketch& sketch) { return writer.SketchCounters(sketch); });
  EXPECT_GE(version, 1);
  EXPECT_TRUE(writer.Finish());
  EXPECT_EQ(writer.bytes_written(), sink.bytes.size());
  table.CommitSnapshot(version);
  *out = sink.bytes;
  return version;
}

}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_TESTS_KERNELS_DYNAMIC_EMBEDDING_SNAPSHOT_IMAGES_H_
