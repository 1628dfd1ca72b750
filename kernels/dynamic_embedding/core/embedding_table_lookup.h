// EmbeddingTable's lookups: Find, FindBatch and the prefetching pipelines that serve them. Part of
// embedding_table.h, which includes it at its end.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_EMBEDDING_TABLE_LOOKUP_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_EMBEDDING_TABLE_LOOKUP_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>

#include "kernels/dynamic_embedding/core/embedding_table.h"
#include "kernels/dynamic_embedding/core/prefetch.h"

namespace tf_ext {
namespace de {

template <typename Key>
inline bool EmbeddingTable<Key>::Find(KeyView key, float* out) const {
  const uint64_t hash = StorageHash(key);
  const Shard& shard = ShardFor(hash);
  bool found = false;
  {
    SharedGuard guard(shard.lock);
    if (const char* entry = FindEntry(shard, key, hash)) {
      std::memcpy(out, EmbeddingOf(entry), sizeof(float) * dim_);
      found = true;
    }
  }
  if (!found) FillInitialRowOf(key, out);
  probes_.fetch_add(1, std::memory_order_relaxed);
  CountLookups(1, found ? 1 : 0);
  return found;
}

template <typename Key>
template <typename KeyAt>
inline int64_t EmbeddingTable<Key>::FindBatch(int64_t n, KeyAt&& key_at, float* out) const {
  return FindBatch(n, key_at, out, dim_);
}
template <typename Key>
template <typename KeyAt>
inline int64_t EmbeddingTable<Key>::FindBatch(int64_t n, KeyAt&& key_at, float* out,
                                              int64_t out_stride, bool* present) const {
  const int64_t found = ServeRows(n, key_at, out, out_stride, present);
  CountLookups(n, found);
  return found;
}
template <typename Key>
template <typename KeyAt>
inline void EmbeddingTable<Key>::FindDistinctBatch(int64_t n, KeyAt&& key_at,
                                                   const int64_t* occurrences, float* out) const {
  std::unique_ptr<bool[]> present(new bool[n]);
  ServeRows(n, key_at, out, dim_, present.get());
  int64_t lookups = 0, hits = 0;
  for (int64_t k = 0; k < n; ++k) {
    lookups += occurrences[k];
    if (present[k]) hits += occurrences[k];
  }
  CountLookups(lookups, hits);
}
template <typename Key>
template <typename KeyAt>
inline int64_t EmbeddingTable<Key>::FindBatchByShardForTesting(int64_t n, KeyAt&& key_at,
                                                               float* out,
                                                               int64_t out_stride) const {
  return FindByShard(n, key_at, out, out_stride > 0 ? out_stride : dim_);
}

template <typename Key>
inline bool EmbeddingTable<Key>::Contains(KeyView key) const {
  const uint64_t hash = StorageHash(key);
  const Shard& shard = ShardFor(hash);
  SharedGuard guard(shard.lock);
  return FindEntry(shard, key, hash) != nullptr;
}

// The key's own hash, not the storage hash: see StorageHash. Computed only for missing keys.
template <typename Key>
inline void EmbeddingTable<Key>::FillInitialRowOf(KeyView key, float* out) const {
  FillInitialRow(init_, InitialRowKeyHash(key), out, dim_);
}

template <typename Key>
inline void EmbeddingTable<Key>::CountLookups(int64_t n, int64_t found) const {
  lookups_.fetch_add(n, std::memory_order_relaxed);
  lookup_hits_.fetch_add(found, std::memory_order_relaxed);
}

// Copies the key's row into `row`, or its initial row when missing; whether it was present.
// Caller holds the shard's lock.
template <typename Key>
inline bool EmbeddingTable<Key>::ServeRow(const Shard& shard, KeyView key, uint64_t hash,
                                          float* row) const {
  if (const char* entry = FindEntry(shard, key, hash)) {
    CopyRow(row, EmbeddingOf(entry));
    return true;
  }
  FillInitialRowOf(key, row);
  return false;
}

// FindBatch's rows (and which keys were present, where `present` is given), found in order or,
// while a bulk write runs, shard by shard; the number found.
template <typename Key>
template <typename KeyAt>
inline int64_t EmbeddingTable<Key>::ServeRows(int64_t n, KeyAt&& key_at, float* out,
                                              int64_t out_stride, bool* present) const {
  probes_.fetch_add(n, std::memory_order_relaxed);
  return bulk_writes_.load(std::memory_order_relaxed) > 0
             ? FindByShard(n, key_at, out, out_stride, present)
             : FindInOrder(n, key_at, out, out_stride, present);
}

// FindBatch's usual way: every shard read-locked (in the order LockAll takes them, so it cannot
// deadlock with it), the keys served in order.
template <typename Key>
template <typename KeyAt>
inline int64_t EmbeddingTable<Key>::FindInOrder(int64_t n, KeyAt&& key_at, float* out,
                                                int64_t out_stride, bool* present) const {
  // A two-stage software pipeline hides the two dependent cache misses of a cold key: the
  // index slot is prefetched kIndexAhead keys ahead, then read and its entry prefetched
  // kEntryAhead keys ahead, so both are in cache when the key's turn comes.
  constexpr int64_t kIndexAhead = 16, kEntryAhead = 8, kRing = 16;
  uint64_t hashes[kRing];
  for (const auto& shard : shards_) shard.lock.lock_shared();
  for (int64_t i = 0; i < std::min(n, kIndexAhead); ++i) {
    hashes[i % kRing] = StorageHash(key_at(i));
    PrefetchIndex(hashes[i % kRing]);
  }
  for (int64_t i = 0; i < std::min(n, kEntryAhead); ++i) PrefetchEntry(hashes[i % kRing]);
  int64_t found = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t hash = hashes[i % kRing];
    if (i + kEntryAhead < n) PrefetchEntry(hashes[(i + kEntryAhead) % kRing]);
    if (i + kIndexAhead < n) {
      hashes[(i + kIndexAhead) % kRing] = StorageHash(key_at(i + kIndexAhead));
      PrefetchIndex(hashes[(i + kIndexAhead) % kRing]);
    }
    const bool hit = ServeRow(ShardFor(hash), key_at(i), hash, out + i * out_stride);
    found += hit;
    if (present != nullptr) present[i] = hit;
  }
  for (const auto& shard : shards_) shard.lock.unlock_shared();
  return found;
}

// FindBatch during a bulk write: the keys grouped by shard, and only the shards of the keys
// in flight held (in ascending order, as LockAll takes them), never all at once: a writer
// holding one shard delays only the lookups that reach it, and a lookup delays a writer only
// while it serves that shard's keys.
template <typename Key>
template <typename KeyAt>
inline int64_t EmbeddingTable<Key>::FindByShard(int64_t n, KeyAt&& key_at, float* out,
                                                int64_t out_stride, bool* present) const {
  const ShardGroups groups = GroupByShard(n, key_at);
  const GroupedKey* keys = groups.keys.get();
  // A two-stage software pipeline over the grouped keys hides the two dependent cache misses
  // of a cold key: the index slot is prefetched kIndexAhead keys ahead, then read and its
  // entry prefetched kEntryAhead keys ahead, so both are in cache when the key's turn comes;
  // the output row with it, as rows are written in shard order, not in key order. A shard is
  // locked when the window reaches its first key, and unlocked after its last.
  constexpr int64_t kIndexAhead = 16, kEntryAhead = 8;
  auto enter = [&](int64_t p) {
    if (p == groups.first[ShardIndex(keys[p].hash)]) ShardFor(keys[p].hash).lock.lock_shared();
    PrefetchIndex(keys[p].hash);
  };
  auto prefetch_entry_and_row = [&](int64_t p) {
    PrefetchEntry(keys[p].hash);
    const char* row = reinterpret_cast<const char*>(out + keys[p].index * out_stride);
    for (size_t line = 0; line < sizeof(float) * dim_; line += 64) {
      PrefetchLine(row + line);
    }
  };
  for (int64_t p = 0; p < std::min(n, kIndexAhead); ++p) enter(p);
  for (int64_t p = 0; p < std::min(n, kEntryAhead); ++p) prefetch_entry_and_row(p);
  int64_t found = 0;
  for (int64_t p = 0; p < n; ++p) {
    if (p + kEntryAhead < n) prefetch_entry_and_row(p + kEntryAhead);
    if (p + kIndexAhead < n) enter(p + kIndexAhead);
    const int64_t i = keys[p].index;
    const uint64_t hash = keys[p].hash;
    const Shard& shard = ShardFor(hash);
    const bool hit = ServeRow(shard, key_at(i), hash, out + i * out_stride);
    found += hit;
    if (present != nullptr) present[i] = hit;
    if (p + 1 == groups.first[ShardIndex(hash) + 1]) shard.lock.unlock_shared();
  }
  return found;
}

// Common widths get a fixed-size copy the compiler inlines, instead of a memcpy call per row.
template <typename Key>
inline void EmbeddingTable<Key>::CopyRow(float* to, const float* from) const {
  switch (dim_) {
    case 8:
      std::memcpy(to, from, 8 * sizeof(float));
      return;
    case 16:
      std::memcpy(to, from, 16 * sizeof(float));
      return;
    case 32:
      std::memcpy(to, from, 32 * sizeof(float));
      return;
    case 64:
      std::memcpy(to, from, 64 * sizeof(float));
      return;
    case 128:
      std::memcpy(to, from, 128 * sizeof(float));
      return;
    default:
      std::memcpy(to, from, dim_ * sizeof(float));
  }
}

// Prefetches, for FindBatch; the caller holds the shard's lock.
template <typename Key>
inline void EmbeddingTable<Key>::PrefetchIndex(uint64_t hash) const {
  const Shard& shard = ShardFor(hash);
  if (!shard.index.empty()) PrefetchLine(&shard.index[HomeSlot(shard, hash)]);
}
// The entry of the home slot's first tag match: the cache lines of its first `bytes` (the header
// and embedding for a lookup, the whole entry for an update: an entry may straddle a line more
// than its size rounded up to lines). Returns whether a tag matched; if not, the key is missing.
template <typename Key>
inline bool EmbeddingTable<Key>::PrefetchEntry(uint64_t hash, size_t bytes) const {
  const Shard& shard = ShardFor(hash);
  if (shard.index.empty()) return false;
  const size_t mask = shard.index.size() - 1;
  for (size_t pos = HomeSlot(shard, hash);; pos = (pos + 1) & mask) {
    const uint64_t slot = shard.index[pos];
    if (slot == 0) return false;
    if (static_cast<uint32_t>(slot >> 32) == Tag(hash)) {
      PrefetchBytes(EntryAt(shard, static_cast<uint32_t>(slot) - 1), bytes);
      return true;
    }
  }
}
template <typename Key>
inline void EmbeddingTable<Key>::PrefetchEntry(uint64_t hash) const {
  PrefetchEntry(hash, sizeof(Header) + sizeof(float) * dim_);
}

}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_EMBEDDING_TABLE_LOOKUP_H_
