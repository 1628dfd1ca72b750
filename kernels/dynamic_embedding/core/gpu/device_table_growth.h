// DeviceTableImpl's room for rows: Init, the row limit, MakeRoom, Reserve and Rebuild. Part of
// device_table_impl.h, which includes it at its end.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_TABLE_GROWTH_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_TABLE_GROWTH_H_

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
inline std::string DeviceTableImpl<Exec>::Init() {
  const std::string bad_dim = CheckDim(options_.name, options_.dim);
  if (!bad_dim.empty()) return bad_dim;
  const int lanes = options_.tile_lanes;
  if (lanes < 0 || lanes > 32 || (lanes & (lanes - 1)) != 0) {
    return Error("tile_lanes must be 0 (the default) or a power of two up to 32, got " +
                 std::to_string(lanes));
  }
  if (!(options_.max_load_factor > 0.0 && options_.max_load_factor < 1.0)) {
    return Error("max_load_factor must be in (0, 1)");
  }
  if (options_.admission.min_count > 1 && options_.admission.exact) {
    return Error(
        "exact admission counting is CPU-only; the GPU table counts with a sketch "
        "(admission exact=False)");
  }
  counters_ = static_cast<int64_t*>(exec_.AllocLasting(sizeof(int64_t) * kCounterWords));
  if (counters_ == nullptr) return Error("out of device memory");
  exec_.Fill(counters_, int64_t{0}, kCounterWords);
  if (options_.admission.min_count > 1) {
    const int64_t width = SketchWidth(options_.admission.sketch_width);
    sketch_width_mask_ = static_cast<uint64_t>(width) - 1;
    const int64_t total = width * options_.admission.sketch_depth;
    sketch_ = static_cast<uint32_t*>(exec_.AllocLasting(sizeof(uint32_t) * total));
    if (sketch_ == nullptr) return Error("out of device memory for the admission sketch");
    exec_.Fill(sketch_, uint32_t{0}, total);
  }
  int64_t capacity = 64;
  while (capacity < options_.initial_capacity) capacity *= 2;
  return Rebuild(capacity, 0, {});
}

template <typename Exec>
inline std::string DeviceTableImpl<Exec>::CheckRowLimit(int64_t n, const int64_t* keys) {
  const int64_t max_rows = options_.max_rows;
  if (n <= max_rows - occupied_bound_) return "";
  const int64_t size = ReadCounter(kSize);
  if (CheckTableRows(options_.name, size, n, max_rows).empty()) return "";
  Scratch<Exec, uint8_t> found(exec_, n);
  if (!found.ok()) return Error("out of device memory for " + std::to_string(n));
  const TableView t = View();
  uint8_t* found_at = found.get();
  exec_.ForTiles(n, [=] TF_EXT_HOST_DEVICE(int64_t i, const Tile& tile) {
    const int64_t s = FindSlot(t, keys[i], tile);
    if (tile.lane() == 0) found_at[i] = s >= 0;
  });
  std::vector<int64_t> host_keys(n);
  std::vector<uint8_t> host_found(n);
  exec_.ToHost(host_keys.data(), keys, sizeof(int64_t) * n);
  exec_.ToHost(host_found.data(), found_at, n);
  exec_.Sync();
  const std::string failure = Checked("row limit check");
  if (!failure.empty()) return failure;
  std::unordered_set<int64_t> absent;
  for (int64_t i = 0; i < n; ++i) {
    if (!host_found[i]) absent.insert(host_keys[i]);
  }
  return CheckTableRows(options_.name, size, static_cast<int64_t>(absent.size()), max_rows);
}

template <typename Exec>
inline std::string DeviceTableImpl<Exec>::MakeRoom(int64_t incoming) {
  const double limit = options_.max_load_factor * static_cast<double>(capacity_);
  if (static_cast<double>(occupied_bound_ + incoming) <= limit) {
    occupied_bound_ += incoming;
    return "";
  }
  const std::vector<int64_t> counts = ReadCounters();  // one read for both
  const int64_t size = Total(counts.data(), kSize), tombstones = Total(counts.data(), kTombstones);
  if (static_cast<double>(size + tombstones + incoming) <= limit) {
    occupied_bound_ = size + tombstones + incoming;
    return "";
  }
  int64_t capacity = capacity_;
  if (static_cast<double>(size + incoming) > limit) {
    while (static_cast<double>(size + incoming) > 0.5 * options_.max_load_factor * capacity) {
      if (capacity > (int64_t{1} << 40)) return Error("more than 2^40 slots asked for");
      capacity *= 2;
    }
  }
  const std::string error = Rebuild(capacity, num_slots_, slot_init_);
  if (error.empty()) occupied_bound_ = size + incoming;
  return error;
}

