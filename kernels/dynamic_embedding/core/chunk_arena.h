// ChunkArena: the memory an EmbeddingTable's entries live in (embedding_table.h). TensorFlow-free.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_CHUNK_ARENA_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_CHUNK_ARENA_H_

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <new>
#include <vector>

#include "kernels/dynamic_embedding/core/huge_pages.h"

namespace tf_ext {
namespace de {

// Entry storage for one table: chunks are carved from slabs of an eighth of the memory already
// reserved (4 KiB to 4 MiB, so the unused tail stays small for small and large tables), and slabs
// of 2 MiB and more are advised as transparent huge pages: random lookups into a large table then
// miss the TLB far less. Chunks are only given back all at once, when the arena is destroyed.
class ChunkArena {
 public:
  ChunkArena() = default;
  ~ChunkArena() {
    if (spare_.base != nullptr) munmap(spare_.base, spare_.bytes);
    for (const Slab& slab : slabs_) {
      if (slab.mapped) {
        munmap(slab.base, slab.bytes);
      } else {
        std::free(slab.base);
      }
    }
  }
  ChunkArena(const ChunkArena&) = delete;
  ChunkArena& operator=(const ChunkArena&) = delete;

  char* Allocate(size_t bytes) {
    std::lock_guard<std::mutex> guard(mutex_);
    if (bytes > remaining_) NewSlab(bytes);
    char* chunk = next_;
    next_ += bytes;
    remaining_ -= bytes;
    remaining_hint_.store(remaining_, std::memory_order_relaxed);
    return chunk;
  }
  // When the next `bytes` of allocations would need a new slab: maps the next slab and touches
  // its pages now, to wait as the spare until Allocate needs it. A writer calls it before taking
  // a shard's lock, so that no lookup waits behind the lock while the kernel maps a slab and
  // faults its pages in (a huge page's first touch zeroes 2 MiB, and may compact memory first).
  // One spare at most, of the usual slab size: a larger call maps its later slabs as it goes.
  // Writers call it once per shard they write, so the usual answer (nothing to do) takes no lock:
  // it reads the hints, which may be stale; a stale "nothing to do" only leaves the mapping to
  // Allocate, as if Prepare had not been called, and a stale "maybe" is checked under the lock.
  void Prepare(size_t bytes) {
    if (bytes <= remaining_hint_.load(std::memory_order_relaxed) ||
        has_spare_hint_.load(std::memory_order_relaxed)) {
      return;
    }
    size_t slab_bytes;
    {
      std::lock_guard<std::mutex> guard(mutex_);
      if (bytes <= remaining_ || spare_.base != nullptr) return;
      slab_bytes = SlabBytes(0);
    }
    if (slab_bytes < kHugePage) return;  // a small slab comes from malloc: nothing to fault in
    const Slab slab = MapSlab(slab_bytes);
    for (size_t offset = 0; offset < slab.bytes; offset += kPage) slab.base[offset] = 0;
    std::lock_guard<std::mutex> guard(mutex_);
    if (spare_.base != nullptr) {  // another writer prepared one meanwhile
      munmap(slab.base, slab.bytes);
      return;
    }
    spare_ = slab;
    has_spare_hint_.store(true, std::memory_order_relaxed);
  }
  // For tests: whether a prepared slab waits.
  bool HasSpareForTesting() const {
    std::lock_guard<std::mutex> guard(mutex_);
    return spare_.base != nullptr;
  }
  size_t ReservedBytes() const {
    std::lock_guard<std::mutex> guard(mutex_);
    return reserved_;
  }

 private:
  static constexpr size_t kPage = size_t{4} << 10;
  struct Slab {
    char* base = nullptr;
    size_t bytes = 0;
    bool mapped = false;
  };
  // The size of the next slab for at least `at_least` bytes: an eighth of what is reserved
  // already (the unused tail stays under 12.5%), 4 KiB to 4 MiB, whole huge pages from 2 MiB.
  size_t SlabBytes(size_t at_least) const {
    size_t slab_bytes = std::min<size_t>(std::max<size_t>(reserved_ / 8, kPage), 4 << 20);
    slab_bytes = slab_bytes >= kHugePage ? slab_bytes / kHugePage * kHugePage
                                         : (slab_bytes + kPage - 1) & ~(kPage - 1);
    return std::max(slab_bytes, at_least);
  }
  void NewSlab(size_t at_least) {
    if (spare_.bytes >= at_least) {
      Use(spare_);
      spare_ = Slab{};
      has_spare_hint_.store(false, std::memory_order_relaxed);
      return;
    }
    const size_t bytes = SlabBytes(at_least);
    if (bytes < kHugePage) {  // small slabs come from malloc: no mapping per few KiB
      char* slab = static_cast<char*>(std::malloc(bytes));
      if (slab == nullptr) throw std::bad_alloc();
      Use(Slab{slab, bytes, false});
      return;
    }
    Use(MapSlab(bytes));
  }
  static Slab MapSlab(size_t bytes) {
    char* slab;
    if (bytes % kHugePage == 0) {
      slab = MapHugePages(bytes);
    } else {
      void* raw = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      slab = raw == MAP_FAILED ? nullptr : static_cast<char*>(raw);
    }
    if (slab == nullptr) throw std::bad_alloc();
    return Slab{slab, bytes, true};
  }
  void Use(const Slab& slab) {
    slabs_.push_back(slab);
    reserved_ += slab.bytes;
    next_ = slab.base;
    remaining_ = slab.bytes;
    remaining_hint_.store(remaining_, std::memory_order_relaxed);
  }

  mutable std::mutex mutex_;
  std::vector<Slab> slabs_;
  Slab spare_;  // mapped and touched by Prepare, not in use yet (not counted as reserved)
  char* next_ = nullptr;
  size_t remaining_ = 0, reserved_ = 0;
  // remaining_ and whether a spare waits, as of the last change under the mutex, for Prepare's
  // lock-free first look.
  std::atomic<size_t> remaining_hint_{0};
  std::atomic<bool> has_spare_hint_{false};
};

}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_CHUNK_ARENA_H_
