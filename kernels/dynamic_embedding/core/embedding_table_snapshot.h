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

// A snapshot's entries copied out of a shard under its lock, handed to `row` after it is released.
template <typename Key>
struct EmbeddingTable<Key>::StagedRows {
  size_t row_floats = 0;
  std::vector<Key> keys;
  std::vector<int64_t> last_steps;
  std::vector<uint32_t> update_counts;
  std::vector<float> floats;
  void Clear() {
    keys.clear();
    last_steps.clear();
    update_counts.clear();
    floats.clear();
  }
};

template <typename Key>
template <typename Begin, typename Row, typename TombstoneFn, typename PendingFn, typename SketchFn>
inline int64_t EmbeddingTable<Key>::Snapshot(int64_t since_version, Begin&& begin, Row&& row,
                                             TombstoneFn&& tombstone, bool track,
                                             PendingFn&& pending, SketchFn&& sketch) {
  constexpr bool kSavesPending = !std::is_same_v<std::decay_t<PendingFn>, SkipAdmission>;
  constexpr bool kSavesSketch = !std::is_same_v<std::decay_t<SketchFn>, SkipAdmission>;
  std::lock_guard<std::mutex> snapshot_guard(snapshot_mutex_);
  const bool full = since_version == kFullSnapshot;
  if (!full && (!tracking_.load(std::memory_order_relaxed) ||
                since_version < std::max(tracked_since_, committed_version_) ||
                since_version >= version_.load(std::memory_order_relaxed))) {
    return kSnapshotNoBase;
  }
  // The instant. Changes from here on get a later version, and each shard's entries are marked as
  // not yet copied; the admission state (guarded by the shard locks, Admit) is copied whole.
  std::vector<std::pair<Key, uint32_t>> pending_at_instant;
  std::unique_ptr<CountMinSketch> sketch_at_instant;
  int64_t rows = 0;
  LockAll();
  const uint32_t version = version_.load(std::memory_order_relaxed);
  version_.store(version + 1, std::memory_order_relaxed);
  const bool starts_tracking = track && !tracking_.load(std::memory_order_relaxed);
  if (track) StartTrackingAt(version);
  save_since_ = full ? 0 : static_cast<uint32_t>(since_version);
  save_version_ = version;
  for (Shard& shard : shards_) {
    shard.save_next = 0;
    shard.save_end = shard.allocated;
    rows += shard.size;
    if (kSavesPending && shard.pending) {
      pending_at_instant.insert(pending_at_instant.end(), shard.pending->begin(),
                                shard.pending->end());
    }
  }
  if (kSavesSketch && sketch_) sketch_at_instant = std::make_unique<CountMinSketch>(*sketch_);
  UnlockAll();

  // A delta's entries: those of each shard's changed ids whose version at the instant is in the
  // range, sorted and without repeats. Tombstones after the instant have later versions.
  std::vector<std::vector<uint32_t>> changed(full ? 0 : shards_.size());
  int64_t tombstones = 0;
  if (!full) rows = 0;
  for (size_t s = 0; !full && s < shards_.size(); ++s) {
    const Shard& shard = shards_[s];
    SharedGuard guard(shard.lock);
    changed[s] = shard.changed_ids;
    std::sort(changed[s].begin(), changed[s].end());
    changed[s].erase(std::unique(changed[s].begin(), changed[s].end()), changed[s].end());
    changed[s].erase(std::remove_if(changed[s].begin(), changed[s].end(),
                                    [&](uint32_t id) {
                                      return id >= shard.save_end ||
                                             !InSave(VersionAtSaveInstant(shard, id));
                                    }),
                     changed[s].end());
    rows += changed[s].size();
    for (const Tombstone& removed : shard.removed) tombstones += InSave(removed.version);
  }

  bool ok = begin(rows, tombstones);
  std::vector<Key> removed_keys;
  for (size_t s = 0; ok && !full && s < shards_.size(); ++s) {
    removed_keys.clear();
    {
      SharedGuard guard(shards_[s].lock);
      for (const Tombstone& removed : shards_[s].removed) {
        if (InSave(removed.version)) removed_keys.push_back(removed.key);
      }
    }
    for (const Key& key : removed_keys) {
      if (!(ok = tombstone(static_cast<const Key&>(key)))) break;
    }
  }
  StagedRows staged;
  staged.row_floats = size_t{1} * dim_ * (1 + num_slots());  // EnsureSlots waits for snapshots
  const uint32_t batch = static_cast<uint32_t>(
      std::max<size_t>(64, kSaveBatchBytes / (sizeof(Header) + sizeof(float) * staged.row_floats)));
  for (size_t s = 0; s < shards_.size(); ++s) {
    Shard& shard = shards_[s];
    uint32_t next_id = 0;  // a full snapshot walks the ids in storage order, a delta its list
    size_t next_changed = 0;
    bool shard_done = false;
    while (ok && !shard_done) {
      staged.Clear();
      {
        ExclusiveGuard guard(shard.lock);
        if (full) {
          const uint32_t end = std::min(shard.save_end, next_id + batch);
          for (; next_id < end; ++next_id) StageForSave(shard, next_id, &staged);
        } else {
          const size_t end = std::min(changed[s].size(), next_changed + batch);
          for (; next_changed < end; ++next_changed) {
            StageForSave(shard, changed[s][next_changed], &staged);
          }
          next_id = next_changed < changed[s].size() ? changed[s][next_changed] : shard.save_end;
        }
        shard.save_next = next_id;
        shard_done = next_id >= shard.save_end;
        if (shard_done) {  // writers keep nothing more for this snapshot
          shard.save_end = 0;
          shard.saved.clear();
        }
      }
      for (size_t i = 0; ok && i < staged.keys.size(); ++i) {
        float* floats = staged.floats.data() + i * staged.row_floats;
        const RowRef ref{floats, floats + dim_, &staged.update_counts[i], &staged.last_steps[i]};
        ok = row(static_cast<const Key&>(staged.keys[i]), ref);
      }
    }
  }
  // Admission counts as at the instant, after the rows.
  if constexpr (kSavesPending) {
    for (size_t i = 0; ok && i < pending_at_instant.size(); ++i) {
      ok = pending(static_cast<const Key&>(pending_at_instant[i].first),
                   pending_at_instant[i].second);
    }
  }
  if constexpr (kSavesSketch) {
    if (ok && sketch_at_instant) {
      ok = sketch(static_cast<const CountMinSketch&>(*sketch_at_instant));
    }
  }
  if (!ok) {
    // Stopped: the shards not yet copied stop keeping entries, and a snapshot that started the
    // tracking undoes it (as if it never ran; the version stays advanced).
    LockAll();
    for (Shard& shard : shards_) {
      shard.save_end = 0;
      shard.saved.clear();
      if (starts_tracking) {
        shard.changed_ids.clear();
        shard.removed.clear();
      }
    }
    if (starts_tracking) tracking_.store(false, std::memory_order_relaxed);
    UnlockAll();
  }
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
  std::lock_guard<std::mutex> snapshot_guard(snapshot_mutex_);  // frees what a snapshot copies
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
  const std::shared_ptr<ChunkArena> arena = std::atomic_load(&arena_);
  std::atomic_store(&arena_, std::atomic_load(&other.arena_));
  std::atomic_store(&other.arena_, arena);
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
  if (id >= shard.save_next && id < shard.save_end) SaveEntryBeforeChange(shard, id);
  header->version = version;
  if (tracking_.load(std::memory_order_relaxed)) shard.changed_ids.push_back(id);
}

