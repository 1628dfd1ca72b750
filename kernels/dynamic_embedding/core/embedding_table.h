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
// go on meanwhile; bulk inserts, imports and restores (UpsertBatch) write in such batches too.
// Snapshot streams the whole table or only what changed since an earlier snapshot (changed rows and
// removed ids), for full and delta checkpoints.
//
// Files. Include this header only. It declares EmbeddingTable whole: its API with the contract of
// each call, its private types and its state. The constructor and accessors are defined in the
// class, every other member function out of it, in one header per concern included at the end:
//   embedding_table_entries.h   a shard's index and entries (addressing, probing, adding,
//                               removing), BytesInUse
//   embedding_table_lookup.h    Find, FindBatch and their prefetching pipelines
//   embedding_table_update.h    Upsert, UpsertBatch, UpdateRow, UpdateBatch (admission),
//                               EnsureSlots
//   embedding_table_removal.h   Remove, RemoveBatch, Clear, Evict
//   embedding_table_snapshot.h  Export, Snapshot and the change tracking of deltas, SwapContents
// (and chunk_arena.h, the memory entries live in). Members, not helper classes: every concern
// works on the same shards, layout and counters, and as members they reach those and each other
// directly, with no interface between them to keep. The definitions are marked inline, as a
// definition inside the class is, so the compiler inlines them just the same: the split is free.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_EMBEDDING_TABLE_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_EMBEDDING_TABLE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/dynamic_embedding/core/admission.h"
#include "kernels/dynamic_embedding/core/chunk_arena.h"
#include "kernels/dynamic_embedding/core/initializers.h"
#include "kernels/dynamic_embedding/core/rw_spinlock.h"
#include "kernels/dynamic_embedding/core/table_policies.h"

namespace tf_ext {
namespace de {

// Where a key is stored: the low bits pick its shard, the high 32 its tag, and the tag's low bits
// its home slot.
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
  int shard_bits() const { return shard_bits_; }
  int num_slots() const { return num_slots_.load(std::memory_order_acquire); }
  const InitializerSpec& initializer() const { return init_; }
  const AdmissionSpec& admission() const { return admission_; }
  std::vector<float> slot_initial_values() const {
    std::lock_guard<std::mutex> guard(layout_mutex_);
    return slot_init_;
  }
  // The largest step a training update has had (0 before the first).
  int64_t latest_step() const { return latest_step_.load(std::memory_order_relaxed); }
  int64_t Size() const { return size_.load(std::memory_order_relaxed); }
  TableCounters Counters() const {
    TableCounters counters;
    counters.admitted = admitted_.load(std::memory_order_relaxed);
    counters.rejected = rejected_.load(std::memory_order_relaxed);
    counters.evicted = evicted_.load(std::memory_order_relaxed);
    counters.lookups = lookups_.load(std::memory_order_relaxed);
    counters.lookup_hits = lookup_hits_.load(std::memory_order_relaxed);
    return counters;
  }
  // Keys looked for in the index by lookups (Find, FindBatch, FindDistinctBatch): below the
  // statistics' `lookups` where a batch's repeated keys were found once. For tests.
  int64_t Probes() const { return probes_.load(std::memory_order_relaxed); }
  // Bytes the table holds for its entries, index, admission counts and change tracking (not
  // counting the object itself).
  size_t BytesInUse() const;

  // Lookups (embedding_table_lookup.h).

