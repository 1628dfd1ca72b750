// DeviceTableImpl's lookups: Find, FindOrInsert and the row gathering and initialising they share.
// Part of device_table_impl.h, which includes it at its end.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_TABLE_LOOKUP_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_TABLE_LOOKUP_H_

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
inline void DeviceTableImpl<Exec>::GatherRows(int64_t n, const int64_t* keys, const int64_t* slots,
                                              const uint8_t* created, float* rows) {
  const TableView t = View();
  const InitializerSpec init = options_.initializer;
  exec_.ForTilesInFlight(n, [=] TF_EXT_HOST_DEVICE(int64_t i, const Tile& tile) {
    ReadRow(t, init, keys[i], created[i] ? -1 : slots[i], rows + i * t.dim, tile);
  });
}

template <typename Exec>
inline std::string DeviceTableImpl<Exec>::Find(cudaStream_t stream, int64_t n, const int64_t* keys,
                                               float* rows, bool* found) {
  const OneCaller caller(this, stream);
  if (!caller.ok()) return Busy();
  if (n <= 0) return "";
  const TableView t = View();
  const InitializerSpec init = options_.initializer;
  // One pass: a tile finds the key's slot and copies its row.
  exec_.ForTilesInFlight(n, [=] TF_EXT_HOST_DEVICE(int64_t i, const Tile& tile) {
    const int64_t s = FindSlot(t, keys[i], tile);
    const bool leader = tile.lane() == 0;
    if (leader && found != nullptr) found[i] = s >= 0;
    atomic::AddWhere(Stripe(t.counters, kHits, i), leader && s >= 0, 1);
    ReadRow(t, init, keys[i], s, rows + i * t.dim, tile);
  });
  lookups_ += n;
  return Checked("find");
}

template <typename Exec>
inline void DeviceTableImpl<Exec>::InitializeRows(int64_t n, const int64_t* keys,
                                                  const int64_t* slots, const uint8_t* created) {
  const TableView t = View();
  const InitializerSpec init = options_.initializer;
  const float* slot_init = storage_.slot_init;
  exec_.ForTiles(n, [=] TF_EXT_HOST_DEVICE(int64_t i, const Tile& tile) {
    if (!created[i]) return;
    float* row = t.values + slots[i] * t.stride;
    ReadRow(t, init, keys[i], -1, row, tile);
    for (int slot = 1; slot * t.dim < t.stride; ++slot) {
      FillFloats(tile, row + slot * t.dim, t.dim, slot_init[slot - 1]);
    }
    if (tile.lane() == 0) {
      t.meta[slots[i]] = EntryMeta{*Stripe(t.counters, kLatestStep), 0, t.version};
    }
  });
}

template <typename Exec>
inline std::string DeviceTableImpl<Exec>::FindOrInsert(cudaStream_t stream, int64_t n,
                                                       const int64_t* keys, float* rows) {
  const OneCaller caller(this, stream);
  if (!caller.ok()) return Busy();
  if (n <= 0) return "";
  std::string error = CheckRowLimit(n, keys);
  if (error.empty()) error = MakeRoom(n);
  if (!error.empty()) return error;
  Scratch<Exec, int64_t> slots(exec_, n);
  Scratch<Exec, uint8_t> created(exec_, n);
  if (!slots.ok() || !created.ok()) return Error("out of device memory for " + std::to_string(n));
  const TableView t = View();
  const SketchView sketch = Sketch();
  int64_t* slot_of = slots.get();
  uint8_t* created_at = created.get();
  exec_.ForTiles(n, [=] TF_EXT_HOST_DEVICE(int64_t i, const Tile& tile) {
    const bool leader = tile.lane() == 0;
    bool claimed = false, hit = false;
    int64_t s = -1;
    if (sketch.min_count <= 1) {  // every key is admitted: one scan finds or claims
      s = FindOrClaimSlot(t, keys[i], &claimed, tile);
      hit = !claimed;  // of a key repeated in the batch, the one that claims it misses
    } else {
      s = FindSlot(t, keys[i], tile);
      hit = s >= 0;
      // Admission counts the key once, so one lane asks.
      const int admitted = !hit && leader ? Admit(sketch, InitialRowKeyHash(keys[i])) : 0;
      if (tile.Broadcast(admitted, 0)) s = FindOrClaimSlot(t, keys[i], &claimed, tile);
    }
    atomic::AddWhere(Stripe(t.counters, kHits, i), leader && hit, 1);
    CountRows(t, leader && claimed, i);
    if (leader) {
      slot_of[i] = s;
      created_at[i] = claimed;
    }
  });
  InitializeRows(n, keys, slot_of, created_at);
  GatherRows(n, keys, slot_of, created_at, rows);
  lookups_ += n;
  return Checked("find_or_insert");
}

}  // namespace gpu
}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_TABLE_LOOKUP_H_
