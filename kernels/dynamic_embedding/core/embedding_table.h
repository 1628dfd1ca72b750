// The dynamic embedding table core: an exact (collision-free) hash map from int64 or string
// keys to float rows. No TensorFlow types, so it is unit-tested alone.
//
// Layout. The table is split into shards, each guarded by its own reader-writer spinlock, so
// lookups of different keys never contend on a global lock. A shard has
//   - an open-addressing index of 8-byte slots: (32-bit hash tag << 32) | (entry id + 1),
//   - entries stored back to back in chunks, so memory grows with the number of ids, pointers
//     stay valid when the index grows, and ids of removed entries are reused. A shard's first
//     entries go in chunks of two entries and the rest in chunks of about 16 KiB: a small table
//     costs about its entries, a large one has few chunks to find.
// Slots and shards come from StorageHash(key); a missing key's row from InitialRowKeyHash(key).
// One entry holds everything about a key contiguously: the key, the step of its last update, its
// update count, its version (for delta checkpoints), the embedding and then the optimizer slots.
// A lookup or an update is therefore one probe and one (usually one cache line further) memory
// access.
//
// Lifecycle. Training updates go through UpdateRow, which applies the admission policy to new ids
// (admission.h) and keeps each entry's update count, last step and version. Evict removes rows
// shard by shard, holding a shard's exclusive lock only for short batches, so lookups and updates
// go on meanwhile. Snapshot streams the whole table or only what changed since an earlier snapshot
// (changed rows and removed ids), for full and delta checkpoints.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_EMBEDDING_TABLE_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_EMBEDDING_TABLE_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/dynamic_embedding/core/admission.h"
#include "kernels/dynamic_embedding/core/chunk_arena.h"
#include "kernels/dynamic_embedding/core/initializers.h"
#include "kernels/dynamic_embedding/core/prefetch.h"
#include "kernels/dynamic_embedding/core/rw_spinlock.h"

namespace tf_ext {
namespace de {

constexpr int kMaxDim = 4096;
constexpr int kMaxSlots = 4;

// Where a key is stored: the low bits pick its shard, the next its home slot, the high 32 its tag.
// Nothing persisted depends on it (an import re-inserts every key), so it may change for speed or
// spread. Initial rows never use it: they use the frozen InitialRowKeyHash (initializers.h), which
// this equals today, so tuning this hash leaves every served row as it was.
inline uint64_t StorageHash(int64_t key) { return InitialRowKeyHash(key); }
inline uint64_t StorageHash(std::string_view key) { return InitialRowKeyHash(key); }

template <typename Key>
struct KeyTraits;

template <>
struct KeyTraits<int64_t> {
  using View = int64_t;
  static size_t HeapBytes(int64_t) { return 0; }
};

template <>
struct KeyTraits<std::string> {
  using View = std::string_view;
  // Bytes a std::string holds outside itself (beyond its small-string buffer).
  static size_t HeapBytes(const std::string& s) {
    return s.capacity() > std::string().capacity() ? s.capacity() + 1 : 0;
  }
};

// A mutable view of one entry, valid while the caller holds the entry's shard lock.
struct RowRef {
  float* embedding;
  float* slots;  // num_slots blocks of dim floats
  uint32_t* update_count;
  int64_t* last_step;
};

// When Evict removes a row; a criterion is off when its value is 0. The step is the global step
// of training updates (UpdateRow's `step`).
struct EvictionCriteria {
  int64_t now_step = 0;
  int64_t ttl_steps = 0;  // now_step - last update step >= ttl_steps
  // update count < min_frequency, once now_step - last update step >= frequency_window_steps
  int64_t min_frequency = 0;
  int64_t frequency_window_steps = 0;
  float min_l2_norm = 0.0f;  // the embedding's L2 norm < min_l2_norm
  // Then, while the table holds more than max_size rows, the least recently updated go.
  int64_t max_size = 0;
};

// Counts since the table was created (not checkpointed).
struct TableCounters {
  int64_t admitted = 0;     // rows created by training updates
  int64_t rejected = 0;     // training updates of ids not admitted (yet): dropped
  int64_t evicted = 0;      // rows removed by Evict
  int64_t lookups = 0;      // ids looked up
  int64_t lookup_hits = 0;  // of which had a row
};

template <typename Key>
class EmbeddingTable {
 public:
  using KeyView = typename KeyTraits<Key>::View;
  static constexpr int64_t kFullSnapshot = -1;

