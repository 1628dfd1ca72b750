// EmbeddingTable's updates: training updates (UpdateRow, UpdateBatch) with admission and
// bookkeeping, inserts and restores (Upsert), and the optimizer slots entries carry (EnsureSlots).
// Part of embedding_table.h, which includes it at its end.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_EMBEDDING_TABLE_UPDATE_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_EMBEDDING_TABLE_UPDATE_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/dynamic_embedding/core/embedding_table.h"

namespace tf_ext {
namespace de {

template <typename Key>
template <typename Fn>
inline void EmbeddingTable<Key>::Upsert(KeyView key, Fn&& fn) {
  const uint64_t hash = StorageHash(key);
  Shard& shard = ShardFor(hash);
  ExclusiveGuard guard(shard.lock);
  size_t pos;
  const bool created = !FindSlot(shard, key, hash, &pos);
  const uint32_t id = created ? CreateEntry(shard, key, hash) : IdAt(shard, pos);
  MarkChanged(shard, id);
  RowRef row = RowOf(EntryAt(shard, id));
  fn(row, created);
}

template <typename Key>
template <typename Fn>
inline bool EmbeddingTable<Key>::UpdateRow(KeyView key, int64_t step, Fn&& fn) {
  const uint64_t hash = StorageHash(key);
  Shard& shard = ShardFor(hash);
  bool ran;
  AdmissionCounts counts;
  {
    ExclusiveGuard guard(shard.lock);
    ran = UpdateLocked(shard, key, hash, step, fn, &counts);
  }
  AddAdmissionCounts(counts);
  if (ran) RecordStep(step);
  return ran;
}

// The keys are grouped by shard; within a shard, a two-stage software pipeline (as FindInOrder's)
// prefetches the index slot and then the entry of the keys ahead, hiding a cold key's two
// dependent cache misses; for a key found missing there, it prefetches the admission sketch's
// counters that its Increment will read instead.
template <typename Key>
template <typename KeyAt, typename Fn>
inline int64_t EmbeddingTable<Key>::UpdateBatch(int64_t n, KeyAt&& key_at, int64_t step, Fn&& fn) {
  const ShardGroups groups = GroupByShard(n, key_at);
  constexpr int64_t kIndexAhead = 16, kEntryAhead = 8;
  const std::shared_ptr<ChunkArena> arena = std::atomic_load(&arena_);
  int64_t ran = 0;
  AdmissionCounts counts;  // added to the table's once: its atomics are shared by every writer
  for (size_t s = 0; s < shards_.size(); ++s) {
    const GroupedKey* group = groups.keys.get() + groups.first[s];
    const int64_t size = groups.first[s + 1] - groups.first[s];
    if (size == 0) continue;
    PrepareEntries(*arena, size);
    ExclusiveGuard guard(shards_[s].lock);
    const size_t stride = layout_.stride;
    auto prefetch_entry = [&](int64_t p) {
      if (!PrefetchEntry(group[p].hash, stride) && sketch_) sketch_->Prefetch(group[p].hash);
    };
    for (int64_t p = 0; p < std::min(size, kIndexAhead); ++p) PrefetchIndex(group[p].hash);
    for (int64_t p = 0; p < std::min(size, kEntryAhead); ++p) prefetch_entry(p);
    for (int64_t p = 0; p < size; ++p) {
      if (p + kEntryAhead < size) prefetch_entry(p + kEntryAhead);
      if (p + kIndexAhead < size) PrefetchIndex(group[p + kIndexAhead].hash);
      const int64_t i = group[p].index;
      ran += UpdateLocked(
          shards_[s], key_at(i), group[p].hash, step, [&](RowRef& row) { fn(i, row); }, &counts);
    }
  }
  AddAdmissionCounts(counts);
  if (ran > 0) RecordStep(step);
  return ran;
}

template <typename Key>
inline void EmbeddingTable<Key>::InsertOrAssign(KeyView key, const float* embedding) {
  Upsert(key, [&](RowRef& row, bool created) {
    std::memcpy(row.embedding, embedding, sizeof(float) * dim_);
    if (created) *row.last_step = latest_step();
  });
}

// On the caller's thread, shard by shard: each batch of kWriteBatch keys re-takes the shard's
// lock (readers queued behind a batch get in before the next, see RWSpinLock) and restarts the
// prefetching pipeline of UpdateBatch, whose prefetches read the index under the lock.
template <typename Key>
template <typename KeyAt, typename Fn>
inline int64_t EmbeddingTable<Key>::UpsertBatch(int64_t n, KeyAt&& key_at, Fn&& fn) {
  BulkWrite bulk(bulk_writes_);
  const ShardGroups groups = GroupByShard(n, key_at);
  constexpr int64_t kIndexAhead = 16, kEntryAhead = 8;
  const std::shared_ptr<ChunkArena> arena = std::atomic_load(&arena_);
  int64_t created = 0;
  for (size_t s = 0; s < shards_.size(); ++s) {
    Shard& shard = shards_[s];
    const GroupedKey* group = groups.keys.get() + groups.first[s];
    const int64_t size = groups.first[s + 1] - groups.first[s];
    for (int64_t begin = 0; begin < size; begin += kWriteBatch) {
      const int64_t end = std::min<int64_t>(size, begin + kWriteBatch);
      PrepareEntries(*arena, end - begin);
      ExclusiveGuard guard(shard.lock);
      for (int64_t p = begin; p < std::min(end, begin + kIndexAhead); ++p) {
        PrefetchIndex(group[p].hash);
      }
      for (int64_t p = begin; p < std::min(end, begin + kEntryAhead); ++p) {
        PrefetchEntry(group[p].hash, layout_.stride);
      }
      for (int64_t p = begin; p < end; ++p) {
        if (p + kEntryAhead < end) PrefetchEntry(group[p + kEntryAhead].hash, layout_.stride);
        if (p + kIndexAhead < end) PrefetchIndex(group[p + kIndexAhead].hash);
        const int64_t i = group[p].index;
        const KeyView key = key_at(i);
        size_t pos;
        const bool create = !FindSlot(shard, key, group[p].hash, &pos);
        const uint32_t id = create ? CreateEntry(shard, key, group[p].hash) : IdAt(shard, pos);
        MarkChanged(shard, id);
        RowRef row = RowOf(EntryAt(shard, id));
        fn(i, row, create);
        created += create;
      }
    }
  }
  return created;
}

template <typename Key>
template <typename KeyAt>
inline void EmbeddingTable<Key>::InsertOrAssignBatch(int64_t n, KeyAt&& key_at, const float* rows) {
  UpsertBatch(n, key_at, [&](int64_t i, RowRef& row, bool created) {
    std::memcpy(row.embedding, rows + i * dim_, sizeof(float) * dim_);
    if (created) *row.last_step = latest_step();
  });
}

template <typename Key>
inline void EmbeddingTable<Key>::EnsureSlots(int num_slots, const std::vector<float>& slot_init) {
  if (num_slots <= this->num_slots()) return;
  // Moves every entry: waits for a running snapshot, which copies entries out of their chunks.
  std::lock_guard<std::mutex> snapshot_guard(snapshot_mutex_);
  std::lock_guard<std::mutex> layout_guard(layout_mutex_);
  const int old_slots = num_slots_.load(std::memory_order_relaxed);
  if (num_slots <= old_slots) return;
  LockAll();
  const Layout old_layout = layout_;
  std::vector<float> new_init = slot_init_;
  for (int i = old_slots; i < num_slots; ++i) new_init.push_back(slot_init[i]);
  slot_init_ = new_init;
  layout_ = MakeLayout(num_slots);
  const std::shared_ptr<ChunkArena> old_arena = std::atomic_load(&arena_);
  std::atomic_store(&arena_, std::make_shared<ChunkArena>());
  for (auto& shard : shards_) {
    std::vector<char*> old_chunks = std::move(shard.chunks);
    shard.chunks.clear();
    const uint32_t count = shard.allocated;
    for (uint32_t id = 0; id < count; ++id) {
      AllocateChunkFor(shard, id);
      char* from = EntryAt(old_layout, old_chunks, id);
      char* to = EntryAt(shard, id);
      new (to) Header(std::move(*reinterpret_cast<Header*>(from)));
      reinterpret_cast<Header*>(from)->~Header();
      std::memcpy(to + sizeof(Header), from + sizeof(Header),
                  sizeof(float) * dim_ * (1 + old_slots));
      float* slots = reinterpret_cast<float*>(to + sizeof(Header)) + dim_;
      for (int s = old_slots; s < num_slots; ++s) {
        std::fill(slots + s * dim_, slots + (s + 1) * dim_, slot_init_[s]);
      }
    }
  }
  num_slots_.store(num_slots, std::memory_order_release);
  UnlockAll();
}

// UpdateRow's work under the shard's exclusive lock, which the caller holds. Counts an admission
// or a rejection in `counts`, for the caller to add to the table's (AddAdmissionCounts).
template <typename Key>
template <typename Fn>
inline bool EmbeddingTable<Key>::UpdateLocked(Shard& shard, KeyView key, uint64_t hash,
                                              int64_t step, Fn&& fn, AdmissionCounts* counts) {
  size_t pos;
  uint32_t id;
  if (FindSlot(shard, key, hash, &pos)) {
    id = IdAt(shard, pos);
  } else {
    if (!Admit(shard, key, hash)) {
      ++counts->rejected;
      return false;
    }
    id = CreateEntry(shard, key, hash);
    ++counts->admitted;
  }
  MarkChanged(shard, id);
  RowRef row = RowOf(EntryAt(shard, id));
  fn(row);
  if (*row.update_count != std::numeric_limits<uint32_t>::max()) ++*row.update_count;
  *row.last_step = step;
  return true;
}

template <typename Key>
inline void EmbeddingTable<Key>::AddAdmissionCounts(const AdmissionCounts& counts) {
  if (counts.admitted > 0) admitted_.fetch_add(counts.admitted, std::memory_order_relaxed);
  if (counts.rejected > 0) rejected_.fetch_add(counts.rejected, std::memory_order_relaxed);
}

// The latest training step any update recorded (what evict() uses by default).
template <typename Key>
inline void EmbeddingTable<Key>::RecordStep(int64_t step) {
  int64_t latest = latest_step_.load(std::memory_order_relaxed);
  while (step > latest &&
         !latest_step_.compare_exchange_weak(latest, step, std::memory_order_relaxed)) {
  }
}

// Whether a missing key's update creates its row; counts the update if not. Caller holds the
// shard's exclusive lock.
template <typename Key>
inline bool EmbeddingTable<Key>::Admit(Shard& shard, KeyView key, uint64_t hash) {
  if (admission_.min_count <= 1) return true;
  if (sketch_) return sketch_->Increment(hash) >= admission_.min_count;
  if (!shard.pending) shard.pending = std::make_unique<std::unordered_map<Key, uint32_t>>();
  auto it = shard.pending->try_emplace(Key(key), 0).first;
  if (++it->second < admission_.min_count) return false;
  shard.pending->erase(it);
  return true;
}

}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_EMBEDDING_TABLE_UPDATE_H_