// Whether an entry whose version at the running snapshot's instant is `version` belongs in it (a
// free entry's version, 0, never does; changes after the instant have later versions).
template <typename Key>
inline bool EmbeddingTable<Key>::InSave(uint32_t version) const {
  return version > save_since_ && version <= save_version_;
}

// Before a writer changes or removes entry `id`, which the running snapshot has not copied yet:
// keeps the entry as it is, if the snapshot saves it and it has not changed since the instant
// (then its version is later and it was kept already, or never belonged). Caller holds the
// shard's exclusive lock.
template <typename Key>
inline void EmbeddingTable<Key>::SaveEntryBeforeChange(Shard& shard, uint32_t id) {
  char* entry = EntryAt(shard, id);
  const Header* header = HeaderOf(entry);
  if (!InSave(header->version)) return;
  const float* floats = EmbeddingOf(entry);
  shard.saved.emplace(
      id, SavedEntry{header->key, header->last_step, header->update_count, header->version,
                     std::vector<float>(floats, floats + size_t{1} * dim_ * (1 + num_slots()))});
}

template <typename Key>
inline uint32_t EmbeddingTable<Key>::VersionAtSaveInstant(const Shard& shard, uint32_t id) const {
  const auto saved = shard.saved.find(id);
  return saved != shard.saved.end() ? saved->second.version : HeaderOf(EntryAt(shard, id))->version;
}

// Appends entry `id` as it was at the instant, if the snapshot saves it. Caller holds the shard's
// exclusive lock.
template <typename Key>
inline void EmbeddingTable<Key>::StageForSave(Shard& shard, uint32_t id, StagedRows* staged) {
  const auto saved = shard.saved.find(id);
  if (saved != shard.saved.end()) {
    SavedEntry& was = saved->second;
    staged->keys.push_back(std::move(was.key));
    staged->last_steps.push_back(was.last_step);
    staged->update_counts.push_back(was.update_count);
    staged->floats.insert(staged->floats.end(), was.floats.begin(), was.floats.end());
    shard.saved.erase(saved);
    return;
  }
  char* entry = EntryAt(shard, id);
  const Header* header = HeaderOf(entry);
  if (!InSave(header->version)) return;
  staged->keys.push_back(header->key);
  staged->last_steps.push_back(header->last_step);
  staged->update_counts.push_back(header->update_count);
  const float* floats = EmbeddingOf(entry);
  staged->floats.insert(staged->floats.end(), floats, floats + staged->row_floats);
}

}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_EMBEDDING_TABLE_SNAPSHOT_H_