  // Copies the key's embedding into out[0, dim). A missing key reads its initial value and
  // the table is left unchanged. Returns whether the key was present.
  bool Find(KeyView key, float* out) const;
  // Find for keys key_at(0..n-1) into out[i * dim, (i + 1) * dim), returning how many were
  // present. A shard is read-locked once per call, not once per key: under skewed ids the same
  // few locks would otherwise bounce between cores on every lookup. Usually every shard is
  // locked for the whole call and the keys are served in order, writing the rows sequentially,
  // the fastest. While a bulk write runs (Evict, RemoveBatch, UpsertBatch), whose every short
  // hold of a shard's write lock would otherwise wait for a whole call, the keys are served shard
  // by shard instead, holding only the shards of the keys in flight (FindByShard).
  // With out_stride, row i goes to out[i * out_stride, i * out_stride + dim) instead: into a
  // column window of a wider matrix, such as a concatenation of lookups.
  template <typename KeyAt>
  int64_t FindBatch(int64_t n, KeyAt&& key_at, float* out) const;
  // present (optional): present[i] tells whether key_at(i) had a row.
  template <typename KeyAt>
  int64_t FindBatch(int64_t n, KeyAt&& key_at, float* out, int64_t out_stride,
                    bool* present = nullptr) const;
  // FindBatch for distinct keys that stand for more lookups: key k counts as occurrences[k] lookups
  // (and hits), so the statistics are those of looking every occurrence up. Rows go to out[k *
  // dim].
  template <typename KeyAt>
  void FindDistinctBatch(int64_t n, KeyAt&& key_at, const int64_t* occurrences, float* out) const;
  // FindBatch as it runs during a bulk write, for tests.
  template <typename KeyAt>
  int64_t FindBatchByShardForTesting(int64_t n, KeyAt&& key_at, float* out,
                                     int64_t out_stride = 0) const;
  bool Contains(KeyView key) const;
  // How many readers wait for the key's shard behind a writer, for tests of the lock hand-over.
  uint32_t QueuedReadersForTesting(KeyView key) const {
    return ShardFor(StorageHash(key)).lock.queued_readers();
  }

  // Updates (embedding_table_update.h).

  // Runs fn(RowRef&, bool created) on the key's entry under the shard's exclusive lock,
  // creating the entry first (initial embedding, initial slots, zero metadata) if missing.
  // No admission, no bookkeeping: for inserts and restores.
  template <typename Fn>
  void Upsert(KeyView key, Fn&& fn);
  // One training update of the key at global step `step`: runs fn(RowRef&) on its entry under
  // the shard's exclusive lock, then counts the update and records the step. A missing key is
  // counted by the admission policy first: until admitted it gets no entry and fn does not run.
  // Returns whether fn ran.
  template <typename Fn>
  bool UpdateRow(KeyView key, int64_t step, Fn&& fn);
  // UpdateRow for keys key_at(0..n-1), running fn(i, RowRef&) for each admitted key i; returns
  // how many ran. Each shard's exclusive lock is taken once for its keys, not once per key. A key
  // given twice is updated twice, in order.
  template <typename KeyAt, typename Fn>
  int64_t UpdateBatch(int64_t n, KeyAt&& key_at, int64_t step, Fn&& fn);
  // Sets the embedding; slots and metadata are kept for an existing key. A new key gets initial
  // slots, no updates, and the latest training step as its last step (so a TTL counts from now).
  void InsertOrAssign(KeyView key, const float* embedding);
  // Upsert for keys key_at(0..n-1), running fn(i, RowRef&, bool created) for each; returns how
  // many were created. The keys are grouped by shard and written in batches of kWriteBatch per
  // hold of the shard's exclusive lock, as RemoveBatch removes them: lookups meanwhile go shard
  // by shard (see FindBatch) and wait at most one short batch. A key given twice is written
  // twice, in order, so the last write wins. For bulk inserts, imports and restores.
  template <typename KeyAt, typename Fn>
  int64_t UpsertBatch(int64_t n, KeyAt&& key_at, Fn&& fn);
  // InsertOrAssign for keys key_at(0..n-1) and rows[i * dim, (i + 1) * dim), by UpsertBatch.
  template <typename KeyAt>
  void InsertOrAssignBatch(int64_t n, KeyAt&& key_at, const float* rows);
  // Makes every entry carry at least `num_slots` optimizer slots; new slots of existing
  // entries and all slots of future entries start at slot_init[i]. Done once, when an
  // optimizer first updates the table, so lookup-only tables carry no slot memory.
  void EnsureSlots(int num_slots, const std::vector<float>& slot_init);

  // Removal and eviction (embedding_table_removal.h).

