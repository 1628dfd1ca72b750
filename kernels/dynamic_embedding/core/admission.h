// Frequency admission: an id gets a table row only on its min_count-th update. Until then its
// updates are only counted, here, in bounded memory.
//
// CountMinSketch: `depth` rows of `width` 32-bit counters. An id's count is the minimum of its
// `depth` counters. Updates are conservative (a counter is raised only up to the id's new
// estimate), which keeps over-counting far below the plain sketch's. Counters only ever grow,
// through an atomic max, so an estimate is never below the true count, also under concurrent
// updates: the sketch can admit an id early (a "false admission"), never late. Ids evicted from
// the table keep their counts, so they are re-admitted at their next update.
//
// Snapshots save the counters with the table (snapshot_file.h). Restoring a sharded table into
// another number of shards merges the old shards' sketches (of one width and depth) by an
// element-wise max: an id was counted in one old shard's sketch only, where its counters are at
// least its count, so the max keeps every estimate at least the true count (never late). A sum,
// the plain sketch's merge of two streams, would add the other shards' unrelated counts to every
// estimate: more false admissions, for no gain.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_ADMISSION_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_ADMISSION_H_

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

#include "kernels/dynamic_embedding/core/host_device.h"
#include "kernels/dynamic_embedding/core/huge_pages.h"
#include "kernels/dynamic_embedding/core/prefetch.h"

namespace tf_ext {
namespace de {

// The counter of row `row` of a sketch of width_mask + 1 counters per row for an id's hash:
// double hashing of the two 32-bit halves, re-mixed so that the table's shard and slot bits (the
// hash's low bits) do not pick the same counters. The GPU table's sketch uses it too.
TF_EXT_HOST_DEVICE inline uint64_t SketchCounterIndex(int row, uint64_t hash, uint64_t width_mask) {
  uint64_t mixed = hash;
  mixed ^= mixed >> 31;
  mixed *= 0x7fb5d329728ea185ULL;
  mixed ^= mixed >> 27;
  mixed *= 0x81dadef4bc2dd44dULL;
  mixed ^= mixed >> 33;
  const uint64_t h2 = (mixed >> 32) | 1;
  return static_cast<uint64_t>(row) * (width_mask + 1) + ((mixed + row * h2) & width_mask);
}

// The sketch's width for a requested width: rounded down to a power of two, at least 1024.
inline int64_t SketchWidth(int64_t requested) {
  int64_t rounded = 1024;
  while (rounded * 2 <= requested) rounded *= 2;
  return rounded;
}

class CountMinSketch {
 public:
  // `width` is rounded down to a power of two (at least 1024).
  CountMinSketch(int64_t width, int depth)
      : depth_(depth),
        width_mask_(static_cast<uint64_t>(SketchWidth(width)) - 1),
        counters_(AllocateCounters(static_cast<size_t>(width_mask_ + 1) * depth)) {
    for (size_t i = 0; i < NumCounters(); ++i) counters_[i].store(0, std::memory_order_relaxed);
  }

  // A copy of the counts as they are now (a snapshot's instant): no update may run meanwhile.
  CountMinSketch(const CountMinSketch& other) : CountMinSketch(other.width(), other.depth_) {
    for (size_t i = 0; i < NumCounters(); ++i) {
      counters_[i].store(other.counters_[i].load(std::memory_order_relaxed),
                         std::memory_order_relaxed);
    }
  }

  // Counts one more update of the id with this 64-bit hash; returns its new estimated count.
  uint32_t Increment(uint64_t hash) {
    uint32_t estimate = std::numeric_limits<uint32_t>::max();
    for (int row = 0; row < depth_; ++row) {
      estimate = std::min(estimate, Counter(row, hash).load(std::memory_order_relaxed));
    }
    if (estimate == std::numeric_limits<uint32_t>::max()) return estimate;  // saturated
    const uint32_t raised = estimate + 1;
    for (int row = 0; row < depth_; ++row) RaiseCounter(&Counter(row, hash), raised);
    return raised;
  }

  // Starts loading the id's counters (a training update's pipeline calls it a few keys ahead
  // of the Increment of an id it found missing): they are random reads in a large array.
  void Prefetch(uint64_t hash) const {
    for (int row = 0; row < depth_; ++row) PrefetchLine(&Counter(row, hash));
  }

