// The dynamic embedding table core: an exact (collision-free) hash map from int64 or string
// keys to float rows. No TensorFlow types, so it is unit-tested alone.
//
// Layout. The table is split into shards, each guarded by its own reader-writer spinlock, so
// lookups of different keys never contend on a global lock. A shard has
//   - an open-addressing index of 8-byte slots: (32-bit hash tag << 32) | (entry id + 1),
//   - entries stored back to back in fixed-size chunks (about 16 KiB), so memory grows with
//     the number of ids, pointers stay valid when the index grows, and ids of removed entries
//     are reused.
// Slots and shards come from StorageHash(key); a missing key's row from InitialRowKeyHash(key).
// One entry holds everything about a key contiguously: the key, its update count, the step
// of its last update, the embedding and then the optimizer slots. A lookup or an update is
// therefore one probe and one (usually one cache line further) memory access.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_EMBEDDING_TABLE_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_EMBEDDING_TABLE_H_

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/dynamic_embedding/core/initializers.h"
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

// Entry storage for one table: chunks are carved from slabs of an eighth of the memory already
// reserved (64 KiB to 4 MiB, so the unused tail stays small), and slabs of 2 MiB and more are
// advised as transparent huge pages: random lookups into a large table then miss the TLB far less.
// Chunks are only given back all at once, when the arena is destroyed.
class ChunkArena {
 public:
  ChunkArena() = default;
  ~ChunkArena() {
    for (const auto& slab : slabs_) munmap(slab.first, slab.second);
  }
  ChunkArena(const ChunkArena&) = delete;
  ChunkArena& operator=(const ChunkArena&) = delete;

  char* Allocate(size_t bytes) {
    std::lock_guard<std::mutex> guard(mutex_);
    if (bytes > remaining_) NewSlab(bytes);
    char* chunk = next_;
    next_ += bytes;
    remaining_ -= bytes;
    return chunk;
  }
  size_t ReservedBytes() const {
    std::lock_guard<std::mutex> guard(mutex_);
    return reserved_;
  }

 private:
  static constexpr size_t kHugePage = size_t{2} << 20;
  void NewSlab(size_t at_least) {
    // An eighth of what is reserved already: the unused tail stays under 12.5%.
    size_t slab_bytes = std::min<size_t>(std::max<size_t>(reserved_ / 8, 64 << 10), 4 << 20);
    slab_bytes = slab_bytes >= kHugePage ? slab_bytes / kHugePage * kHugePage
                                         : (slab_bytes + 0xFFFF) & ~size_t{0xFFFF};
    const size_t bytes = std::max(slab_bytes, at_least);
    // Huge pages need 2 MiB-aligned ranges: over-map, then trim the ends.
    const bool huge = bytes >= kHugePage && bytes % kHugePage == 0;
    const size_t mapped = huge ? bytes + kHugePage : bytes;
    char* base = static_cast<char*>(
        mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (base == MAP_FAILED) throw std::bad_alloc();
    char* slab = base;
    if (huge) {
      slab = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(base) + kHugePage - 1) &
                                     ~(kHugePage - 1));
      if (slab > base) munmap(base, slab - base);
      char* end = slab + bytes;
      if (base + mapped > end) munmap(end, base + mapped - end);
      madvise(slab, bytes, MADV_HUGEPAGE);
    }
    slabs_.emplace_back(slab, bytes);
    reserved_ += bytes;
    next_ = slab;
    remaining_ = bytes;
  }

  mutable std::mutex mutex_;
  std::vector<std::pair<char*, size_t>> slabs_;
  char* next_ = nullptr;
  size_t remaining_ = 0, reserved_ = 0;
};

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
  int64_t* update_count;
  int64_t* last_step;
};

template <typename Key>
class EmbeddingTable {
 public:
  using KeyView = typename KeyTraits<Key>::View;

  EmbeddingTable(int dim, const InitializerSpec& init, int shard_bits = 6)
      : dim_(dim), init_(init), shard_bits_(shard_bits), shards_(size_t{1} << shard_bits) {
    SetLayout(0);
  }
  ~EmbeddingTable() {
    for (auto& shard : shards_) DestroyEntries(shard);
  }
  EmbeddingTable(const EmbeddingTable&) = delete;
  EmbeddingTable& operator=(const EmbeddingTable&) = delete;

  int dim() const { return dim_; }
  int num_slots() const { return num_slots_.load(std::memory_order_acquire); }
  const InitializerSpec& initializer() const { return init_; }
  std::vector<float> slot_initial_values() const {
    std::lock_guard<std::mutex> guard(layout_mutex_);
    return slot_init_;
  }