  bool Remove(KeyView key);
  // Remove for keys key_at(0..n-1), returning how many were present. The keys are grouped by
  // shard and removed in batches of kWriteBatch per hold of the shard's exclusive lock, as Evict
  // does: a lock per batch, not per key, and lookups wait at most one short batch.
  template <typename KeyAt>
  int64_t RemoveBatch(int64_t n, KeyAt&& key_at);
  void Clear();
  // Removes the rows `criteria` condemns, shard by shard: a shard is scanned under its read
  // lock, then its victims are removed under its exclusive lock in batches of kWriteBatch, each
  // victim re-checked (an update in between saves it). Lookups and updates of other shards, and
  // of this one between batches, go on. Returns the number of rows removed.
  int64_t Evict(const EvictionCriteria& criteria);

  // Snapshots (embedding_table_snapshot.h).

  // A consistent snapshot: all shards are read-locked while `visit` runs, so no writer can
  // interleave. alloc(n) is called first with the number of entries, then
  // visit(i, key, row) for i in [0, n).
  template <typename Alloc, typename Visit>
  void Export(Alloc&& alloc, Visit&& visit) const;
  // A consistent, streaming snapshot, for checkpoints: the table as it was at one instant, the
  // start of the call, while lookups, updates, inserts, removals and evictions go on. The instant
  // holds every shard's exclusive lock for O(shards) work (and a copy of the admission state, when
  // saved); then each shard is copied out in batches of kSaveBatchBytes per short hold of its
  // lock, and the callbacks run with no lock held. An entry that a writer changes or removes
  // before its batch is copied is first preserved as it was (copy-on-write, SaveEntryBeforeChange),
  // at most once per save: the extra memory is the entries changed during the save, at worst one
  // copy of the rows being saved. Calls begin(int64_t num_rows, int64_t num_tombstones)
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
                   bool track = true);
  // Snapshot with the admission state of the same instant, after the rows (whole, also in a
  // delta: it is bounded by the sketch, or by the table's memory): with exact admission
  // pending(const Key&, uint32_t count) for each id waiting, with a sketch sketch(const
  // CountMinSketch&) once; each returns bool, as the other callbacks.
  template <typename Begin, typename Row, typename TombstoneFn, typename PendingFn,
            typename SketchFn>
  int64_t Snapshot(int64_t since_version, Begin&& begin, Row&& row, TombstoneFn&& tombstone,
                   bool track, PendingFn&& pending, SketchFn&& sketch);
  // Restoring the admission state into a table being built (before SwapContents), as a snapshot
  // holds it. ClearAdmission forgets every count (a later file of a chain replaces the state).
  // RestorePending sets an id's exact count, or raises its sketch estimate to it. RestoreSketch
  // raises counters [first, first + n) to `values` (loading into a cleared sketch, merging by
  // max across shards' sketches) and returns false, changing nothing, when the table has no
  // sketch of this width and depth: those counters cannot be re-hashed, so they are dropped.
  void ClearAdmission();
  void RestorePending(KeyView key, uint32_t count);
  bool RestoreSketch(int64_t width, int depth, size_t first, size_t n, const uint32_t* values);
  // Declares the current content the base of later deltas, without walking it: for a table just
  // restored from a snapshot chain, whose next delta continues that chain. Returns the version
  // to pass as since_version.
  int64_t MarkSnapshotBase();
  // Forgets the changes and removals a durable snapshot of `version` holds.
  void CommitSnapshot(int64_t version);
  // Replaces the whole content with `other`'s (same dim, shards and admission spec), admission
  // counts included. Either all of it or nothing: the caller builds and validates `other` first.
  void SwapContents(EmbeddingTable& other);

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
  // An entry as it was at a running snapshot's instant, kept for it by the writer that changed or
  // removed the entry before the snapshot copied it.
  struct SavedEntry {
    Key key;
    int64_t last_step;
    uint32_t update_count;
    uint32_t version;
    std::vector<float> floats;  // the embedding, then the slots
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
    // While a snapshot runs: entry ids in [save_next, save_end) are not copied yet, and `saved`
    // holds those of them changed since its instant, as they were (SaveEntryBeforeChange).
    uint32_t save_next = 0, save_end = 0;
    std::unordered_map<uint32_t, SavedEntry> saved;

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

