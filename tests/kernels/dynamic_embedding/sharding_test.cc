// Sharding by id: the frozen shard function (golden values), its balance, its independence from
// the table's own storage hash, and the manifest of sharded checkpoints.
#include "kernels/dynamic_embedding/core/sharding.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kernels/dynamic_embedding/core/embedding_table.h"

namespace tf_ext {
namespace de {
namespace {

// Frozen (see ShardOfHash): a change here would drop rows when a sharded checkpoint restores
// into the same number of shards. Recorded when sharding was added.
TEST(ShardOf, GoldenValues) {
  const int64_t keys[] = {0,
                          1,
                          -1,
                          42,
                          1000000000000000,
                          std::numeric_limits<int64_t>::min(),
                          std::numeric_limits<int64_t>::max()};
  const std::vector<int> expected2 = {1, 0, 0, 1, 0, 1, 1};
  const std::vector<int> expected3 = {1, 0, 1, 2, 1, 2, 2};
  const std::vector<int> expected1000 = {507, 93, 432, 791, 422, 959, 897};
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(ShardOf(keys[i], 2), expected2[i]) << keys[i];
    EXPECT_EQ(ShardOf(keys[i], 3), expected3[i]) << keys[i];
    EXPECT_EQ(ShardOf(keys[i], 1000), expected1000[i]) << keys[i];
    EXPECT_EQ(ShardOf(keys[i], 1), 0);
  }
  EXPECT_EQ(ShardOf(std::string_view(""), 7), 1);
  EXPECT_EQ(ShardOf(std::string_view("a"), 7), 4);
  EXPECT_EQ(ShardOf(std::string_view("user:1234567890/item:abcdefghijklmnopqrstuvwxyz"), 7), 4);
}

TEST(ShardOf, BalancedOverConsecutiveAndStridedIds) {
  for (int n : {2, 3, 8, 13}) {
    for (int64_t stride : {int64_t{1}, int64_t{64}, int64_t{1} << 32}) {
      std::vector<int> counts(n);
      const int total = 60000;
      for (int64_t i = 0; i < total; ++i) ++counts[ShardOf(i * stride, n)];
      for (int s = 0; s < n; ++s) {
        EXPECT_NEAR(counts[s], total / n, 0.05 * total / n) << "n=" << n << " stride=" << stride;
      }
    }
  }
}

// The ids of one shard must still spread over the table's internal shards and slots (the low bits
// of StorageHash): the routing is not a function of those bits.
TEST(ShardOf, IndependentOfStorageHash) {
  std::vector<int> low_bits(64);
  int in_shard = 0;
  for (int64_t key = 0; key < 64000; ++key) {
    if (ShardOf(key, 2) != 0) continue;
    ++in_shard;
    ++low_bits[StorageHash(key) & 63];
  }
  for (int count : low_bits) EXPECT_NEAR(count, in_shard / 64.0, 0.2 * in_shard / 64.0);
}

TEST(ShardManifest, ParsesWhatPythonWrites) {
  std::vector<std::string> suffixes;
  const std::string manifest =
      std::string(kShardManifestHeader) + "2\n.data-tabcd-of-01234\n.data-t0000-of-fffff\n";
  ASSERT_TRUE(IsShardManifest(manifest));
  EXPECT_EQ(ParseShardManifest(manifest, &suffixes), "");
  EXPECT_EQ(suffixes, (std::vector<std::string>{".data-tabcd-of-01234", ".data-t0000-of-fffff"}));
}

TEST(ShardManifest, LinesAreSuffixesOrWholePaths) {
  EXPECT_EQ(ShardFilePath("/ckpt/model-5", ".data-tabcd-of-01234"),
            "/ckpt/model-5.data-tabcd-of-01234");
  EXPECT_EQ(ShardFilePath("ckpt/model-5", ".data-tabcd-of-01234"),
            "ckpt/model-5.data-tabcd-of-01234");
  // A table split across ranks lists each rank's file beside that rank's own checkpoint.
  EXPECT_EQ(ShardFilePath("/ckpt/rank_0/model-5", "/ckpt/rank_1/model-5.data-tabcd-of-01234"),
            "/ckpt/rank_1/model-5.data-tabcd-of-01234");
  EXPECT_EQ(ShardFilePath("gs://b/rank_0/m", "gs://b/rank_1/m.data-t0000-of-fffff"),
            "gs://b/rank_1/m.data-t0000-of-fffff");
}

TEST(ShardManifest, RejectsMalformed) {
  std::vector<std::string> suffixes;
  const std::string head(kShardManifestHeader);
  EXPECT_FALSE(IsShardManifest("TFEXTSNP..."));
  EXPECT_NE(ParseShardManifest("TFEXTSNP", &suffixes), "");
  EXPECT_NE(ParseShardManifest(head, &suffixes), "");                  // no count
  EXPECT_NE(ParseShardManifest(head + "2\n.a\n", &suffixes), "");      // too few files
  EXPECT_NE(ParseShardManifest(head + "1\n.a\n.b\n", &suffixes), "");  // too many
  EXPECT_NE(ParseShardManifest(head + "x\n.a\n", &suffixes), "");
  EXPECT_NE(ParseShardManifest(head + "0\n", &suffixes), "");
  EXPECT_NE(ParseShardManifest(head + "99999999999999999999\n", &suffixes), "");
  EXPECT_NE(ParseShardManifest(head + "1\n.a", &suffixes), "");  // truncated
}

// Checks GroupDistinctKeysByShard's contract on `keys`: every key is found at its position, the
// distinct keys are distinct and grouped by shard in shard order, each shard's in order of first
// occurrence, and the counts are the groups' sizes.
template <typename Key>
void ExpectGroupedByShard(const std::vector<Key>& keys, int num_shards) {
  std::vector<Key> distinct;
  std::vector<int32_t> positions(keys.size(), -1);
  std::vector<int32_t> counts(num_shards, -1);
  GroupDistinctKeysByShard(
      static_cast<int64_t>(keys.size()), num_shards, [&keys](int64_t i) { return keys[i]; },
      &distinct, positions.data(), counts.data());
  std::vector<Key> expected;  // first occurrences, then a stable sort by shard
  for (const Key& key : keys) {
    if (std::find(expected.begin(), expected.end(), key) == expected.end()) expected.push_back(key);
  }
  std::stable_sort(expected.begin(), expected.end(), [num_shards](const Key& a, const Key& b) {
    return ShardOf(a, num_shards) < ShardOf(b, num_shards);
  });
  EXPECT_EQ(distinct, expected);
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_GE(positions[i], 0);
    ASSERT_LT(positions[i], static_cast<int32_t>(distinct.size()));
    EXPECT_EQ(distinct[positions[i]], keys[i]) << i;
  }
  std::vector<int32_t> expected_counts(num_shards, 0);
  for (const Key& key : distinct) ++expected_counts[ShardOf(key, num_shards)];
  EXPECT_EQ(counts, expected_counts);
}

TEST(GroupDistinctKeysByShard, GroupsRepeatedIntKeysByShardInFirstOccurrenceOrder) {
  std::vector<int64_t> keys;
  for (int64_t i = 0; i < 5000; ++i) keys.push_back((i * i) % 997 - 300);  // repeats, negatives
  keys.push_back(std::numeric_limits<int64_t>::min());
  keys.push_back(std::numeric_limits<int64_t>::max());
  for (int num_shards : {1, 2, 3, 4, 13}) ExpectGroupedByShard(keys, num_shards);
  ExpectGroupedByShard(std::vector<int64_t>{}, 4);
  ExpectGroupedByShard(std::vector<int64_t>{7, 7, 7}, 4);
}

TEST(GroupDistinctKeysByShard, GroupsStringKeysComparedWhole) {
  std::vector<std::string> keys = {"", "a", "b", "a", std::string("a\0b", 3), "", "user:12"};
  for (int i = 0; i < 300; ++i) keys.push_back("id" + std::to_string(i % 71));
  for (int num_shards : {1, 2, 4, 7}) ExpectGroupedByShard(keys, num_shards);
}

}  // namespace
}  // namespace de
}  // namespace tf_ext
