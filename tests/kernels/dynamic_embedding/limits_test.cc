// The documented limits (core/limits.h): each check at its limit (accepted) and one past it (an
// error naming the table, the value and the limit), and the snapshot file's size limit as the
// writer and the reader enforce it. Limits too large to reach in a test are checked through their
// check functions, or through a file header that claims the size.
#include "kernels/dynamic_embedding/core/limits.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/dynamic_embedding/core/snapshot_file.h"
#include "tests/kernels/dynamic_embedding/string_bytes.h"

namespace tf_ext {
namespace de {
namespace {

// An error of the table 'clicks' that states the value and the limit.
void ExpectOver(const std::string& error, const std::string& value, const std::string& limit) {
  EXPECT_NE(error.find("dynamic embedding table 'clicks'"), std::string::npos) << error;
  EXPECT_NE(error.find(value), std::string::npos) << error;
  EXPECT_NE(error.find(limit), std::string::npos) << error;
}

TEST(LimitsTest, Dim) {
  EXPECT_EQ(CheckDim("clicks", kMaxDim), "");
  EXPECT_EQ(CheckDim("clicks", 1), "");
  ExpectOver(CheckDim("clicks", kMaxDim + 1), "got 4097", "[1, 4096]");
  ExpectOver(CheckDim("clicks", 0), "got 0", "[1, 4096]");
}

TEST(LimitsTest, Shards) {
  EXPECT_EQ(CheckShards("clicks", kMaxShards), "");
  EXPECT_EQ(CheckShards("clicks", 1), "");
  ExpectOver(CheckShards("clicks", kMaxShards + 1), "got 65537", "[1, 65536]");
  ExpectOver(CheckShards("clicks", 0), "got 0", "[1, 65536]");
}

TEST(LimitsTest, KeyBytes) {
  EXPECT_EQ(CheckKeyBytes("clicks", 3, kMaxKeyBytes), "");
  ExpectOver(CheckKeyBytes("clicks", 3, kMaxKeyBytes + 1), "key 3 of 1048577 bytes",
             "limit of 1048576 bytes");
}

TEST(LimitsTest, IdsPerCall) {
  EXPECT_EQ(CheckIdsPerCall("clicks", kMaxIdsPerCall), "");
  ExpectOver(CheckIdsPerCall("clicks", kMaxIdsPerCall + 1), "2147483648 ids",
             "limit of 2147483647 ids per call");
}

TEST(LimitsTest, TableRows) {
  EXPECT_EQ(CheckTableRows("clicks", kMaxTableRows - 10, 10), "");
  EXPECT_EQ(CheckTableRows("clicks", kMaxTableRows, 0), "");
  EXPECT_EQ(CheckTableRows("clicks", 0, kMaxTableRows), "");
  ExpectOver(CheckTableRows("clicks", kMaxTableRows - 10, 11), "2147483649 rows",
             "limit of 2147483648 rows");
  ExpectOver(CheckTableRows("clicks", 0, kMaxTableRows + 1), "2147483649 rows",
             "limit of 2147483648 rows");
}

// Near the limit only the distinct keys the table lacks count (here a limit of 10 rows, held:
// 0..7).
TEST(LimitsTest, RowsFitCountsOnlyNewDistinctKeysNearTheLimit) {
  auto contains = [](int64_t key) { return key >= 0 && key < 8; };
  auto fit = [&](std::vector<int64_t> keys) {
    return CheckRowsFit(
        "clicks", 8, static_cast<int64_t>(keys.size()), contains,
        [&keys](int64_t i) { return keys[i]; }, /*max_rows=*/10);
  };
  EXPECT_EQ(fit({8, 9}), "");
  EXPECT_EQ(fit({1, 2, 3, 8, 9, 9, 8, 4}), "");  // at the limit: 10 rows
  ExpectOver(fit({1, 8, 9, 10}), "would hold 11 rows", "limit of 10 rows");
  EXPECT_EQ(CheckRowsFit(
                "clicks", kMaxTableRows - 2, 2, [](int64_t) { return false; },
                [](int64_t i) { return i; }),
            "");
  ExpectOver(CheckRowsFit(
                 "clicks", kMaxTableRows - 2, 3, [](int64_t) { return false; },
                 [](int64_t i) { return i; }),
             "would hold 2147483649 rows", "limit of 2147483648 rows");
}

TEST(LimitsTest, SnapshotFileBytes) {
  EXPECT_EQ(CheckSnapshotFileBytes("clicks", kMaxSnapshotFileBytes), "");
  ExpectOver(CheckSnapshotFileBytes("clicks", kMaxSnapshotFileBytes + 1), "1099511627777 bytes",
             "limit of 1099511627776 bytes");
}

SnapshotHeader Header(SnapshotKeyType key_type, uint64_t rows) {
  SnapshotHeader header;
  header.key_type = key_type;
  header.dim = 2;
  header.rows = rows;
  header.table_name = "clicks";
  return header;
}

// A file of rows with keys 0..rows-1 (int64), written under `max_bytes`; "" if refused.
std::string WriteInt64Rows(int rows, uint64_t max_bytes, bool* over_limit) {
  StringSink sink;
  SnapshotWriter writer(&sink, max_bytes);
  const float values[2] = {1.0f, 2.0f};
  bool ok = writer.Begin(Header(SnapshotKeyType::kInt64, rows));
  for (int64_t key = 0; ok && key < rows; ++key) ok = writer.Row(key, 1, 5, values, values);
  ok = ok && writer.Finish();
  *over_limit = writer.over_limit();
  EXPECT_LE(sink.bytes.size(), max_bytes);
  return ok ? sink.bytes : "";
}

std::string ReadAll(const std::string& file, uint64_t max_bytes, int64_t* rows_read) {
  StringSource source(file);
  SnapshotReader reader(&source, max_bytes);
  SnapshotHeader header;
  std::string problem = reader.ReadHeader(&header);
  if (!problem.empty()) return problem;
  *rows_read = 0;
  auto int64_row = [&](int64_t, uint32_t, int64_t, const float*) {
    ++*rows_read;
    return true;
  };
  auto string_row = [&](std::string_view, uint32_t, int64_t, const float*) {
    ++*rows_read;
    return true;
  };
  return reader.ReadRecords([](int64_t) { return true; }, int64_row,
                            [](std::string_view) { return true; }, string_row);
}

// A file of 3000 rows spans several blocks; its exact size is the largest limit it fits.
TEST(SnapshotFileLimitTest, WriterWritesAFileAtTheLimitAndRefusesOnePast) {
  bool over_limit = true;
  const std::string file = WriteInt64Rows(3000, kMaxSnapshotFileBytes, &over_limit);
  ASSERT_FALSE(file.empty());
  EXPECT_FALSE(over_limit);
  EXPECT_LE(MinimumSnapshotBytes(Header(SnapshotKeyType::kInt64, 3000)), file.size());

  EXPECT_EQ(WriteInt64Rows(3000, file.size(), &over_limit), file);
  EXPECT_FALSE(over_limit);
  EXPECT_EQ(WriteInt64Rows(3000, file.size() - 1, &over_limit), "");
  EXPECT_TRUE(over_limit);
}

TEST(SnapshotFileLimitTest, ReaderReadsAFileAtTheLimitAndRefusesOnePast) {
  bool over_limit;
  const std::string file = WriteInt64Rows(3000, kMaxSnapshotFileBytes, &over_limit);
  int64_t rows = 0;
  EXPECT_EQ(ReadAll(file, file.size(), &rows), "");
  EXPECT_EQ(rows, 3000);
  const std::string problem = ReadAll(file, file.size() - 1, &rows);
  EXPECT_NE(problem.find("over the limit of " + std::to_string(file.size() - 1) + " bytes"),
            std::string::npos)
      << problem;
}

// The largest row count whose header's claim is within kMaxSnapshotFileBytes.
uint64_t RowsAtTheLimit(SnapshotKeyType key_type) {
  const uint64_t empty = MinimumSnapshotBytes(Header(key_type, 0));
  const uint64_t per_row = MinimumSnapshotBytes(Header(key_type, 1)) - empty;
  return (kMaxSnapshotFileBytes - empty) / per_row;
}

// The header of a file claiming `rows` rows, and nothing after it (the writer's own limit lifted).
std::string HeaderClaiming(SnapshotKeyType key_type, uint64_t rows) {
  StringSink sink;
  SnapshotWriter writer(&sink, /*max_bytes=*/~uint64_t{0});
  EXPECT_TRUE(writer.Begin(Header(key_type, rows)));
  return sink.bytes;
}

TEST(SnapshotFileLimitTest, ReaderRefusesAHeaderClaimingMoreBeforeReadingRecords) {
  for (SnapshotKeyType key_type : {SnapshotKeyType::kInt64, SnapshotKeyType::kString}) {
    const uint64_t rows = RowsAtTheLimit(key_type);
    EXPECT_LE(MinimumSnapshotBytes(Header(key_type, rows)), kMaxSnapshotFileBytes);
    EXPECT_GT(MinimumSnapshotBytes(Header(key_type, rows + 1)), kMaxSnapshotFileBytes);

    const std::string at_limit = HeaderClaiming(key_type, rows);
    StringSource source(at_limit);
    SnapshotReader reader(&source);
    SnapshotHeader header;
    EXPECT_EQ(reader.ReadHeader(&header), "");
    EXPECT_EQ(header.rows, rows);

    const std::string past = HeaderClaiming(key_type, rows + 1);
    StringSource past_source(past);
    SnapshotReader past_reader(&past_source);
    const std::string problem = past_reader.ReadHeader(&header);
    EXPECT_NE(problem.find("its header claims at least"), std::string::npos) << problem;
    EXPECT_NE(problem.find("over the limit of 1099511627776 bytes"), std::string::npos) << problem;
  }
}

TEST(SnapshotFileLimitTest, WriterRefusesAHeaderClaimingMoreBeforeWritingAnything) {
  const uint64_t rows = RowsAtTheLimit(SnapshotKeyType::kInt64);
  StringSink sink;
  SnapshotWriter writer(&sink);
  EXPECT_FALSE(writer.Begin(Header(SnapshotKeyType::kInt64, rows + 1)));
  EXPECT_TRUE(writer.over_limit());
  EXPECT_GT(writer.over_limit_bytes(), kMaxSnapshotFileBytes);
  EXPECT_EQ(sink.bytes.size(), 0u);
}

TEST(SnapshotFileLimitTest, HeaderClaimsSaturateInsteadOfOverflowing) {
  SnapshotHeader header = Header(SnapshotKeyType::kInt64, ~uint64_t{0});
  header.dim = 1 << 16;
  EXPECT_EQ(MinimumSnapshotBytes(header), ~uint64_t{0});
}

// A string key of kMaxKeyBytes is read back; one byte more is refused (the kernels refuse such a
// key before it reaches a table, so no checkpoint holds one).
TEST(SnapshotFileLimitTest, StringKeysUpToTheLimitAreRead) {
  for (int64_t length : {kMaxKeyBytes, kMaxKeyBytes + 1}) {
    StringSink sink;
    SnapshotWriter writer(&sink);
    const float values[2] = {1.0f, 2.0f};
    ASSERT_TRUE(writer.Begin(Header(SnapshotKeyType::kString, 1)));
    ASSERT_TRUE(writer.Row(std::string_view(std::string(length, 'k')), 1, 5, values, values));
    ASSERT_TRUE(writer.Finish());
    int64_t rows = 0;
    const std::string problem = ReadAll(sink.bytes, kMaxSnapshotFileBytes, &rows);
    if (length == kMaxKeyBytes) {
      EXPECT_EQ(problem, "");
      EXPECT_EQ(rows, 1);
    } else {
      EXPECT_EQ(problem, "corrupt record");
    }
  }
}

}  // namespace
}  // namespace de
}  // namespace tf_ext