  // Removals or writes per hold of a shard's write lock (Evict, RemoveBatch, UpsertBatch): a
  // hold stays far under a millisecond (unless the shard's index grows in it).
  static constexpr size_t kWriteBatch = 256;
  // Bytes of entries a snapshot copies per hold of a shard's exclusive lock (at least 64 entries):
  // a copy of well under a millisecond, and few enough holds that each rarely meets a writer.
  static constexpr size_t kSaveBatchBytes = size_t{1} << 20;

  // Counts a bulk removal or write (see FindBatch) while in scope.
  class BulkWrite {
   public:
    explicit BulkWrite(std::atomic<int>& count) : count_(count) {
      count_.fetch_add(1, std::memory_order_relaxed);
    }
    ~BulkWrite() { count_.fetch_sub(1, std::memory_order_relaxed); }
    BulkWrite(const BulkWrite&) = delete;
    BulkWrite& operator=(const BulkWrite&) = delete;

   private:
    std::atomic<int>& count_;
  };

  // A shard's index and entries (embedding_table_entries.h).
  Layout MakeLayout(int num_slots) const;
  static char* EntryAt(const Layout& layout, const std::vector<char*>& chunks, uint32_t id);
  char* EntryAt(const Shard& shard, uint32_t id) const;
  void AllocateChunkFor(Shard& shard, uint32_t id);
  // Before a writer takes a shard's lock to write up to `count` entries: the memory new ones
  // would take is mapped and faulted in now, outside the lock (ChunkArena::Prepare). `arena`: the
  // caller's std::atomic_load of arena_, taken once for all the shards it writes.
  void PrepareEntries(ChunkArena& arena, int64_t count) const;
  static uint32_t IdAt(const Shard& shard, size_t pos);
  template <typename Fn>
  void ForEachLiveEntry(const Shard& shard, Fn&& fn) const;
  static Header* HeaderOf(char* entry);
  static const Header* HeaderOf(const char* entry);
  static Key& KeyOf(char* entry);
  static const float* EmbeddingOf(const char* entry);
  RowRef RowOf(char* entry) const;
  size_t ShardIndex(uint64_t hash) const;
  const Shard& ShardFor(uint64_t hash) const;
  Shard& ShardFor(uint64_t hash);
  size_t HomeSlot(const Shard& shard, uint64_t hash) const;
  static size_t HomeSlotOfTag(const Shard& shard, uint32_t tag);
  static uint32_t Tag(uint64_t hash);
  template <typename KeyAt>
  ShardGroups GroupByShard(int64_t n, KeyAt&& key_at) const;
  bool FindSlot(const Shard& shard, KeyView key, uint64_t hash, size_t* pos_out) const;
  char* FindEntry(const Shard& shard, KeyView key, uint64_t hash) const;
  uint32_t CreateEntry(Shard& shard, KeyView key, uint64_t hash);
  void RemoveAt(Shard& shard, size_t pos);
  void GrowIndex(Shard& shard);
  void BackwardShiftDelete(Shard& shard, size_t hole);
  void ReleaseKey(char* entry);
  void DestroyEntries(Shard& shard);
  void LockAll();
  void UnlockAll();

  // Lookups (embedding_table_lookup.h).
  void FillInitialRowOf(KeyView key, float* out) const;
  void CountLookups(int64_t n, int64_t found) const;
  bool ServeRow(const Shard& shard, KeyView key, uint64_t hash, float* row) const;
  template <typename KeyAt>
  int64_t ServeRows(int64_t n, KeyAt&& key_at, float* out, int64_t out_stride,
                    bool* present = nullptr) const;
  template <typename KeyAt>
  int64_t FindInOrder(int64_t n, KeyAt&& key_at, float* out, int64_t out_stride,
                      bool* present = nullptr) const;
  template <typename KeyAt>
  int64_t FindByShard(int64_t n, KeyAt&& key_at, float* out, int64_t out_stride,
                      bool* present = nullptr) const;
  void CopyRow(float* to, const float* from) const;
  void PrefetchIndex(uint64_t hash) const;
  void PrefetchEntry(uint64_t hash) const;
  bool PrefetchEntry(uint64_t hash, size_t bytes) const;