  EmbeddingTable(int dim, const InitializerSpec& init, int shard_bits = 6,
                 const AdmissionSpec& admission = AdmissionSpec())
      : dim_(dim),
        init_(init),
        shard_bits_(shard_bits),
        shards_(size_t{1} << shard_bits),
        admission_(admission) {
    layout_ = MakeLayout(0);
    if (admission_.min_count > 1 && !admission_.exact) {
      sketch_ = std::make_unique<CountMinSketch>(admission_.sketch_width, admission_.sketch_depth);
    }
  }
  ~EmbeddingTable() {
    for (auto& shard : shards_) DestroyEntries(shard);
  }
  EmbeddingTable(const EmbeddingTable&) = delete;
  EmbeddingTable& operator=(const EmbeddingTable&) = delete;

  int dim() const { return dim_; }
  int num_slots() const { return num_slots_.load(std::memory_order_acquire); }
  const InitializerSpec& initializer() const { return init_; }
  const AdmissionSpec& admission() const { return admission_; }
  std::vector<float> slot_initial_values() const {
    std::lock_guard<std::mutex> guard(layout_mutex_);
    return slot_init_;
  }
  // The largest step a training update has had (0 before the first).
  int64_t latest_step() const { return latest_step_.load(std::memory_order_relaxed); }

  // Copies the key's embedding into out[0, dim). A missing key reads its initial value and
  // the table is left unchanged. Returns whether the key was present.
  bool Find(KeyView key, float* out) const {
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
    CountLookups(1, found ? 1 : 0);
    return found;
  }

  // Find for keys key_at(0..n-1) into out[i * dim, (i + 1) * dim), returning how many were
  // present. A shard is read-locked once per call, not once per key: under skewed ids the same
  // few locks would otherwise bounce between cores on every lookup. Usually every shard is
  // locked for the whole call and the keys are served in order, writing the rows sequentially,
  // the fastest. While a bulk removal runs (Evict, RemoveBatch), whose every short hold of a
  // shard's write lock would otherwise wait for a whole call, the keys are served shard by shard
  // instead, holding only the shards of the keys in flight (FindByShard).
  // With out_stride, row i goes to out[i * out_stride, i * out_stride + dim) instead: into a
  // column window of a wider matrix, such as a concatenation of lookups.
  template <typename KeyAt>
  int64_t FindBatch(int64_t n, KeyAt&& key_at, float* out) const {
    return FindBatch(n, key_at, out, dim_);
  }
  template <typename KeyAt>
  int64_t FindBatch(int64_t n, KeyAt&& key_at, float* out, int64_t out_stride) const {
    const int64_t found = ServeRows(n, key_at, out, out_stride);
    CountLookups(n, found);
    return found;
  }
  // FindBatch for distinct keys that stand for more lookups: key k counts as occurrences[k] lookups
  // (and hits), so the statistics are those of looking every occurrence up. Rows go to out[k *
  // dim].
  template <typename KeyAt>
  void FindDistinctBatch(int64_t n, KeyAt&& key_at, const int64_t* occurrences, float* out) const {
    std::unique_ptr<bool[]> present(new bool[n]);
    ServeRows(n, key_at, out, dim_, present.get());
    int64_t lookups = 0, hits = 0;
    for (int64_t k = 0; k < n; ++k) {
      lookups += occurrences[k];
      if (present[k]) hits += occurrences[k];
    }
    CountLookups(lookups, hits);
  }
  // FindBatch as it runs during a bulk removal, for tests.
  template <typename KeyAt>
  int64_t FindBatchByShardForTesting(int64_t n, KeyAt&& key_at, float* out,
                                     int64_t out_stride = 0) const {
    return FindByShard(n, key_at, out, out_stride > 0 ? out_stride : dim_);
  }

  bool Contains(KeyView key) const {
    const uint64_t hash = StorageHash(key);
    const Shard& shard = ShardFor(hash);
    SharedGuard guard(shard.lock);
    return FindEntry(shard, key, hash) != nullptr;
  }