  // Copies the key's embedding into out[0, dim). A missing key reads its initial value and
  // the table is left unchanged. Returns whether the key was present.
  bool Find(KeyView key, float* out) const {
    const uint64_t hash = StorageHash(key);
    const Shard& shard = ShardFor(hash);
    {
      SharedGuard guard(shard.lock);
      if (const char* entry = FindEntry(shard, key, hash)) {
        std::memcpy(out, EmbeddingOf(entry), sizeof(float) * dim_);
        return true;
      }
    }
    FillInitialRowOf(key, out);
    return false;
  }

  // Find for keys key_at(0..n-1) into out[i * dim, (i + 1) * dim), returning how many were
  // present. Every shard is read-locked once for the whole call (in the same order LockAll
  // takes them, so it cannot deadlock with it) instead of once per key: under skewed ids the
  // same few locks would otherwise bounce between cores on every lookup. Callers keep n
  // moderate (a few thousand) so writers wait little.
  template <typename KeyAt>
  int64_t FindBatch(int64_t n, KeyAt&& key_at, float* out) const {
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
      float* row = out + i * dim_;
      if (const char* entry = FindEntry(ShardFor(hash), key_at(i), hash)) {
        CopyRow(row, EmbeddingOf(entry));
        ++found;
      } else {
        FillInitialRowOf(key_at(i), row);
      }
    }
    for (const auto& shard : shards_) shard.lock.unlock_shared();
    return found;
  }

  bool Contains(KeyView key) const {
    const uint64_t hash = StorageHash(key);
    const Shard& shard = ShardFor(hash);
    SharedGuard guard(shard.lock);
    return FindEntry(shard, key, hash) != nullptr;
  }

  // Runs fn(RowRef&, bool created) on the key's entry under the shard's exclusive lock,
  // creating the entry first (initial embedding, initial slots, zero metadata) if missing.
  template <typename Fn>
  void Upsert(KeyView key, Fn&& fn) {
    const uint64_t hash = StorageHash(key);
    Shard& shard = ShardFor(hash);
    ExclusiveGuard guard(shard.lock);
    bool created = false;
    char* entry = FindEntry(shard, key, hash);
    if (entry == nullptr) {
      entry = CreateEntry(shard, key, hash);
      created = true;
    }
    RowRef row = RowOf(entry);
    fn(row, created);
  }

  // Sets the embedding; slots and metadata are kept for an existing key, initial for a new one.
  void InsertOrAssign(KeyView key, const float* embedding) {
    Upsert(key,
           [&](RowRef& row, bool) { std::memcpy(row.embedding, embedding, sizeof(float) * dim_); });
  }

  bool Remove(KeyView key) {
    const uint64_t hash = StorageHash(key);
    Shard& shard = ShardFor(hash);
    ExclusiveGuard guard(shard.lock);
    size_t pos;
    if (!FindSlot(shard, key, hash, &pos)) return false;
    const uint32_t id = static_cast<uint32_t>(shard.index[pos]) - 1;
    char* entry = EntryAt(shard, id);
    shard.key_heap_bytes -= KeyTraits<Key>::HeapBytes(KeyOf(entry));
    ReleaseKey(entry);
    shard.free_ids.push_back(id);
    BackwardShiftDelete(shard, pos);
    --shard.size;
    size_.fetch_sub(1, std::memory_order_relaxed);
    return true;
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
    UnlockAll();
  }

  // Bytes the table holds for its entries and index (not counting the object itself).
  size_t BytesInUse() const {
    size_t bytes = shards_.size() * sizeof(Shard);
    for (const auto& shard : shards_) {
      SharedGuard guard(shard.lock);
      bytes += shard.index.capacity() * sizeof(uint64_t) + shard.chunks.capacity() * sizeof(char*) +
               shard.free_ids.capacity() * sizeof(uint32_t) + shard.key_heap_bytes;
    }
    return bytes + arena_->ReservedBytes();
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
    const size_t old_stride = stride_, old_chunk_shift = chunk_shift_;
    std::vector<float> new_init = slot_init_;
    for (int i = old_slots; i < num_slots; ++i) new_init.push_back(slot_init[i]);
    slot_init_ = new_init;
    SetLayout(num_slots);
    std::unique_ptr<ChunkArena> old_arena = std::move(arena_);
    arena_ = std::make_unique<ChunkArena>();
    for (auto& shard : shards_) {
      std::vector<char*> old_chunks = std::move(shard.chunks);
      shard.chunks.clear();
      const uint32_t count = shard.allocated;
      for (uint32_t id = 0; id < count; ++id) {
        if (id % entries_per_chunk_ == 0) shard.chunks.push_back(arena_->Allocate(chunk_bytes_));
        const char* from = old_chunks[id >> old_chunk_shift] +
                           (id & ((size_t{1} << old_chunk_shift) - 1)) * old_stride;
        char* to = EntryAt(shard, id);
        new (to) Header(std::move(*reinterpret_cast<Header*>(const_cast<char*>(from))));
        reinterpret_cast<Header*>(const_cast<char*>(from))->~Header();
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
        for (uint64_t slot : shard.index) {
          if (slot == 0) continue;
          char* entry = const_cast<char*>(EntryAt(shard, static_cast<uint32_t>(slot) - 1));
          visit(i++, static_cast<const Key&>(KeyOf(entry)), RowOf(entry));
        }
      }
    }
    for (const auto& shard : shards_) shard.lock.unlock_shared();
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
    const int slots = num_slots_.load(), other_slots = other.num_slots_.load();
    SetLayout(other_slots);
    other.SetLayout(slots);
    num_slots_.store(other_slots);
    other.num_slots_.store(slots);
    other.UnlockAll();
    UnlockAll();
  }

 private:
  struct Header {
    Key key;
    int64_t update_count;
    int64_t last_step;
  };

  struct alignas(64) Shard {
    mutable RWSpinLock lock;
    std::vector<uint64_t> index;  // empty until the first insert
    size_t size = 0;
    std::vector<char*> chunks;  // carved from the table's arena
    uint32_t allocated = 0;     // entry ids in [0, allocated) have storage
    std::vector<uint32_t> free_ids;
    size_t key_heap_bytes = 0;

    Shard() = default;
    Shard& operator=(Shard&& other) noexcept {  // the lock itself is not moved
      index = std::move(other.index);
      size = other.size;
      chunks = std::move(other.chunks);
      allocated = other.allocated;
      free_ids = std::move(other.free_ids);
      key_heap_bytes = other.key_heap_bytes;
      return *this;
    }
    Shard(Shard&& other) noexcept { *this = std::move(other); }
  };

  void SetLayout(int num_slots) {
    const size_t raw = sizeof(Header) + sizeof(float) * dim_ * (1 + num_slots);
    stride_ = (raw + alignof(Header) - 1) / alignof(Header) * alignof(Header);
    // Chunks of about 16 KiB, a power of two entries (at least 16) so an id splits by shifts;
    // small enough that each shard's partly used last chunk wastes little in small tables.
    size_t per_chunk = 16;
    while (per_chunk * 2 * stride_ <= 16384) per_chunk *= 2;
    entries_per_chunk_ = per_chunk;
    chunk_shift_ = 0;
    while ((size_t{1} << chunk_shift_) < per_chunk) ++chunk_shift_;
    chunk_bytes_ = per_chunk * stride_;
  }

  // The key's own hash, not the storage hash: see StorageHash. Computed only for missing keys.
  void FillInitialRowOf(KeyView key, float* out) const {
    FillInitialRow(init_, InitialRowKeyHash(key), out, dim_);
  }

  const Shard& ShardFor(uint64_t hash) const { return shards_[hash & (shards_.size() - 1)]; }
  Shard& ShardFor(uint64_t hash) { return shards_[hash & (shards_.size() - 1)]; }
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
    if (!shard.index.empty()) __builtin_prefetch(&shard.index[HomeSlot(shard, hash)]);
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
        for (size_t line = 0; line < stride_; line += 64) __builtin_prefetch(entry + line);
        return;
      }
    }
  }

  char* EntryAt(const Shard& shard, uint32_t id) const {
    return shard.chunks[id >> chunk_shift_] + (id & (entries_per_chunk_ - 1)) * stride_;
  }
  static Key& KeyOf(char* entry) { return reinterpret_cast<Header*>(entry)->key; }
  static const float* EmbeddingOf(const char* entry) {
    return reinterpret_cast<const float*>(entry + sizeof(Header));
  }
  RowRef RowOf(char* entry) const {
    Header* header = reinterpret_cast<Header*>(entry);
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

  char* CreateEntry(Shard& shard, KeyView key, uint64_t hash) {
    if ((shard.size + 1) * 4 > shard.index.size() * 3) GrowIndex(shard);
    uint32_t id;
    if (!shard.free_ids.empty()) {
      id = shard.free_ids.back();
      shard.free_ids.pop_back();
    } else {
      id = shard.allocated++;
      if (id % entries_per_chunk_ == 0) shard.chunks.push_back(arena_->Allocate(chunk_bytes_));
      new (EntryAt(shard, id)) Header();
    }
    char* entry = EntryAt(shard, id);
    Header* header = reinterpret_cast<Header*>(entry);
    header->key = Key(key);
    header->update_count = 0;
    header->last_step = 0;
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
    return entry;
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
    for (uint32_t id = 0; id < shard.allocated; ++id) {
      reinterpret_cast<Header*>(EntryAt(shard, id))->~Header();
    }
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
  std::unique_ptr<ChunkArena> arena_ = std::make_unique<ChunkArena>();
  std::atomic<int64_t> size_{0};
  std::atomic<int> num_slots_{0};
  mutable std::mutex layout_mutex_;  // serializes EnsureSlots
  std::vector<float> slot_init_;
  size_t stride_ = 0, entries_per_chunk_ = 0, chunk_shift_ = 0, chunk_bytes_ = 0;
};

}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_EMBEDDING_TABLE_H_