  // Updates (embedding_table_update.h).
  struct AdmissionCounts {
    int64_t admitted = 0, rejected = 0;
  };
  template <typename Fn>
  bool UpdateLocked(Shard& shard, KeyView key, uint64_t hash, int64_t step, Fn&& fn,
                    AdmissionCounts* counts);
  void AddAdmissionCounts(const AdmissionCounts& counts);
  void RecordStep(int64_t step);
  bool Admit(Shard& shard, KeyView key, uint64_t hash);

  // Removal and eviction (embedding_table_removal.h).
  bool Condemned(const EvictionCriteria& c, const char* entry) const;
  template <typename Select, typename Recheck>
  int64_t EvictFromShard(Shard& shard, Select&& select, Recheck&& recheck);
  template <typename KeyAt, typename HashAt, typename Recheck>
  int64_t RemoveInBatches(Shard& shard, int64_t n, KeyAt&& key_at, HashAt&& hash_at,
                          Recheck&& recheck);
  int64_t EvictLeastRecent(int64_t excess);
  template <typename Fn>
  void ForEachLastStep(Fn&& fn) const;

  // Change tracking for delta snapshots (embedding_table_snapshot.h).
  struct SkipAdmission {  // the admission callbacks of a Snapshot that saves no admission state
    template <typename... Args>
    bool operator()(Args&&...) const {
      return true;
    }
  };
  void StartTrackingAt(uint32_t version);
  void MarkChanged(Shard& shard, uint32_t id);
  // The snapshot in progress (embedding_table_snapshot.h).
  void SaveEntryBeforeChange(Shard& shard, uint32_t id);
  uint32_t VersionAtSaveInstant(const Shard& shard, uint32_t id) const;
  bool InSave(uint32_t version_at_instant) const;
  struct StagedRows;
  void StageForSave(Shard& shard, uint32_t id, StagedRows* staged);

  const int dim_;
  const InitializerSpec init_;
  const int shard_bits_;
  std::vector<Shard> shards_;
  const AdmissionSpec admission_;
  std::unique_ptr<CountMinSketch> sketch_;
  // Replaced (std::atomic_store) only under every shard's lock; read without one only through
  // std::atomic_load (PrepareEntries, BytesInUse).
  std::shared_ptr<ChunkArena> arena_ = std::make_shared<ChunkArena>();
  std::atomic<int64_t> size_{0};
  std::atomic<int> num_slots_{0};
  mutable std::mutex layout_mutex_;  // serializes EnsureSlots
  std::vector<float> slot_init_;
  Layout layout_;
  // Versions for delta snapshots: entries changed now get version_; Snapshot bumps it.
  std::atomic<uint32_t> version_{1};
  std::atomic<bool> tracking_{false};
  int64_t committed_version_ = 0, tracked_since_ = 0;  // guarded by snapshot_mutex_
  // snapshot_mutex_ serializes snapshots, commits and what replaces the storage (EnsureSlots,
  // Clear, SwapContents); taken before layout_mutex_ and the shard locks.
  std::mutex snapshot_mutex_, evict_mutex_;
  // The running snapshot's range: an entry is saved when its version at the instant is in
  // (save_since_, save_version_]. Written under every shard's exclusive lock, read under one.
  uint32_t save_since_ = 0, save_version_ = 0;
  std::atomic<int64_t> latest_step_{0};
  std::atomic<int64_t> admitted_{0}, rejected_{0}, evicted_{0};
  std::atomic<int> bulk_writes_{0};  // Evict, RemoveBatch and UpsertBatch calls writing now
  mutable std::atomic<int64_t> lookups_{0}, lookup_hits_{0}, probes_{0};
};

}  // namespace de
}  // namespace tf_ext

// The member functions, by concern (see the top of this file). Each of these headers includes this
// one too, so that it compiles on its own; the include guards make either order work.
#include "kernels/dynamic_embedding/core/embedding_table_entries.h"
#include "kernels/dynamic_embedding/core/embedding_table_lookup.h"
#include "kernels/dynamic_embedding/core/embedding_table_removal.h"
#include "kernels/dynamic_embedding/core/embedding_table_snapshot.h"
#include "kernels/dynamic_embedding/core/embedding_table_update.h"

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_EMBEDDING_TABLE_H_
