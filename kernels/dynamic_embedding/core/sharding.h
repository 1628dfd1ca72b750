// Splitting one logical table into shards by id (tf_ext/dynamic_embedding/sharded.py): which shard
// owns an id, and the manifest file that lists a sharded table's snapshot files in a checkpoint.
// No TensorFlow types.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_SHARDING_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_SHARDING_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/dynamic_embedding/core/combiners.h"  // IndexDistinctKeys
#include "kernels/dynamic_embedding/core/initializers.h"
#include "kernels/dynamic_embedding/core/limits.h"  // kMaxShards

namespace tf_ext {
namespace de {

// The shard of a key whose InitialRowKeyHash is `key_hash`, in [0, num_shards). FROZEN: a
// checkpoint saved with N shards is restored into N shards by reading only file i for shard i,
// so changing this function would drop rows on restore. tests/kernels/dynamic_embedding/
// sharding_test.cc pins its values. The hash is salted and mixed again so that the shard is
// independent of the table's own StorageHash (whose low bits pick the table's internal shard and
// slot): otherwise every table shard would use only part of its index.
inline int ShardOfHash(uint64_t key_hash, int num_shards) {
  const uint64_t mixed = Mix64(key_hash ^ 0xd1b54a32d192ed03ULL);
  // The high bits, scaled (Lemire's multiply-shift): no modulo bias and no division.
  return static_cast<int>(
      (static_cast<unsigned __int128>(mixed) * static_cast<uint64_t>(num_shards)) >> 64);
}
inline int ShardOf(int64_t key, int num_shards) {
  return ShardOfHash(InitialRowKeyHash(key), num_shards);
}
inline int ShardOf(std::string_view key, int num_shards) {
  return ShardOfHash(InitialRowKeyHash(key), num_shards);
}

// A batch's distinct keys grouped by shard, ready to send each shard its keys in one all-to-all
// (a table split across ranks: tf_ext/dynamic_embedding/alltoall.py): *distinct holds shard 0's
// keys, then shard 1's, and so on, each shard's in order of first occurrence; positions[i] is key
// i's place in *distinct, and counts[s] the number of shard s's keys. One pass over the keys and
// one ShardOf per distinct key, where unique, shard, argsort and gather ops made five.
// Slot: an integer type that holds n - 1.
template <typename Key, typename KeyAt, typename Slot>
void GroupDistinctKeysByShard(int64_t n, int num_shards, KeyAt&& key_at, std::vector<Key>* distinct,
                              Slot* positions, int32_t* counts) {
  std::vector<Key> first_seen;
  IndexDistinctKeys(n, key_at, &first_seen, positions);
  const size_t num_distinct = first_seen.size();
  std::vector<int32_t> shard(num_distinct);
  std::fill(counts, counts + num_shards, 0);
  for (size_t k = 0; k < num_distinct; ++k) {
    shard[k] = ShardOf(first_seen[k], num_shards);
    ++counts[shard[k]];
  }
  std::vector<Slot> next(num_shards);  // where each shard's next key goes
  for (int s = 1; s < num_shards; ++s) next[s] = next[s - 1] + static_cast<Slot>(counts[s - 1]);
  std::vector<Slot> grouped(num_distinct);  // first_seen[k]'s place in *distinct
  distinct->resize(num_distinct);
  for (size_t k = 0; k < num_distinct; ++k) {
    grouped[k] = next[shard[k]]++;
    (*distinct)[grouped[k]] = std::move(first_seen[k]);
  }
  for (int64_t i = 0; i < n; ++i) positions[i] = grouped[positions[i]];
}

// The manifest a sharded table writes where a plain table writes its snapshot file, so that a
// restore finds either kind at the same path:
//   "tf_ext sharded table 1\n" <number of shards> "\n" then one line per shard: its file's name,
//   relative to the checkpoint prefix (a suffix), in shard order; or its whole path (absolute or
//   a URL), where each shard was saved beside a checkpoint of its own (a table split across
//   ranks: tf_ext/dynamic_embedding/alltoall.py).
// Written by tf_ext/dynamic_embedding/checkpoint.py (MANIFEST_HEADER).
constexpr std::string_view kShardManifestHeader = "tf_ext sharded table 1\n";

inline bool IsShardManifest(std::string_view bytes) {
  return bytes.substr(0, kShardManifestHeader.size()) == kShardManifestHeader;
}

// Parses a manifest into its shards' suffixes; returns a description of what is wrong, or "".
inline std::string ParseShardManifest(std::string_view bytes, std::vector<std::string>* suffixes) {
  if (!IsShardManifest(bytes)) return "not a sharded table manifest";
  bytes.remove_prefix(kShardManifestHeader.size());
  std::vector<std::string_view> lines;
  while (!bytes.empty()) {
    const size_t end = bytes.find('\n');
    if (end == std::string_view::npos) return "the manifest is truncated (no final newline)";
    lines.push_back(bytes.substr(0, end));
    bytes.remove_prefix(end + 1);
  }
  if (lines.empty()) return "the manifest has no shard count";
  int64_t count = 0;
  for (char c : lines[0]) {
    if (c < '0' || c > '9' || count > kMaxShards)
      return "the manifest's shard count is not a number";
    count = count * 10 + (c - '0');
  }
  if (lines[0].empty() || count < 1 || count > kMaxShards) {
    return "the manifest's shard count is outside [1, " + std::to_string(kMaxShards) + "]";
  }
  if (static_cast<int64_t>(lines.size()) != count + 1) {
    return "the manifest lists " + std::to_string(lines.size() - 1) + " files for " +
           std::to_string(count) + " shards";
  }
  suffixes->assign(lines.begin() + 1, lines.end());
  return "";
}

// The file a manifest line names, for a checkpoint at `prefix` (see above).
inline std::string ShardFilePath(std::string_view prefix, std::string_view line) {
  const bool whole_path =
      (!line.empty() && line[0] == '/') || line.find("://") != std::string_view::npos;
  return whole_path ? std::string(line) : std::string(prefix) + std::string(line);
}

}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_SHARDING_H_