  // Runs fn(RowRef&, bool created) on the key's entry under the shard's exclusive lock,
  // creating the entry first (initial embedding, initial slots, zero metadata) if missing.
  // No admission, no bookkeeping: for inserts and restores.
  template <typename Fn>
  void Upsert(KeyView key, Fn&& fn) {
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

  // One training update of the key at global step `step`: runs fn(RowRef&) on its entry under
  // the shard's exclusive lock, then counts the update and records the step. A missing key is
  // counted by the admission policy first: until admitted it gets no entry and fn does not run.
  // Returns whether fn ran.
  template <typename Fn>
  bool UpdateRow(KeyView key, int64_t step, Fn&& fn) {
    const uint64_t hash = StorageHash(key);
    Shard& shard = ShardFor(hash);
    bool ran;
    {
      ExclusiveGuard guard(shard.lock);
      ran = UpdateLocked(shard, key, hash, step, fn);
    }
    if (ran) RecordStep(step);
    return ran;
  }

  // UpdateRow for keys key_at(0..n-1), running fn(i, RowRef&) for each admitted key i; returns
  // how many ran. The keys are grouped by shard, and each shard's exclusive lock is taken once for
  // its keys, not once per key; within a shard, a two-stage software pipeline (as FindInOrder's)
  // prefetches the index slot and then the entry of the keys ahead, hiding a cold key's two
  // dependent cache misses. A key given twice is updated twice, in order.
  template <typename KeyAt, typename Fn>
  int64_t UpdateBatch(int64_t n, KeyAt&& key_at, int64_t step, Fn&& fn) {
    const ShardGroups groups = GroupByShard(n, key_at);
    constexpr int64_t kIndexAhead = 16, kEntryAhead = 8;
    int64_t ran = 0;
    for (size_t s = 0; s < shards_.size(); ++s) {
      const GroupedKey* group = groups.keys.get() + groups.first[s];
      const int64_t size = groups.first[s + 1] - groups.first[s];
      if (size == 0) continue;
      ExclusiveGuard guard(shards_[s].lock);
      for (int64_t p = 0; p < std::min(size, kIndexAhead); ++p) PrefetchIndex(group[p].hash);
      for (int64_t p = 0; p < std::min(size, kEntryAhead); ++p) PrefetchEntry(group[p].hash);
      for (int64_t p = 0; p < size; ++p) {
        if (p + kEntryAhead < size) PrefetchEntry(group[p + kEntryAhead].hash);
        if (p + kIndexAhead < size) PrefetchIndex(group[p + kIndexAhead].hash);
        const int64_t i = group[p].index;
        ran += UpdateLocked(shards_[s], key_at(i), group[p].hash, step,
                            [&](RowRef& row) { fn(i, row); });
      }
    }
    if (ran > 0) RecordStep(step);
    return ran;
  }

  // Sets the embedding; slots and metadata are kept for an existing key. A new key gets initial
  // slots, no updates, and the latest training step as its last step (so a TTL counts from now).
  void InsertOrAssign(KeyView key, const float* embedding) {
    Upsert(key, [&](RowRef& row, bool created) {
      std::memcpy(row.embedding, embedding, sizeof(float) * dim_);
      if (created) *row.last_step = latest_step();
    });
  }

  bool Remove(KeyView key) {
    const uint64_t hash = StorageHash(key);
    Shard& shard = ShardFor(hash);
    ExclusiveGuard guard(shard.lock);
    size_t pos;
    if (!FindSlot(shard, key, hash, &pos)) return false;
    RemoveAt(shard, pos);
    return true;
  }

  // Remove for keys key_at(0..n-1), returning how many were present. The keys are grouped by
  // shard and removed in batches of kEvictBatch per hold of the shard's exclusive lock, as Evict
  // does: a lock per batch, not per key, and lookups wait at most one short batch.
  template <typename KeyAt>
  int64_t RemoveBatch(int64_t n, KeyAt&& key_at) {
    BulkRemoval bulk(bulk_removals_);
    const ShardGroups groups = GroupByShard(n, key_at);
    int64_t removed = 0;
    for (size_t s = 0; s < shards_.size(); ++s) {
      const GroupedKey* group = groups.keys.get() + groups.first[s];
      removed += RemoveInBatches(
          shards_[s], groups.first[s + 1] - groups.first[s],
          [&](int64_t j) { return key_at(group[j].index); },
          [&](int64_t j) { return group[j].hash; }, [](const char*) { return true; });
    }
    return removed;
  }

  int64_t Size() const { return size_.load(std::memory_order_relaxed); }

  void Clear() {
    LockAll();
    for (auto& shard : shards_) {
      DestroyEntries(shard);
      shard = Shard();
    }
    arena_ = std::make_unique<ChunkArena>();
    size_.store(0, std::memory_order_relaxed);
    tracking_.store(false, std::memory_order_relaxed);
    UnlockAll();
  }

  // Bytes the table holds for its entries, index, admission counts and change tracking (not
  // counting the object itself).
  size_t BytesInUse() const {
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
    return bytes + arena_->ReservedBytes();
  }

  TableCounters Counters() const {
    TableCounters counters;
    counters.admitted = admitted_.load(std::memory_order_relaxed);
    counters.rejected = rejected_.load(std::memory_order_relaxed);
    counters.evicted = evicted_.load(std::memory_order_relaxed);
    counters.lookups = lookups_.load(std::memory_order_relaxed);
    counters.lookup_hits = lookup_hits_.load(std::memory_order_relaxed);
    return counters;
  }

  // Makes every entry carry at least `num_slots` optimizer slots; new slots of existing
  // entries and all slots of future entries start at slot_init[i]. Done once, when an
  // optimizer first updates the table, so lookup-only tables carry no slot memory.
  void EnsureSlots(int num_slots, const std::vector<float>& slot_init) {
    if (num_slots <= this->num_slots()) return;
    std::lock_guard<std::mutex> layout_guard(layout_mutex_);
    const int old_slots = num_slots_.load(std::memory_order_relaxed);
    if (num_slots <= old_slots) return;
    LockAll();
    const Layout old_layout = layout_;
    std::vector<float> new_init = slot_init_;
    for (int i = old_slots; i < num_slots; ++i) new_init.push_back(slot_init[i]);
    slot_init_ = new_init;
    layout_ = MakeLayout(num_slots);
    std::unique_ptr<ChunkArena> old_arena = std::move(arena_);
    arena_ = std::make_unique<ChunkArena>();
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

  // A consistent snapshot: all shards are read-locked while `visit` runs, so no writer can
  // interleave. alloc(n) is called first with the number of entries, then
  // visit(i, key, row) for i in [0, n).
  template <typename Alloc, typename Visit>
  void Export(Alloc&& alloc, Visit&& visit) const {
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

  // A consistent, streaming snapshot, for checkpoints. Every shard is read-locked for the whole
  // call (lookups go on, updates wait). Calls begin(int64_t num_rows, int64_t num_tombstones)
  // once, then tombstone(const Key&) for each key removed since `since_version` (none for a
  // full snapshot), then row(const Key&, const RowRef&) for each entry changed since then
  // (every entry when since_version == kFullSnapshot). Tombstones come first so that a replay
  // in this order is right for an id removed and added again. Each callback returns bool; false
  // stops the walk and Snapshot returns kSnapshotStopped. Otherwise returns the snapshot's
  // version V >= 1: rows changed after this call get versions > V; pass V as since_version of
  // the next delta. With `track`, changes are tracked from the first snapshot on, and kept until
  // CommitSnapshot(V) says a file holding those up to V is durable (a full snapshot without
  // `track`, such as a plain checkpoint, starts no tracking). A delta needs a base this table
  // can answer for: a version it snapshotted, not older than the last commit; else
  // kSnapshotNoBase.
  static constexpr int64_t kSnapshotStopped = -1, kSnapshotNoBase = -2;
  template <typename Begin, typename Row, typename TombstoneFn>
  int64_t Snapshot(int64_t since_version, Begin&& begin, Row&& row, TombstoneFn&& tombstone,
                   bool track = true) {
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
    if (ok) {
      // Later changes get later versions.
      version_.store(version + 1, std::memory_order_relaxed);
      if (track) StartTrackingAt(version);
    }
    for (const auto& shard : shards_) shard.lock.unlock_shared();
    return ok ? version : kSnapshotStopped;
  }

  // Declares the current content the base of later deltas, without walking it: for a table just
  // restored from a snapshot chain, whose next delta continues that chain. Returns the version
  // to pass as since_version.
  int64_t MarkSnapshotBase() {
    std::lock_guard<std::mutex> snapshot_guard(snapshot_mutex_);
    for (const auto& shard : shards_) shard.lock.lock_shared();
    const uint32_t version = version_.load(std::memory_order_relaxed);
    version_.store(version + 1, std::memory_order_relaxed);
    StartTrackingAt(version);
    for (const auto& shard : shards_) shard.lock.unlock_shared();
    return version;
  }

  // Forgets the changes and removals a durable snapshot of `version` holds.
  void CommitSnapshot(int64_t version) {
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

  // Removes the rows `criteria` condemns, shard by shard: a shard is scanned under its read
  // lock, then its victims are removed under its exclusive lock in batches of kEvictBatch, each
  // victim re-checked (an update in between saves it). Lookups and updates of other shards, and
  // of this one between batches, go on. Returns the number of rows removed.
  int64_t Evict(const EvictionCriteria& criteria) {
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

  // Replaces the whole content with `other`'s (same dim). Either all of it or nothing:
  // the caller builds and validates `other` first.
  void SwapContents(EmbeddingTable& other) {
    if (other.shards_.size() != shards_.size() || other.dim_ != dim_) std::abort();
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

 private:
  // Entry ids: the first kSmallChunk * kSmallChunks of a shard live in chunks of kSmallChunk
  // entries, the rest in chunks of per_chunk (a power of two, at least 16, about 16 KiB).
  static constexpr uint32_t kSmallChunk = 2;
  static constexpr uint32_t kFreeVersion = 0;  // the version of an entry that holds no key

  struct Header {
    Key key;
    int64_t last_step;
    uint32_t update_count;
    uint32_t version;  // kFreeVersion, or the table's version when the entry last changed
  };
  struct Tombstone {
    Key key;
    uint32_t version;
  };

  struct Layout {
    size_t stride = 0;         // bytes per entry
    uint32_t per_chunk = 0;    // entries per large chunk
    uint32_t chunk_shift = 0;  // log2(per_chunk)
    uint32_t small_ids = 0;    // ids below this live in small chunks (= per_chunk)
  };

  struct alignas(64) Shard {
    mutable RWSpinLock lock;
    std::vector<uint64_t> index;  // empty until the first insert
    size_t size = 0;
    std::vector<char*> chunks;  // carved from the table's arena
    uint32_t allocated = 0;     // entry ids in [0, allocated) have storage
    std::vector<uint32_t> free_ids;
    size_t key_heap_bytes = 0;
    std::vector<uint32_t> changed_ids;  // since the last commit, once tracking (may repeat)
    std::vector<Tombstone> removed;     // since the last commit, once tracking
    std::unique_ptr<std::unordered_map<Key, uint32_t>> pending;  // exact admission counts

    Shard() = default;
    Shard& operator=(Shard&& other) noexcept {  // the lock itself is not moved
      index = std::move(other.index);
      size = other.size;
      chunks = std::move(other.chunks);
      allocated = other.allocated;
      free_ids = std::move(other.free_ids);
      key_heap_bytes = other.key_heap_bytes;
      changed_ids = std::move(other.changed_ids);
      removed = std::move(other.removed);
      pending = std::move(other.pending);
      return *this;
    }
    Shard(Shard&& other) noexcept { *this = std::move(other); }
  };

  Layout MakeLayout(int num_slots) const {
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

  static char* EntryAt(const Layout& layout, const std::vector<char*>& chunks, uint32_t id) {
    if (id < layout.small_ids) return chunks[id / kSmallChunk] + (id % kSmallChunk) * layout.stride;
    const uint32_t large = id - layout.small_ids;
    return chunks[layout.small_ids / kSmallChunk + (large >> layout.chunk_shift)] +
           (large & (layout.per_chunk - 1)) * layout.stride;
  }
  char* EntryAt(const Shard& shard, uint32_t id) const {
    return EntryAt(layout_, shard.chunks, id);
  }
  // Gives entry `id` (the next one) storage if it starts a chunk.
  void AllocateChunkFor(Shard& shard, uint32_t id) {
    if (id < layout_.small_ids) {
      if (id % kSmallChunk == 0)
        shard.chunks.push_back(arena_->Allocate(kSmallChunk * layout_.stride));
    } else if (((id - layout_.small_ids) & (layout_.per_chunk - 1)) == 0) {
      shard.chunks.push_back(arena_->Allocate(size_t{layout_.per_chunk} * layout_.stride));
    }
  }
  static uint32_t IdAt(const Shard& shard, size_t pos) {
    return static_cast<uint32_t>(shard.index[pos]) - 1;
  }

  // Calls fn(id, entry) for each entry of the shard holding a key, in storage order (sequential
  // memory, unlike the index's order); stops when fn returns false. Caller holds the lock.
  template <typename Fn>
  void ForEachLiveEntry(const Shard& shard, Fn&& fn) const {
    for (uint32_t id = 0; id < shard.allocated; ++id) {
      char* entry = EntryAt(shard, id);
      if (HeaderOf(entry)->version != kFreeVersion && !fn(id, entry)) return;
    }
  }

  // The key's own hash, not the storage hash: see StorageHash. Computed only for missing keys.
  void FillInitialRowOf(KeyView key, float* out) const {
    FillInitialRow(init_, InitialRowKeyHash(key), out, dim_);
  }

  void CountLookups(int64_t n, int64_t found) const {
    lookups_.fetch_add(n, std::memory_order_relaxed);
    lookup_hits_.fetch_add(found, std::memory_order_relaxed);
  }

  // Whether a missing key's update creates its row; counts the update if not. Caller holds the
  // shard's exclusive lock.
  // UpdateRow's work under the shard's exclusive lock, which the caller holds.
  template <typename Fn>
  bool UpdateLocked(Shard& shard, KeyView key, uint64_t hash, int64_t step, Fn&& fn) {
    size_t pos;
    uint32_t id;
    if (FindSlot(shard, key, hash, &pos)) {
      id = IdAt(shard, pos);
    } else {
      if (!Admit(shard, key, hash)) {
        rejected_.fetch_add(1, std::memory_order_relaxed);
        return false;
      }
      id = CreateEntry(shard, key, hash);
      admitted_.fetch_add(1, std::memory_order_relaxed);
    }
    MarkChanged(shard, id);
    RowRef row = RowOf(EntryAt(shard, id));
    fn(row);
    if (*row.update_count != std::numeric_limits<uint32_t>::max()) ++*row.update_count;
    *row.last_step = step;
    return true;
  }

  // The latest training step any update recorded (what evict() uses by default).
  void RecordStep(int64_t step) {
    int64_t latest = latest_step_.load(std::memory_order_relaxed);
    while (step > latest &&
           !latest_step_.compare_exchange_weak(latest, step, std::memory_order_relaxed)) {
    }
  }

  bool Admit(Shard& shard, KeyView key, uint64_t hash) {
    if (admission_.min_count <= 1) return true;
    if (sketch_) return sketch_->Increment(hash) >= admission_.min_count;
    if (!shard.pending) shard.pending = std::make_unique<std::unordered_map<Key, uint32_t>>();
    auto it = shard.pending->try_emplace(Key(key), 0).first;
    if (++it->second < admission_.min_count) return false;
    shard.pending->erase(it);
    return true;
  }

  // From now on changes are tracked, so deltas since `version` can be taken. Caller holds
  // snapshot_mutex_ and every shard's lock (shared: the tracking state is atomic or guarded by
  // snapshot_mutex_).
  void StartTrackingAt(uint32_t version) {
    if (tracking_.load(std::memory_order_relaxed)) return;
    tracked_since_ = version;
    tracking_.store(true, std::memory_order_relaxed);
  }

  // Stamps the entry with the current version and, while tracking, remembers it as changed.
  // Caller holds the shard's exclusive lock.
  void MarkChanged(Shard& shard, uint32_t id) {
    Header* header = HeaderOf(EntryAt(shard, id));
    const uint32_t version = version_.load(std::memory_order_relaxed);
    if (header->version == version) return;
    header->version = version;
    if (tracking_.load(std::memory_order_relaxed)) shard.changed_ids.push_back(id);
  }

  bool Condemned(const EvictionCriteria& c, const char* entry) const {
    const Header* header = HeaderOf(entry);
    const int64_t idle = c.now_step - header->last_step;
    if (c.ttl_steps > 0 && idle >= c.ttl_steps) return true;
    if (c.min_frequency > 0 && header->update_count < c.min_frequency &&
        idle >= c.frequency_window_steps) {
      return true;
    }
    if (c.min_l2_norm > 0) {
      const float* embedding = EmbeddingOf(entry);
      float squares = 0.0f;
      for (int j = 0; j < dim_; ++j) squares += embedding[j] * embedding[j];
      if (squares < c.min_l2_norm * c.min_l2_norm) return true;
    }
    return false;
  }

  // Removals per hold of a shard's write lock (Evict, RemoveBatch): a hold stays far under a
  // millisecond.
  static constexpr size_t kEvictBatch = 256;

  // Counts a bulk removal (see FindBatch) while in scope.
  class BulkRemoval {
   public:
    explicit BulkRemoval(std::atomic<int>& count) : count_(count) {
      count_.fetch_add(1, std::memory_order_relaxed);
    }
    ~BulkRemoval() { count_.fetch_sub(1, std::memory_order_relaxed); }
    BulkRemoval(const BulkRemoval&) = delete;
    BulkRemoval& operator=(const BulkRemoval&) = delete;

   private:
    std::atomic<int>& count_;
  };

  // Keys key_at(0..n-1) grouped by shard with a counting sort: keys[first[s], first[s + 1]) are
  // shard s's, as their positions (increasing) and StorageHash, read in order by the callers.
  struct GroupedKey {
    int64_t index;
    uint64_t hash;
  };
  struct ShardGroups {
    std::unique_ptr<GroupedKey[]> keys;
    std::vector<int64_t> first;
  };
  template <typename KeyAt>
  ShardGroups GroupByShard(int64_t n, KeyAt&& key_at) const {
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

  // Copies the key's row into `row`, or its initial row when missing; whether it was present.
  // Caller holds the shard's lock.
  bool ServeRow(const Shard& shard, KeyView key, uint64_t hash, float* row) const {
    if (const char* entry = FindEntry(shard, key, hash)) {
      CopyRow(row, EmbeddingOf(entry));
      return true;
    }
    FillInitialRowOf(key, row);
    return false;
  }

  // FindBatch's rows (and which keys were present, where `present` is given), found in order or,
  // while a bulk removal runs, shard by shard; the number found.
  template <typename KeyAt>
  int64_t ServeRows(int64_t n, KeyAt&& key_at, float* out, int64_t out_stride,
                    bool* present = nullptr) const {
    return bulk_removals_.load(std::memory_order_relaxed) > 0
               ? FindByShard(n, key_at, out, out_stride, present)
               : FindInOrder(n, key_at, out, out_stride, present);
  }

  // FindBatch's usual way: every shard read-locked (in the order LockAll takes them, so it cannot
  // deadlock with it), the keys served in order.
  template <typename KeyAt>
  int64_t FindInOrder(int64_t n, KeyAt&& key_at, float* out, int64_t out_stride,
                      bool* present = nullptr) const {
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

  // FindBatch during a bulk removal: the keys grouped by shard, and only the shards of the keys
  // in flight held (in ascending order, as LockAll takes them), never all at once: a writer
  // holding one shard delays only the lookups that reach it, and a lookup delays a writer only
  // while it serves that shard's keys.
  template <typename KeyAt>
  int64_t FindByShard(int64_t n, KeyAt&& key_at, float* out, int64_t out_stride,
                      bool* present = nullptr) const {
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

  // Removes the shard's entries that select(entry) picks under the read lock and that still
  // pass recheck(entry) under the exclusive lock (see Evict).
  template <typename Select, typename Recheck>
  int64_t EvictFromShard(Shard& shard, Select&& select, Recheck&& recheck) {
    std::vector<Key> victims;
    {
      SharedGuard guard(shard.lock);
      ForEachLiveEntry(shard, [&](uint32_t, char* entry) {
        if (select(static_cast<const char*>(entry))) victims.push_back(KeyOf(entry));
        return true;
      });
    }
    BulkRemoval bulk(bulk_removals_);
    return RemoveInBatches(
        shard, static_cast<int64_t>(victims.size()), [&](int64_t i) { return KeyView(victims[i]); },
        [&](int64_t i) { return StorageHash(KeyView(victims[i])); }, recheck);
  }

  // Removes the entries of keys key_at(0..n-1) of this shard (hash_at(i): their StorageHash)
  // that still pass recheck(entry), in batches of kEvictBatch per hold of the shard's exclusive
  // lock. Lookups meanwhile take the shards one at a time (see FindBatch, while the caller counts
  // a BulkRemoval), and those that queue behind a batch get in before the next one takes the
  // lock (RWSpinLock hands over fairly).
  template <typename KeyAt, typename HashAt, typename Recheck>
  int64_t RemoveInBatches(Shard& shard, int64_t n, KeyAt&& key_at, HashAt&& hash_at,
                          Recheck&& recheck) {
    int64_t removed = 0;
    for (int64_t begin = 0; begin < n; begin += kEvictBatch) {
      ExclusiveGuard guard(shard.lock);
      for (int64_t i = begin; i < std::min<int64_t>(n, begin + kEvictBatch); ++i) {
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
  int64_t EvictLeastRecent(int64_t excess) {
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

  template <typename Fn>
  void ForEachLastStep(Fn&& fn) const {
    for (const auto& shard : shards_) {
      SharedGuard guard(shard.lock);
      ForEachLiveEntry(shard, [&](uint32_t, char* entry) {
        fn(HeaderOf(entry)->last_step);
        return true;
      });
    }
  }

  size_t ShardIndex(uint64_t hash) const { return hash & (shards_.size() - 1); }
  const Shard& ShardFor(uint64_t hash) const { return shards_[ShardIndex(hash)]; }
  Shard& ShardFor(uint64_t hash) { return shards_[ShardIndex(hash)]; }
  size_t HomeSlot(const Shard& shard, uint64_t hash) const {
    return (hash >> shard_bits_) & (shard.index.size() - 1);
  }
  static uint32_t Tag(uint64_t hash) { return static_cast<uint32_t>(hash >> 32); }
  // Common widths get a fixed-size copy the compiler inlines, instead of a memcpy call per row.
  void CopyRow(float* to, const float* from) const {
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
  void PrefetchIndex(uint64_t hash) const {
    const Shard& shard = ShardFor(hash);
    if (!shard.index.empty()) PrefetchLine(&shard.index[HomeSlot(shard, hash)]);
  }
  void PrefetchEntry(uint64_t hash) const {  // the entry of the home slot's first tag match
    const Shard& shard = ShardFor(hash);
    if (shard.index.empty()) return;
    const size_t mask = shard.index.size() - 1;
    for (size_t pos = HomeSlot(shard, hash);; pos = (pos + 1) & mask) {
      const uint64_t slot = shard.index[pos];
      if (slot == 0) return;
      if (static_cast<uint32_t>(slot >> 32) == Tag(hash)) {
        const char* entry = EntryAt(shard, static_cast<uint32_t>(slot) - 1);
        for (size_t line = 0; line < layout_.stride; line += 64) PrefetchLine(entry + line);
        return;
      }
    }
  }

  static Header* HeaderOf(char* entry) { return reinterpret_cast<Header*>(entry); }
  static const Header* HeaderOf(const char* entry) {
    return reinterpret_cast<const Header*>(entry);
  }
  static Key& KeyOf(char* entry) { return HeaderOf(entry)->key; }
  static const float* EmbeddingOf(const char* entry) {
    return reinterpret_cast<const float*>(entry + sizeof(Header));
  }
  RowRef RowOf(char* entry) const {
    Header* header = HeaderOf(entry);
    float* embedding = reinterpret_cast<float*>(entry + sizeof(Header));
    return RowRef{embedding, embedding + dim_, &header->update_count, &header->last_step};
  }

  bool FindSlot(const Shard& shard, KeyView key, uint64_t hash, size_t* pos_out) const {
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
  char* FindEntry(const Shard& shard, KeyView key, uint64_t hash) const {
    size_t pos;
    if (!FindSlot(shard, key, hash, &pos)) return nullptr;
    return EntryAt(shard, static_cast<uint32_t>(shard.index[pos]) - 1);
  }

  // Returns the new entry's id.
  uint32_t CreateEntry(Shard& shard, KeyView key, uint64_t hash) {
    if ((shard.size + 1) * 4 > shard.index.size() * 3) GrowIndex(shard);
    uint32_t id;
    if (!shard.free_ids.empty()) {
      id = shard.free_ids.back();
      shard.free_ids.pop_back();
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
  void RemoveAt(Shard& shard, size_t pos) {
    const uint32_t id = IdAt(shard, pos);
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

  void GrowIndex(Shard& shard) {
    std::vector<uint64_t> old = std::move(shard.index);
    shard.index.assign(std::max<size_t>(16, old.size() * 2), 0);
    const size_t mask = shard.index.size() - 1;
    for (uint64_t slot : old) {
      if (slot == 0) continue;
      const uint64_t hash =
          StorageHash(KeyView(KeyOf(EntryAt(shard, static_cast<uint32_t>(slot) - 1))));
      size_t pos = HomeSlot(shard, hash);
      while (shard.index[pos] != 0) pos = (pos + 1) & mask;
      shard.index[pos] = slot;
    }
  }

  // Linear-probing deletion without tombstones: later entries of the same probe run move
  // back into the hole, so lookups stay short after many removals.
  void BackwardShiftDelete(Shard& shard, size_t hole) {
    const size_t mask = shard.index.size() - 1;
    shard.index[hole] = 0;
    for (size_t pos = (hole + 1) & mask; shard.index[pos] != 0; pos = (pos + 1) & mask) {
      const uint64_t slot = shard.index[pos];
      const uint64_t hash =
          StorageHash(KeyView(KeyOf(EntryAt(shard, static_cast<uint32_t>(slot) - 1))));
      const size_t home = HomeSlot(shard, hash);
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

  void ReleaseKey(char* entry) {
    if constexpr (std::is_same_v<Key, std::string>) {
      std::string().swap(KeyOf(entry));  // give the heap buffer back
    }
  }

  void DestroyEntries(Shard& shard) {
    for (uint32_t id = 0; id < shard.allocated; ++id) HeaderOf(EntryAt(shard, id))->~Header();
  }

  void LockAll() {
    for (auto& shard : shards_) shard.lock.lock();
  }
  void UnlockAll() {
    for (auto& shard : shards_) shard.lock.unlock();
  }

  const int dim_;
  const InitializerSpec init_;
  const int shard_bits_;
  std::vector<Shard> shards_;
  const AdmissionSpec admission_;
  std::unique_ptr<CountMinSketch> sketch_;
  std::unique_ptr<ChunkArena> arena_ = std::make_unique<ChunkArena>();
  std::atomic<int64_t> size_{0};
  std::atomic<int> num_slots_{0};
  mutable std::mutex layout_mutex_;  // serializes EnsureSlots
  std::vector<float> slot_init_;
  Layout layout_;
  // Versions for delta snapshots: entries changed now get version_; Snapshot bumps it.
  std::atomic<uint32_t> version_{1};
  std::atomic<bool> tracking_{false};
  int64_t committed_version_ = 0, tracked_since_ = 0;  // guarded by snapshot_mutex_
  std::mutex snapshot_mutex_, evict_mutex_;
  std::atomic<int64_t> latest_step_{0};
  std::atomic<int64_t> admitted_{0}, rejected_{0}, evicted_{0};
  std::atomic<int> bulk_removals_{0};  // Evict and RemoveBatch calls removing rows now
  mutable std::atomic<int64_t> lookups_{0}, lookup_hits_{0};
};

}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_EMBEDDING_TABLE_H_