  uint32_t Estimate(uint64_t hash) const {
    uint32_t estimate = std::numeric_limits<uint32_t>::max();
    for (int row = 0; row < depth_; ++row) {
      estimate = std::min(estimate, Counter(row, hash).load(std::memory_order_relaxed));
    }
    return estimate;
  }

  // Raises the id's counters to at least `count`: its estimate becomes at least `count` (an
  // exactly counted id restored into a sketch).
  void Raise(uint64_t hash, uint32_t count) {
    for (int row = 0; row < depth_; ++row) RaiseCounter(&Counter(row, hash), count);
  }

  int64_t width() const { return static_cast<int64_t>(width_mask_ + 1); }
  int depth() const { return depth_; }
  size_t Bytes() const { return sizeof(uint32_t) * (width_mask_ + 1) * depth_; }

  // The counters, row after row (width() * depth() of them), as snapshots save and restore them.
  size_t NumCounters() const { return static_cast<size_t>(width_mask_ + 1) * depth_; }
  void CopyCounters(size_t first, size_t n, uint32_t* out) const {
    for (size_t i = 0; i < n; ++i) out[i] = counters_[first + i].load(std::memory_order_relaxed);
  }
  // Counters [first, first + n) become the larger of theirs and `values`: into a zeroed sketch
  // this loads them; across sketches of one width and depth it merges them (see MergeMax below).
  void MaxCounters(size_t first, size_t n, const uint32_t* values) {
    for (size_t i = 0; i < n; ++i) RaiseCounter(&counters_[first + i], values[i]);
  }
  // Exchanges the counts with a sketch of the same width and depth. Not atomic: no update of
  // either may run meanwhile.
  void SwapCounters(CountMinSketch& other) { std::swap(counters_, other.counters_); }
  void Clear() {
    for (size_t i = 0; i < NumCounters(); ++i) counters_[i].store(0, std::memory_order_relaxed);
  }

 private:
  // The counters' memory: from 2 MiB on, huge pages (huge_pages.h: an update reads `depth` random
  // counters); smaller, or where the mapping fails, from the heap. Zeroed by the constructor.
  struct FreeCounters {
    size_t bytes;  // mapped bytes, 0 for the heap
    void operator()(std::atomic<uint32_t>* counters) const {
      if (bytes > 0) {
        munmap(counters, bytes);
      } else {
        std::free(counters);
      }
    }
  };
  using Counters = std::unique_ptr<std::atomic<uint32_t>[], FreeCounters>;
  static Counters AllocateCounters(size_t n) {
    // No array cookie and no destructor to run: the deleter only gives the memory back.
    static_assert(std::is_trivially_destructible_v<std::atomic<uint32_t>>);
    const size_t bytes = n * sizeof(std::atomic<uint32_t>);
    if (bytes >= kHugePage) {
      const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
      if (char* mapped = MapHugePages(rounded)) {
        return Counters(
            new (mapped) std::atomic<uint32_t>[n], FreeCounters { rounded });
      }
    }
    void* heap = std::malloc(bytes);
    if (heap == nullptr) throw std::bad_alloc();
    return Counters(
        new (heap) std::atomic<uint32_t>[n], FreeCounters { 0 });
  }

  std::atomic<uint32_t>& Counter(int row, uint64_t hash) const {
    return counters_[SketchCounterIndex(row, hash, width_mask_)];
  }
  static void RaiseCounter(std::atomic<uint32_t>* counter, uint32_t to) {
    uint32_t value = counter->load(std::memory_order_relaxed);
    while (value < to && !counter->compare_exchange_weak(value, to, std::memory_order_relaxed)) {
    }
  }

  const int depth_;
  const uint64_t width_mask_;
  Counters counters_;
};

// How a table admits new ids. min_count <= 1 admits every id at its first update.
struct AdmissionSpec {
  int64_t min_count = 0;
  bool exact = false;        // exact per-id counters (memory grows with the pending ids)
  int64_t sketch_width = 0;  // counters per sketch row
  int sketch_depth = 4;
};

}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_ADMISSION_H_
