// DeviceTableImpl's removals: Remove, RemoveHostKeys, Evict (condemned, then least recently
// updated), Clear. Part of device_table_impl.h, which includes it at its end.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_TABLE_REMOVAL_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_TABLE_REMOVAL_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/dynamic_embedding/core/gpu/device_table_impl.h"

namespace tf_ext {
namespace de {
namespace gpu {

template <typename Exec>
inline std::string DeviceTableImpl<Exec>::Remove(cudaStream_t stream, int64_t n,
                                                 const int64_t* keys, int64_t* removed) {
  const OneCaller caller(this, stream);
  if (!caller.ok()) return Busy();
  if (removed != nullptr) *removed = 0;
  if (n <= 0) return "";
  const std::string error = MakeLogRoom(n);
  if (!error.empty()) return error;
  const TableView t = View();
  const RemovalLog log = Log();
  ZeroCounter(kScratch);
  exec_.For(
      n, [=] TF_EXT_HOST_DEVICE(int64_t i) { RemoveAt(t, log, FindSlot(t, keys[i]), keys[i], i); });
  if (removed != nullptr) *removed = ReadCounter(kScratch);
  return Checked("remove");
}

template <typename Exec>
inline std::string DeviceTableImpl<Exec>::Evict(cudaStream_t stream,
                                                const EvictionCriteria& criteria,
                                                int64_t* evicted) {
  const OneCaller caller(this, stream);
  if (!caller.ok()) return Busy();
  const TableView t = View();
  const EvictionCriteria c = criteria;
  if (tracking_) {  // the removal log makes room for the condemned rows first
    ZeroCounter(kScratch);
    exec_.For(t.capacity + kExtraSlots, [=] TF_EXT_HOST_DEVICE(int64_t s) {
      atomic::AddWhere(Stripe(t.counters, kScratch, s), CondemnedAt(t, c, s), 1);
    });
    const std::string no_room = MakeLogRoom(ReadCounter(kScratch));
    if (!no_room.empty()) return no_room;
  }
  const RemovalLog log = Log();
  ZeroCounter(kScratch);
  exec_.For(t.capacity + kExtraSlots, [=] TF_EXT_HOST_DEVICE(int64_t s) {
    RemoveAt(t, log, CondemnedAt(t, c, s) ? s : -1, static_cast<int64_t>(t.keys[s]), s);
  });
  int64_t removed = ReadCounter(kScratch);
  std::string error;
  if (criteria.max_size > 0) error = EvictLeastRecent(criteria.max_size, &removed);
  evicted_ += removed;
  if (evicted != nullptr) *evicted = removed;
  return error.empty() ? Checked("evict") : error;
}

template <typename Exec>
inline std::string DeviceTableImpl<Exec>::EvictLeastRecent(int64_t max_size, int64_t* removed) {
  const int64_t excess = ReadCounter(kSize) - max_size;
  if (excess <= 0) return "";
  const int64_t slots = capacity_ + kExtraSlots;
  Scratch<Exec, int64_t> live(exec_, slots + 1), before(exec_, slots + 1);
  if (!live.ok() || !before.ok()) return Error("out of device memory for eviction");
  const TableView t = View();
  int64_t* is_live = live.get();
  exec_.For(slots + 1, [=] TF_EXT_HOST_DEVICE(int64_t s) {
    is_live[s] = s < t.capacity + kExtraSlots && Live(t, s);
  });
  if (!exec_.ExclusiveSum(is_live, before.get(), slots + 1)) return Error("out of memory");
  const int64_t rows = ReadCounter(kSize);
  Scratch<Exec, uint64_t> steps(exec_, rows), sorted_steps(exec_, rows);
  Scratch<Exec, int64_t> slot_list(exec_, rows), sorted_slots(exec_, rows);
  if (!steps.ok() || !sorted_steps.ok() || !slot_list.ok() || !sorted_slots.ok()) {
    return Error("out of device memory for eviction of " + std::to_string(rows) + " rows");
  }
  const int64_t* live_before = before.get();
  uint64_t* step_of = steps.get();
  int64_t* slot_at = slot_list.get();
  exec_.For(slots, [=] TF_EXT_HOST_DEVICE(int64_t s) {
    if (!is_live[s]) return;
    // Order-preserving int64 -> uint64: flip the sign bit.
    step_of[live_before[s]] = static_cast<uint64_t>(t.meta[s].last_step) ^ (uint64_t{1} << 63);
    slot_at[live_before[s]] = s;
  });
  if (!exec_.SortPairs(step_of, sorted_steps.get(), slot_at, sorted_slots.get(), rows)) {
    return Error("out of device memory sorting for eviction");
  }
  const int64_t* victims = sorted_slots.get();
  const std::string no_room = MakeLogRoom(std::min(excess, rows));
  if (!no_room.empty()) return no_room;
  const RemovalLog log = Log();
  ZeroCounter(kScratch);
  exec_.For(std::min(excess, rows), [=] TF_EXT_HOST_DEVICE(int64_t i) {
    const int64_t s = victims[i];
    RemoveAt(t, log, s, static_cast<int64_t>(t.keys[s]), i);
  });
  *removed += ReadCounter(kScratch);
  return "";
}

template <typename Exec>
inline std::string DeviceTableImpl<Exec>::RemoveHostKeys(cudaStream_t stream, int64_t n,
                                                         const int64_t* keys) {
  const OneCaller caller(this, stream);
  if (!caller.ok()) return Busy();
  for (int64_t begin = 0; begin < n; begin += kDefaultChunkRows) {
    const int64_t count = std::min(kDefaultChunkRows, n - begin);
    Scratch<Exec, int64_t> staged(exec_, count);
    if (!staged.ok()) return Error("out of device memory removing " + std::to_string(count));
    exec_.ToDevice(staged.get(), keys + begin, sizeof(int64_t) * count);
    const std::string error = Remove(stream, count, staged.get(), nullptr);
    if (!error.empty()) return error;
  }
  return "";
}

template <typename Exec>
inline std::string DeviceTableImpl<Exec>::Clear(cudaStream_t stream) {
  const OneCaller caller(this, stream);
  if (!caller.ok()) return Busy();
  EmptySlots(View());
  ZeroCounter(kSize);
  ZeroCounter(kTombstones);
  StopTracking();
  return Checked("clear");
}

template <typename Exec>
inline void DeviceTableImpl<Exec>::EmptySlots(const TableView& t) {
  exec_.For(t.capacity + kExtraSlots,
            [=] TF_EXT_HOST_DEVICE(int64_t s) { t.keys[s] = s < t.capacity ? kEmptyKey : 0; });
  exec_.Fill(t.summaries, uint32_t{0}, SummaryWords(t.capacity));
}

}  // namespace gpu
}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_TABLE_REMOVAL_H_
