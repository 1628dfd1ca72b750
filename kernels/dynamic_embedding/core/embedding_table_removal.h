// EmbeddingTable's removals: of given keys (Remove, RemoveBatch), of everything (Clear), and of
// the rows eviction criteria condemn (Evict), in short batches that let lookups through. Part of
// embedding_table.h, which includes it at its end.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_EMBEDDING_TABLE_REMOVAL_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_EMBEDDING_TABLE_REMOVAL_H_

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <vector>

#include "kernels/dynamic_embedding/core/embedding_table.h"

namespace tf_ext {
namespace de {

template <typename Key>
inline bool EmbeddingTable<Key>::Remove(KeyView key) {
  const uint64_t hash = StorageHash(key);
  Shard& shard = ShardFor(hash);
  ExclusiveGuard guard(shard.lock);
  size_t pos;
  if (!FindSlot(shard, key, hash, &pos)) return false;
  RemoveAt(shard, pos);
  return true;
}

template <typename Key>
template <typename KeyAt>
inline int64_t EmbeddingTable<Key>::RemoveBatch(int64_t n, KeyAt&& key_at) {
  BulkWrite bulk(bulk_writes_);
  const ShardGroups groups = GroupByShard(n, key_at);
  int64_t removed = 0;
  for (size_t s = 0; s < shards_.size(); ++s) {
    const GroupedKey* group = groups.keys.get() + groups.first[s];
    removed += RemoveInBatches(
        shards_[s], groups.first[s + 1] - groups.first[s],
        [&](int64_t j) { return key_at(group[j].index); }, [&](int64_t j) { return group[j].hash; },
        [](const char*) { return true; });
  }
  return removed;
}

template <typename Key>
inline void EmbeddingTable<Key>::Clear() {
  std::lock_guard<std::mutex> snapshot_guard(snapshot_mutex_);  // frees what a snapshot copies
  LockAll();
  for (auto& shard : shards_) {
    DestroyEntries(shard);
    shard = Shard();
  }
  std::atomic_store(&arena_, std::make_shared<ChunkArena>());
  size_.store(0, std::memory_order_relaxed);
  tracking_.store(false, std::memory_order_relaxed);
  UnlockAll();
}

template <typename Key>
inline int64_t EmbeddingTable<Key>::Evict(const EvictionCriteria& criteria) {
  std::lock_guard<std::mutex> evict_guard(evict_mutex_);
  int64_t removed = 0;
  if (criteria.ttl_steps > 0 || criteria.min_frequency > 0 || criteria.min_l2_norm > 0) {
    for (auto& shard : shards_) {
      auto condemned = [&](const char* entry) { return Condemned(criteria, entry); };
      removed += EvictFromShard(shard, condemned, condemned);
    }
  }
  const int64_t excess = Size() - criteria.max_size;
  if (criteria.max_size > 0 && excess > 0) removed += EvictLeastRecent(excess);
  evicted_.fetch_add(removed, std::memory_order_relaxed);
  return removed;
}

template <typename Key>
inline bool EmbeddingTable<Key>::Condemned(const EvictionCriteria& c, const char* entry) const {
  const Header* header = HeaderOf(entry);
  return de::Condemned(c, header->last_step, header->update_count, EmbeddingOf(entry), dim_);
}

// Removes the shard's entries that select(entry) picks under the read lock and that still
// pass recheck(entry) under the exclusive lock (see Evict).
template <typename Key>
template <typename Select, typename Recheck>
inline int64_t EmbeddingTable<Key>::EvictFromShard(Shard& shard, Select&& select,
                                                   Recheck&& recheck) {
  std::vector<Key> victims;
  {
    SharedGuard guard(shard.lock);
    ForEachLiveEntry(shard, [&](uint32_t, char* entry) {
      if (select(static_cast<const char*>(entry))) victims.push_back(KeyOf(entry));
      return true;
    });
  }
  BulkWrite bulk(bulk_writes_);
  return RemoveInBatches(
      shard, static_cast<int64_t>(victims.size()), [&](int64_t i) { return KeyView(victims[i]); },
      [&](int64_t i) { return StorageHash(KeyView(victims[i])); }, recheck);
}

// Removes the entries of keys key_at(0..n-1) of this shard (hash_at(i): their StorageHash)
// that still pass recheck(entry), in batches of kWriteBatch per hold of the shard's exclusive
// lock. Lookups meanwhile take the shards one at a time (see FindBatch, while the caller counts
// a BulkWrite), and those that queue behind a batch get in before the next one takes the
// lock (RWSpinLock hands over fairly).
template <typename Key>
template <typename KeyAt, typename HashAt, typename Recheck>
inline int64_t EmbeddingTable<Key>::RemoveInBatches(Shard& shard, int64_t n, KeyAt&& key_at,
                                                    HashAt&& hash_at, Recheck&& recheck) {
  int64_t removed = 0;
  for (int64_t begin = 0; begin < n; begin += kWriteBatch) {
    ExclusiveGuard guard(shard.lock);
    for (int64_t i = begin; i < std::min<int64_t>(n, begin + kWriteBatch); ++i) {
      size_t pos;
      if (!FindSlot(shard, key_at(i), hash_at(i), &pos)) continue;
      if (!recheck(static_cast<const char*>(EntryAt(shard, IdAt(shard, pos))))) continue;
      RemoveAt(shard, pos);
      ++removed;
    }
  }
  return removed;
}

// Removes the `excess` least recently updated rows (smallest last step; ties in storage
// order). The cutoff step is found in bounded memory: a 65536-bucket histogram of last steps,
// then the exact steps of the one bucket it falls in.
template <typename Key>
inline int64_t EmbeddingTable<Key>::EvictLeastRecent(int64_t excess) {
  int64_t lowest = std::numeric_limits<int64_t>::max();
  int64_t highest = std::numeric_limits<int64_t>::min();
  ForEachLastStep([&](int64_t step) {
    lowest = std::min(lowest, step);
    highest = std::max(highest, step);
  });
  if (lowest > highest) return 0;
  constexpr uint64_t kBuckets = 65536;
  const uint64_t span = static_cast<uint64_t>(highest) - static_cast<uint64_t>(lowest) + 1;
  const uint64_t width = (span + kBuckets - 1) / kBuckets;
  auto bucket_of = [&](int64_t step) {
    return (static_cast<uint64_t>(step) - static_cast<uint64_t>(lowest)) / width;
  };
  std::vector<int64_t> histogram(kBuckets, 0);
  ForEachLastStep([&](int64_t step) { ++histogram[bucket_of(step)]; });
  int64_t below = 0;
  uint64_t bucket = 0;
  while (bucket + 1 < kBuckets && below + histogram[bucket] < excess) {
    below += histogram[bucket++];
  }
  int64_t cutoff = lowest + static_cast<int64_t>(bucket * width);
  if (width > 1) {  // the exact steps of that bucket
    std::vector<int64_t> steps;
    ForEachLastStep([&](int64_t step) {
      if (bucket_of(step) == bucket) steps.push_back(step);
    });
    const size_t nth = std::min<size_t>(excess - below - 1, steps.size() - 1);
    std::nth_element(steps.begin(), steps.begin() + nth, steps.end());
    cutoff = steps[nth];
    below += std::count_if(steps.begin(), steps.end(), [&](int64_t s) { return s < cutoff; });
  }
  // Every row older than the cutoff goes, and as many at the cutoff as are still in excess.
  // A row updated since it was picked is spared.
  int64_t at_cutoff = excess - below;
  int64_t removed = 0;
  for (auto& shard : shards_) {
    removed += EvictFromShard(
        shard,
        [&](const char* entry) {
          const int64_t step = HeaderOf(entry)->last_step;
          return step < cutoff || (step == cutoff && at_cutoff-- > 0);
        },
        [&](const char* entry) { return HeaderOf(entry)->last_step <= cutoff; });
  }
  return removed;
}

template <typename Key>
template <typename Fn>
inline void EmbeddingTable<Key>::ForEachLastStep(Fn&& fn) const {
  for (const auto& shard : shards_) {
    SharedGuard guard(shard.lock);
    ForEachLiveEntry(shard, [&](uint32_t, char* entry) {
      fn(HeaderOf(entry)->last_step);
      return true;
    });
  }
}

}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_EMBEDDING_TABLE_REMOVAL_H_
