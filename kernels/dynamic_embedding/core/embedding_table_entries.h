// EmbeddingTable's shards: where an entry lives, finding a key's index slot, adding and removing
// entries, grouping keys by shard. Part of embedding_table.h, which includes it at its end.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_EMBEDDING_TABLE_ENTRIES_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_EMBEDDING_TABLE_ENTRIES_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/dynamic_embedding/core/embedding_table.h"
#include "kernels/dynamic_embedding/core/prefetch.h"

namespace tf_ext {
namespace de {

template <typename Key>
inline auto EmbeddingTable<Key>::MakeLayout(int num_slots) const -> Layout {
  Layout layout;
  const size_t raw = sizeof(Header) + sizeof(float) * dim_ * (1 + num_slots);
  layout.stride = (raw + alignof(Header) - 1) / alignof(Header) * alignof(Header);
  // Large chunks of about 16 KiB, a power of two entries (at least 16) so an id splits by shifts.
  uint32_t per_chunk = 16;
  while (per_chunk * 2 * layout.stride <= 16384) per_chunk *= 2;
  layout.per_chunk = per_chunk;
  while ((uint32_t{1} << layout.chunk_shift) < per_chunk) ++layout.chunk_shift;
  layout.small_ids = per_chunk;
  return layout;
}

template <typename Key>
inline char* EmbeddingTable<Key>::EntryAt(const Layout& layout, const std::vector<char*>& chunks,
                                          uint32_t id) {
  if (id < layout.small_ids) return chunks[id / kSmallChunk] + (id % kSmallChunk) * layout.stride;
  const uint32_t large = id - layout.small_ids;
  return chunks[layout.small_ids / kSmallChunk + (large >> layout.chunk_shift)] +
         (large & (layout.per_chunk - 1)) * layout.stride;
}
template <typename Key>
inline char* EmbeddingTable<Key>::EntryAt(const Shard& shard, uint32_t id) const {
  return EntryAt(layout_, shard.chunks, id);
}
// Gives entry `id` (the next one) storage if it starts a chunk.
template <typename Key>
inline void EmbeddingTable<Key>::AllocateChunkFor(Shard& shard, uint32_t id) {
  if (id < layout_.small_ids) {
    if (id % kSmallChunk == 0)
      shard.chunks.push_back(arena_->Allocate(kSmallChunk * layout_.stride));
  } else if (((id - layout_.small_ids) & (layout_.per_chunk - 1)) == 0) {
    shard.chunks.push_back(arena_->Allocate(size_t{layout_.per_chunk} * layout_.stride));
  }
}
template <typename Key>
inline void EmbeddingTable<Key>::PrepareEntries(ChunkArena& arena, int64_t count) const {
  // A bound from the atomics (the layout itself is read under the locks), plus two large chunks.
  const size_t per_entry = sizeof(Header) + sizeof(float) * dim_ * (1 + num_slots()) + 64;
  arena.Prepare(per_entry * static_cast<size_t>(count) + (size_t{32} << 10));
}
template <typename Key>
inline uint32_t EmbeddingTable<Key>::IdAt(const Shard& shard, size_t pos) {
  return static_cast<uint32_t>(shard.index[pos]) - 1;
}

// Calls fn(id, entry) for each entry of the shard holding a key, in storage order (sequential
// memory, unlike the index's order); stops when fn returns false. Caller holds the lock.
template <typename Key>
template <typename Fn>
inline void EmbeddingTable<Key>::ForEachLiveEntry(const Shard& shard, Fn&& fn) const {
  for (uint32_t id = 0; id < shard.allocated; ++id) {
    char* entry = EntryAt(shard, id);
    if (HeaderOf(entry)->version != kFreeVersion && !fn(id, entry)) return;
  }
}

template <typename Key>
inline auto EmbeddingTable<Key>::HeaderOf(char* entry) -> Header* {
  return reinterpret_cast<Header*>(entry);
}
template <typename Key>
inline auto EmbeddingTable<Key>::HeaderOf(const char* entry) -> const Header* {
  return reinterpret_cast<const Header*>(entry);
}
template <typename Key>
inline Key& EmbeddingTable<Key>::KeyOf(char* entry) {
  return HeaderOf(entry)->key;
}
template <typename Key>
inline const float* EmbeddingTable<Key>::EmbeddingOf(const char* entry) {
  return reinterpret_cast<const float*>(entry + sizeof(Header));
}
template <typename Key>
inline RowRef EmbeddingTable<Key>::RowOf(char* entry) const {
  Header* header = HeaderOf(entry);
  float* embedding = reinterpret_cast<float*>(entry + sizeof(Header));
  return RowRef{embedding, embedding + dim_, &header->update_count, &header->last_step};
}

template <typename Key>
inline size_t EmbeddingTable<Key>::ShardIndex(uint64_t hash) const {
  return hash & (shards_.size() - 1);
}
template <typename Key>
inline auto EmbeddingTable<Key>::ShardFor(uint64_t hash) const -> const Shard& {
  return shards_[ShardIndex(hash)];
}
template <typename Key>
inline auto EmbeddingTable<Key>::ShardFor(uint64_t hash) -> Shard& {
  return shards_[ShardIndex(hash)];
}
template <typename Key>
inline size_t EmbeddingTable<Key>::HomeSlot(const Shard& shard, uint64_t hash) const {
  return HomeSlotOfTag(shard, Tag(hash));
}
// The home slot is the tag's low bits, so that an index slot alone says where its key belongs:
// growing or shifting the index reads no entry (a growth of a 200 K-entry shard, under its lock,
// took 8.5 ms reading every key from its entry, 3 ms without).
template <typename Key>
inline size_t EmbeddingTable<Key>::HomeSlotOfTag(const Shard& shard, uint32_t tag) {
  return tag & (shard.index.size() - 1);
}
template <typename Key>
inline uint32_t EmbeddingTable<Key>::Tag(uint64_t hash) {
  return static_cast<uint32_t>(hash >> 32);
}

template <typename Key>
template <typename KeyAt>
inline auto EmbeddingTable<Key>::GroupByShard(int64_t n, KeyAt&& key_at) const -> ShardGroups {
  ShardGroups groups;
  groups.first.assign(shards_.size() + 1, 0);
  std::unique_ptr<uint64_t[]> hashes(new uint64_t[n]);
  for (int64_t i = 0; i < n; ++i) {
    hashes[i] = StorageHash(key_at(i));
    ++groups.first[ShardIndex(hashes[i]) + 1];
  }
  for (size_t s = 0; s < shards_.size(); ++s) groups.first[s + 1] += groups.first[s];
  std::vector<int64_t> next(groups.first.begin(), groups.first.end() - 1);
  groups.keys.reset(new GroupedKey[n]);
  for (int64_t i = 0; i < n; ++i) {
    groups.keys[next[ShardIndex(hashes[i])]++] = GroupedKey{i, hashes[i]};
  }
  return groups;
}

template <typename Key>
inline bool EmbeddingTable<Key>::FindSlot(const Shard& shard, KeyView key, uint64_t hash,
                                          size_t* pos_out) const {
  if (shard.index.empty()) return false;
  const size_t mask = shard.index.size() - 1;
  const uint32_t tag = Tag(hash);
  for (size_t pos = HomeSlot(shard, hash);; pos = (pos + 1) & mask) {
    const uint64_t slot = shard.index[pos];
    if (slot == 0) return false;
    if (static_cast<uint32_t>(slot >> 32) == tag &&
        KeyOf(EntryAt(shard, static_cast<uint32_t>(slot) - 1)) == key) {
      *pos_out = pos;
      return true;
    }
  }
}
template <typename Key>
inline char* EmbeddingTable<Key>::FindEntry(const Shard& shard, KeyView key, uint64_t hash) const {
  size_t pos;
  if (!FindSlot(shard, key, hash, &pos)) return nullptr;
  return EntryAt(shard, static_cast<uint32_t>(shard.index[pos]) - 1);
}

// Returns the new entry's id.
template <typename Key>
inline uint32_t EmbeddingTable<Key>::CreateEntry(Shard& shard, KeyView key, uint64_t hash) {
  if ((shard.size + 1) * 4 > shard.index.size() * 3) GrowIndex(shard);
  uint32_t id;
  if (!shard.free_ids.empty()) {
    id = shard.free_ids.back();
    shard.free_ids.pop_back();
    // The next entry created in this shard reuses the new last free id: a freed entry is
    // anywhere in the shard's memory, so its lines start loading now.
    if (!shard.free_ids.empty())
      PrefetchBytes(EntryAt(shard, shard.free_ids.back()), layout_.stride);
  } else {
    id = shard.allocated++;
    AllocateChunkFor(shard, id);
    new (EntryAt(shard, id)) Header();
  }
  char* entry = EntryAt(shard, id);
  Header* header = HeaderOf(entry);
  header->key = Key(key);
  header->update_count = 0;
  header->last_step = 0;
  header->version = kFreeVersion;  // MarkChanged stamps it
  shard.key_heap_bytes += KeyTraits<Key>::HeapBytes(header->key);
  RowRef row = RowOf(entry);
  FillInitialRowOf(key, row.embedding);
  for (int s = 0, n = num_slots_.load(std::memory_order_relaxed); s < n; ++s) {
    std::fill(row.slots + s * dim_, row.slots + (s + 1) * dim_, slot_init_[s]);
  }
  const size_t mask = shard.index.size() - 1;
  size_t pos = HomeSlot(shard, hash);
  while (shard.index[pos] != 0) pos = (pos + 1) & mask;
  shard.index[pos] = (static_cast<uint64_t>(Tag(hash)) << 32) | (id + 1);
  ++shard.size;
  size_.fetch_add(1, std::memory_order_relaxed);
  return id;
}

// Removes the entry the index slot `pos` points at. Caller holds the shard's exclusive lock.
template <typename Key>
inline void EmbeddingTable<Key>::RemoveAt(Shard& shard, size_t pos) {
  const uint32_t id = IdAt(shard, pos);
  if (id >= shard.save_next && id < shard.save_end) SaveEntryBeforeChange(shard, id);
  char* entry = EntryAt(shard, id);
  if (tracking_.load(std::memory_order_relaxed)) {
    shard.removed.push_back(Tombstone{KeyOf(entry), version_.load(std::memory_order_relaxed)});
  }
  shard.key_heap_bytes -= KeyTraits<Key>::HeapBytes(KeyOf(entry));
  ReleaseKey(entry);
  HeaderOf(entry)->version = kFreeVersion;
  shard.free_ids.push_back(id);
  BackwardShiftDelete(shard, pos);
  --shard.size;
  size_.fetch_sub(1, std::memory_order_relaxed);
}

template <typename Key>
inline void EmbeddingTable<Key>::GrowIndex(Shard& shard) {
  std::vector<uint64_t> old = std::move(shard.index);
  shard.index.assign(std::max<size_t>(16, old.size() * 2), 0);
  const size_t mask = shard.index.size() - 1;
  for (uint64_t slot : old) {
    if (slot == 0) continue;
    size_t pos = HomeSlotOfTag(shard, static_cast<uint32_t>(slot >> 32));
    while (shard.index[pos] != 0) pos = (pos + 1) & mask;
    shard.index[pos] = slot;
  }
}

// Linear-probing deletion without tombstones: later entries of the same probe run move
// back into the hole, so lookups stay short after many removals.
template <typename Key>
inline void EmbeddingTable<Key>::BackwardShiftDelete(Shard& shard, size_t hole) {
  const size_t mask = shard.index.size() - 1;
  shard.index[hole] = 0;
  for (size_t pos = (hole + 1) & mask; shard.index[pos] != 0; pos = (pos + 1) & mask) {
    const uint64_t slot = shard.index[pos];
    const size_t home = HomeSlotOfTag(shard, static_cast<uint32_t>(slot >> 32));
    // Move it if its home is not cyclically inside (hole, pos].
    const bool home_in_range =
        hole < pos ? (home > hole && home <= pos) : (home > hole || home <= pos);
    if (!home_in_range) {
      shard.index[hole] = slot;
      shard.index[pos] = 0;
      hole = pos;
    }
  }
}

template <typename Key>
inline void EmbeddingTable<Key>::ReleaseKey(char* entry) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::string().swap(KeyOf(entry));  // give the heap buffer back
  }
}

