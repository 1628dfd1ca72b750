// The GPU table's slots (device_table.h): what a kernel body does with one key, on a GPU thread or
// a host thread (device_table_impl.h runs the bodies over whole batches). Claiming, finding and
// removing a key, the per-warp counts, and admission through the count-min sketch.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_SLOTS_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_SLOTS_H_

#include <algorithm>
#include <cstdint>

#include "kernels/dynamic_embedding/core/admission.h"
#include "kernels/dynamic_embedding/core/gpu/device_atomics.h"
#include "kernels/dynamic_embedding/core/initializers.h"

namespace tf_ext {
namespace de {
namespace gpu {

// Key slot values that hold no key. The user keys with these bit patterns (-1 and -2) live in
// two extra slots after the probed ones, which hold 0 while absent.
constexpr uint64_t kEmptyKey = ~uint64_t{0};
constexpr uint64_t kTombstoneKey = ~uint64_t{0} - 1;
constexpr int64_t kExtraSlots = 2;

struct EntryMeta {
  int64_t last_step;
  uint32_t update_count;
  uint32_t unused;
};

// The table's device counters.
enum Counter : int {
  kSize,
  kTombstones,
  kLatestStep,
  kAdmitted,
  kRejected,
  kHits,
  kScratch,  // per-operation results: rows removed, evicted, distinct keys
  kNumCounters
};

struct TableView {
  uint64_t* keys;
  float* values;
  EntryMeta* meta;
  int64_t* counters;
  uint64_t mask;     // probed slots - 1
  int64_t capacity;  // probed slots; then kExtraSlots
  int dim;
  int stride;  // floats per row: dim * (1 + num_slots)
};

struct SketchView {
  uint32_t* counters;  // null without sketch admission
  uint64_t width_mask;
  int depth;
  int64_t min_count;
};

TF_EXT_HOST_DEVICE inline bool IsExtraKey(uint64_t key) { return key >= kTombstoneKey; }

TF_EXT_HOST_DEVICE inline int64_t ExtraSlot(const TableView& t, uint64_t key) {
  return t.capacity + static_cast<int64_t>(key - kTombstoneKey);
}

// Whether slot s holds a key.
TF_EXT_HOST_DEVICE inline bool Live(const TableView& t, int64_t s) {
  const uint64_t key = atomic::Load(t.keys + s);
  return s < t.capacity ? key < kTombstoneKey : key != 0;
}

// The slot of `key`, or -1.
TF_EXT_HOST_DEVICE inline int64_t FindSlot(const TableView& t, int64_t key) {
  const uint64_t k = static_cast<uint64_t>(key);
  if (IsExtraKey(k)) {
    const int64_t s = ExtraSlot(t, k);
    return atomic::Load(t.keys + s) == k ? s : -1;
  }
  for (uint64_t pos = Mix64(k) & t.mask;; pos = (pos + 1) & t.mask) {
    const uint64_t held = atomic::Load(t.keys + pos);
    if (held == k) return static_cast<int64_t>(pos);
    if (held == kEmptyKey) return -1;
  }
}

// The slot of `key`, claiming a free one if missing (*created; the caller counts the rows it
// created, CountRows). The caller made room: a free slot always exists. Tombstones are never
// reused, so a key has at most one slot.
TF_EXT_HOST_DEVICE inline int64_t FindOrClaimSlot(const TableView& t, int64_t key, bool* created) {
  const uint64_t k = static_cast<uint64_t>(key);
  *created = false;
  if (IsExtraKey(k)) {
    const int64_t s = ExtraSlot(t, k);
    *created = atomic::CompareAndSwap(t.keys + s, 0, k) == 0;
    return s;
  }
  for (uint64_t pos = Mix64(k) & t.mask;; pos = (pos + 1) & t.mask) {
    uint64_t held = atomic::Load(t.keys + pos);
    if (held == kEmptyKey) {
      held = atomic::CompareAndSwap(t.keys + pos, kEmptyKey, k);
      if (held == kEmptyKey) {
        *created = true;
        return static_cast<int64_t>(pos);
      }
    }
    if (held == k) return static_cast<int64_t>(pos);
  }
}

// Removes the key in slot s (-1: none) if it is `key`; returns whether this call removed it.
// Every thread of the body calls it (the counts are per warp, atomic::AddWhere); `counter`, if not
// null, counts the removals too.
TF_EXT_HOST_DEVICE inline bool RemoveAt(const TableView& t, int64_t s, int64_t key,
                                        int64_t* counter) {
  const uint64_t k = static_cast<uint64_t>(key);
  const bool extra = s >= t.capacity;
  const bool removed =
      s >= 0 && atomic::CompareAndSwap(t.keys + s, k, extra ? 0 : kTombstoneKey) == k;
  atomic::AddWhere(t.counters + kSize, removed, -1);
  atomic::AddWhere(t.counters + kTombstones, removed && !extra, 1);
  if (counter != nullptr) atomic::AddWhere(counter, removed, 1);
  return removed;
}

// Counts rows created by FindOrClaimSlot; every thread of the body calls it.
TF_EXT_HOST_DEVICE inline void CountRows(const TableView& t, bool created) {
  atomic::AddWhere(t.counters + kSize, created, 1);
}

// Counts one more update of a missing key with this hash (conservative update, as
// CountMinSketch::Increment); returns whether it is admitted.
TF_EXT_HOST_DEVICE inline bool Admit(const SketchView& sketch, uint64_t hash) {
  if (sketch.min_count <= 1) return true;
  uint32_t estimate = ~uint32_t{0};
  for (int row = 0; row < sketch.depth; ++row) {
    estimate = MinOf(
        estimate, atomic::Load(sketch.counters + SketchCounterIndex(row, hash, sketch.width_mask)));
  }
  if (estimate == ~uint32_t{0}) return true;  // saturated
  const uint32_t raised = estimate + 1;
  for (int row = 0; row < sketch.depth; ++row) {
    atomic::Max(sketch.counters + SketchCounterIndex(row, hash, sketch.width_mask), raised);
  }
  return raised >= sketch.min_count;
}

// Temporary memory of one operation, freed with it.
template <typename Exec, typename T>
class Scratch {
 public:
  Scratch(Exec& exec, int64_t n) : exec_(exec) {
    ptr_ = static_cast<T*>(exec.Alloc(sizeof(T) * static_cast<size_t>(std::max<int64_t>(n, 1))));
  }
  ~Scratch() { exec_.Free(ptr_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  T* get() const { return ptr_; }
  bool ok() const { return ptr_ != nullptr; }

 private:
  Exec& exec_;
  T* ptr_;
};

}  // namespace gpu
}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_SLOTS_H_