template <typename Exec>
inline std::string DeviceTableImpl<Exec>::Reserve(cudaStream_t stream, int64_t rows) {
  const OneCaller caller(this, stream);
  if (!caller.ok()) return Busy();
  occupied_bound_ = capacity_;  // read the exact count
  return MakeRoom(rows);
}

template <typename Exec>
inline std::string DeviceTableImpl<Exec>::Rebuild(int64_t capacity, int num_slots,
                                                  const std::vector<float>& slot_init) {
  const int stride = options_.dim * (1 + num_slots);
  const int64_t slots = capacity + kExtraSlots;
  Storage fresh;
  if (!fresh.Allocate(exec_, capacity, stride, num_slots)) {
    fresh.Release(exec_);
    const double bytes = static_cast<double>(slots) *
                         (sizeof(uint64_t) + sizeof(EntryMeta) + sizeof(float) * stride);
    return Error("out of device memory growing to " + std::to_string(capacity) + " slots (" +
                 std::to_string(static_cast<int64_t>(bytes / (1 << 20))) + " MiB) with " +
                 std::to_string(ReadCounter(kSize)) + " rows");
  }
  // Slots beyond the old rows' slots read their initial value from fresh.slot_init.
  if (num_slots > 0) exec_.ToDevice(fresh.slot_init, slot_init.data(), sizeof(float) * num_slots);
  const TableView to{fresh.keys, fresh.values,    fresh.meta,
                     counters_,  fresh.summaries, static_cast<uint64_t>(capacity - 1),
                     capacity,   options_.dim,    stride,
                     version_};
  EmptySlots(to);
  if (storage_.keys != nullptr) {
    const TableView from = View();
    Scratch<Exec, int64_t> moved(exec_, from.capacity + kExtraSlots);
    if (!moved.ok()) {
      fresh.Release(exec_);
      return Error("out of device memory rebuilding");
    }
    int64_t* new_slot = moved.get();
    const std::vector<int64_t> counts = ReadCounters();  // one read for both
    const int64_t size = Total(counts.data(), kSize);
    const int64_t tombstones = Total(counts.data(), kTombstones);
    // The keys move first (every new slot claimed, counted afresh), then the rows, one element
    // per thread.
    ZeroCounter(kSize);
    ZeroCounter(kTombstones);
    exec_.For(from.capacity + kExtraSlots, [=] TF_EXT_HOST_DEVICE(int64_t s) {
      bool created = false;
      new_slot[s] =
          Live(from, s) ? FindOrClaimSlot(to, static_cast<int64_t>(from.keys[s]), &created) : -1;
      CountRows(to, created, s);
    });
    const float* init = fresh.slot_init;
    exec_.For((from.capacity + kExtraSlots) * to.stride, [=] TF_EXT_HOST_DEVICE(int64_t e) {
      const int64_t s = e / to.stride;
      if (new_slot[s] < 0) return;
      const int j = static_cast<int>(e - s * to.stride);
      to.values[new_slot[s] * to.stride + j] =
          j < from.stride ? from.values[s * from.stride + j] : init[j / to.dim - 1];
      if (j == 0) to.meta[new_slot[s]] = from.meta[s];
    });
    exec_.Sync();
    const std::string failure = Checked("rebuild");
    if (!failure.empty()) {  // keep the old storage, and its counts
      SetCounter(kSize, size);
      SetCounter(kTombstones, tombstones);
      exec_.Sync();
      fresh.Release(exec_);
      return failure;
    }
  }
  storage_.Release(exec_);
  storage_ = fresh;
  capacity_ = capacity;
  num_slots_ = num_slots;
  slot_init_ = slot_init;
  return "";
}

}  // namespace gpu
}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_TABLE_GROWTH_H_