template <typename Key>
inline void EmbeddingTable<Key>::DestroyEntries(Shard& shard) {
  for (uint32_t id = 0; id < shard.allocated; ++id) HeaderOf(EntryAt(shard, id))->~Header();
}

template <typename Key>
inline void EmbeddingTable<Key>::LockAll() {
  for (auto& shard : shards_) shard.lock.lock();
}
template <typename Key>
inline void EmbeddingTable<Key>::UnlockAll() {
  for (auto& shard : shards_) shard.lock.unlock();
}

template <typename Key>
inline size_t EmbeddingTable<Key>::BytesInUse() const {
  size_t bytes = shards_.size() * sizeof(Shard) + (sketch_ ? sketch_->Bytes() : 0);
  for (const auto& shard : shards_) {
    SharedGuard guard(shard.lock);
    bytes += shard.index.capacity() * sizeof(uint64_t) + shard.chunks.capacity() * sizeof(char*) +
             shard.free_ids.capacity() * sizeof(uint32_t) + shard.key_heap_bytes +
             shard.changed_ids.capacity() * sizeof(uint32_t) +
             shard.removed.capacity() * sizeof(Tombstone);
    if (shard.pending) {  // an unordered_map node: the pair, a next pointer, the cached hash
      bytes += shard.pending->bucket_count() * sizeof(void*) +
               shard.pending->size() * (sizeof(std::pair<const Key, uint32_t>) + 16);
    }
  }
  return bytes + std::atomic_load(&arena_)->ReservedBytes();
}

}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_EMBEDDING_TABLE_ENTRIES_H_
