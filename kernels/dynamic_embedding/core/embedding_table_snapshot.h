// EmbeddingTable's snapshots: whole-table exports, full and delta snapshots for checkpoints with
// the version stamps and change tracking deltas rely on, and replacing the content on a restore.
// Part of embedding_table.h, which includes it at its end.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_EMBEDDING_TABLE_SNAPSHOT_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_EMBEDDING_TABLE_SNAPSHOT_H_

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/dynamic_embedding/core/embedding_table.h"

namespace tf_ext {
namespace de {

template <typename Key>
template <typename Alloc, typename Visit>
inline void EmbeddingTable<Key>::Export(Alloc&& alloc, Visit&& visit) const {
  for (const auto& shard : shards_) shard.lock.lock_shared();
  int64_t n = 0;
  for (const auto& shard : shards_) n += shard.size;
  if (alloc(n)) {
    int64_t i = 0;
    for (const auto& shard : shards_) {
      ForEachLiveEntry(shard, [&](uint32_t, char* entry) {
        visit(i++, static_cast<const Key&>(KeyOf(entry)), RowOf(entry));
        return true;
      });
    }
  }
  for (const auto& shard : shards_) shard.lock.unlock_shared();
}

template <typename Key>
template <typename Begin, typename Row, typename TombstoneFn>
inline int64_t EmbeddingTable<Key>::Snapshot(int64_t since_version, Begin&& begin, Row&& row,
                                             TombstoneFn&& tombstone, bool track) {
  return Snapshot(since_version, begin, row, tombstone, track, SkipAdmission(), SkipAdmission());
}

template <typename Key>
template <typename Begin, typename Row, typename TombstoneFn, typename PendingFn, typename SketchFn>
inline int64_t EmbeddingTable<Key>::Snapshot(int64_t since_version, Begin&& begin, Row&& row,
                                             TombstoneFn&& tombstone, bool track,
                                             PendingFn&& pending, SketchFn&& sketch) {
  std::lock_guard<std::mutex> snapshot_guard(snapshot_mutex_);
  const bool full = since_version == kFullSnapshot;
  if (!full && (!tracking_.load(std::memory_order_relaxed) ||
                since_version < std::max(tracked_since_, committed_version_) ||
                since_version >= version_.load(std::memory_order_relaxed))) {
    return kSnapshotNoBase;
  }
  for (const auto& shard : shards_) shard.lock.lock_shared();
  const uint32_t version = version_.load(std::memory_order_relaxed);
  const uint32_t since = full ? 0 : static_cast<uint32_t>(since_version);
  // The changed entries of each shard (a delta), sorted and without repeats.
  std::vector<std::vector<uint32_t>> changed(full ? 0 : shards_.size());
  int64_t rows = 0, tombstones = 0;
  for (size_t s = 0; s < shards_.size(); ++s) {
    const Shard& shard = shards_[s];
    if (full) {
      rows += shard.size;
      continue;
    }
    changed[s] = shard.changed_ids;
    std::sort(changed[s].begin(), changed[s].end());
    changed[s].erase(std::unique(changed[s].begin(), changed[s].end()), changed[s].end());
    auto unchanged = [&](uint32_t id) {
      const uint32_t v = HeaderOf(EntryAt(shard, id))->version;
      return v == kFreeVersion || v <= since;
    };
    changed[s].erase(std::remove_if(changed[s].begin(), changed[s].end(), unchanged),
                     changed[s].end());
    rows += changed[s].size();
    for (const Tombstone& removed : shard.removed) tombstones += removed.version > since;
  }
  bool ok = begin(rows, tombstones);
  for (size_t s = 0; ok && !full && s < shards_.size(); ++s) {
    for (const Tombstone& removed : shards_[s].removed) {
      if (removed.version > since && !(ok = tombstone(static_cast<const Key&>(removed.key)))) {
        break;
      }
    }
  }
  for (size_t s = 0; ok && s < shards_.size(); ++s) {
    const Shard& shard = shards_[s];
    if (full) {
      ForEachLiveEntry(shard, [&](uint32_t, char* entry) {
        return ok = row(static_cast<const Key&>(KeyOf(entry)), RowOf(entry));
      });
      continue;
    }
    for (uint32_t id : changed[s]) {
      char* entry = EntryAt(shard, id);
      if (!(ok = row(static_cast<const Key&>(KeyOf(entry)), RowOf(entry)))) break;
    }
  }
  // Admit runs under a shard's exclusive lock: with every shard read-locked the counts are those
  // of the rows' instant.
  if constexpr (!std::is_same_v<std::decay_t<PendingFn>, SkipAdmission>) {
    for (size_t s = 0; ok && s < shards_.size(); ++s) {
      if (!shards_[s].pending) continue;
      for (const auto& [key, count] : *shards_[s].pending) {
        if (!(ok = pending(key, count))) break;
      }
    }
  }
  if constexpr (!std::is_same_v<std::decay_t<SketchFn>, SkipAdmission>) {
    if (ok && sketch_) ok = sketch(static_cast<const CountMinSketch&>(*sketch_));
  }
  if (ok) {
    // Later changes get later versions.
    version_.store(version + 1, std::memory_order_relaxed);
    if (track) StartTrackingAt(version);
  }
  for (const auto& shard : shards_) shard.lock.unlock_shared();
  return ok ? version : kSnapshotStopped;
}

template <typename Key>
inline int64_t EmbeddingTable<Key>::MarkSnapshotBase() {
  std::lock_guard<std::mutex> snapshot_guard(snapshot_mutex_);
  for (const auto& shard : shards_) shard.lock.lock_shared();
  const uint32_t version = version_.load(std::memory_order_relaxed);
  version_.store(version + 1, std::memory_order_relaxed);
  StartTrackingAt(version);
  for (const auto& shard : shards_) shard.lock.unlock_shared();
  return version;
}

template <typename Key>
inline void EmbeddingTable<Key>::CommitSnapshot(int64_t version) {
  std::lock_guard<std::mutex> snapshot_guard(snapshot_mutex_);
  committed_version_ = std::max(committed_version_, version);
  const uint32_t upto = static_cast<uint32_t>(version);
  for (auto& shard : shards_) {
    ExclusiveGuard guard(shard.lock);
    auto& ids = shard.changed_ids;
    ids.erase(std::remove_if(ids.begin(), ids.end(),
                             [&](uint32_t id) {
                               const uint32_t v = HeaderOf(EntryAt(shard, id))->version;
                               return v == kFreeVersion || v <= upto;
                             }),
              ids.end());
    auto& removed = shard.removed;
    removed.erase(std::remove_if(removed.begin(), removed.end(),
                                 [&](const Tombstone& t) { return t.version <= upto; }),
                  removed.end());
    if (ids.capacity() > 2 * ids.size() + 64) ids.shrink_to_fit();
    if (removed.capacity() > 2 * removed.size() + 64) removed.shrink_to_fit();
  }
}

template <typename Key>
inline void EmbeddingTable<Key>::ClearAdmission() {
  if (sketch_) sketch_->Clear();
  for (auto& shard : shards_) {
    ExclusiveGuard guard(shard.lock);
    shard.pending.reset();
  }
}

template <typename Key>
inline void EmbeddingTable<Key>::RestorePending(KeyView key, uint32_t count) {
  if (admission_.min_count <= 1 || count == 0) return;
  const uint64_t hash = StorageHash(key);
  if (sketch_) {
    sketch_->Raise(hash, count);
    return;
  }
  Shard& shard = ShardFor(hash);
  ExclusiveGuard guard(shard.lock);
  if (!shard.pending) shard.pending = std::make_unique<std::unordered_map<Key, uint32_t>>();
  (*shard.pending)[Key(key)] = count;
}

template <typename Key>
inline bool EmbeddingTable<Key>::RestoreSketch(int64_t width, int depth, size_t first, size_t n,
                                               const uint32_t* values) {
  if (!sketch_ || sketch_->width() != width || sketch_->depth() != depth ||
      first + n > sketch_->NumCounters()) {
    return false;
  }
  sketch_->MaxCounters(first, n, values);
  return true;
}

template <typename Key>
inline void EmbeddingTable<Key>::SwapContents(EmbeddingTable& other) {
  if (other.shards_.size() != shards_.size() || other.dim_ != dim_ ||
      (sketch_ == nullptr) != (other.sketch_ == nullptr) ||
      (sketch_ && sketch_->NumCounters() != other.sketch_->NumCounters())) {
    std::abort();
  }
  LockAll();
  other.LockAll();
  // Swap what the shards hold, never the shards themselves: a reader waiting on a
  // shard's lock must wake up in this table, not in `other`.
  for (size_t i = 0; i < shards_.size(); ++i) {
    Shard held = std::move(shards_[i]);
    shards_[i] = std::move(other.shards_[i]);
    other.shards_[i] = std::move(held);
  }
  std::swap(arena_, other.arena_);
  // Same width and depth: only the counts differ. Admit uses them under a shard's lock.
  if (sketch_) sketch_->SwapCounters(*other.sketch_);
  const int64_t other_size = other.size_.load();
  other.size_.store(size_.load());
  size_.store(other_size);
  std::swap(slot_init_, other.slot_init_);
  std::swap(layout_, other.layout_);
  const int slots = num_slots_.load(), other_slots = other.num_slots_.load();
  num_slots_.store(other_slots);
  other.num_slots_.store(slots);
  // New content: changes are tracked again from the next snapshot.
  tracking_.store(false, std::memory_order_relaxed);
  for (auto& shard : shards_) {
    shard.changed_ids.clear();
    shard.removed.clear();
  }
  other.UnlockAll();
  UnlockAll();
}

// From now on changes are tracked, so deltas since `version` can be taken. Caller holds
// snapshot_mutex_ and every shard's lock (shared: the tracking state is atomic or guarded by
// snapshot_mutex_).
template <typename Key>
inline void EmbeddingTable<Key>::StartTrackingAt(uint32_t version) {
  if (tracking_.load(std::memory_order_relaxed)) return;
  tracked_since_ = version;
  tracking_.store(true, std::memory_order_relaxed);
}

// Stamps the entry with the current version and, while tracking, remembers it as changed.
// Caller holds the shard's exclusive lock.
template <typename Key>
inline void EmbeddingTable<Key>::MarkChanged(Shard& shard, uint32_t id) {
  Header* header = HeaderOf(EntryAt(shard, id));
  const uint32_t version = version_.load(std::memory_order_relaxed);
  if (header->version == version) return;
  header->version = version;
  if (tracking_.load(std::memory_order_relaxed)) shard.changed_ids.push_back(id);
}

}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_EMBEDDING_TABLE_SNAPSHOT_H_
