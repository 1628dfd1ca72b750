// DeviceTableImpl's delta snapshots: Export, BeginSnapshot, ExportRemoved, CommitSnapshot, the
// removal log, SwapContents. Part of device_table_impl.h, which includes it at its end.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_TABLE_SNAPSHOT_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_TABLE_SNAPSHOT_H_

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
inline std::string DeviceTableImpl<Exec>::Export(cudaStream_t stream, int64_t chunk_rows,
                                                 const std::function<bool(const HostRows&)>& visit,
                                                 int64_t changed_after) {
  const OneCaller caller(this, stream);
  if (!caller.ok()) return Busy();
  if (chunk_rows <= 0) chunk_rows = kDefaultChunkRows;
  const TableView t = View();
  const int64_t slots = capacity_ + kExtraSlots;
  const size_t row_bytes = sizeof(float) * t.stride;
  Scratch<Exec, int64_t> live(exec_, chunk_rows + 1), before(exec_, chunk_rows + 1);
  Scratch<Exec, int64_t> keys(exec_, chunk_rows), steps(exec_, chunk_rows);
  Scratch<Exec, uint32_t> counts(exec_, chunk_rows);
  Scratch<Exec, float> values(exec_, chunk_rows * t.stride);
  PinnedRows host(exec_, chunk_rows, t.stride);
  if (!live.ok() || !before.ok() || !keys.ok() || !steps.ok() || !counts.ok() || !values.ok() ||
      !host.ok()) {
    return Error("out of memory for an export chunk of " + std::to_string(chunk_rows) + " rows");
  }
  for (int64_t begin = 0; begin < slots; begin += chunk_rows) {
    const int64_t count = std::min(chunk_rows, slots - begin);
    int64_t* is_live = live.get();
    exec_.For(count + 1, [=] TF_EXT_HOST_DEVICE(int64_t i) {
      is_live[i] = i < count && Written(t, begin + i, changed_after);
    });
    if (!exec_.ExclusiveSum(is_live, before.get(), count + 1)) return Error("out of memory");
    int64_t rows = 0;
    exec_.ToHost(&rows, before.get() + count, sizeof(int64_t));
    exec_.Sync();
    if (rows == 0) continue;
    const int64_t* live_before = before.get();
    int64_t* key_out = keys.get();
    int64_t* step_out = steps.get();
    uint32_t* count_out = counts.get();
    float* value_out = values.get();
    exec_.For(count * t.stride, [=] TF_EXT_HOST_DEVICE(int64_t e) {
      const int64_t i = e / t.stride;
      if (!is_live[i]) return;
      const int j = static_cast<int>(e - i * t.stride);
      const int64_t s = begin + i, r = live_before[i];
      value_out[r * t.stride + j] = t.values[s * t.stride + j];
      if (j == 0) {
        key_out[r] = static_cast<int64_t>(t.keys[s]);
        step_out[r] = t.meta[s].last_step;
        count_out[r] = t.meta[s].update_count;
      }
    });
    exec_.ToHost(host.keys, key_out, sizeof(int64_t) * rows);
    exec_.ToHost(host.steps, step_out, sizeof(int64_t) * rows);
    exec_.ToHost(host.counts, count_out, sizeof(uint32_t) * rows);
    exec_.ToHost(host.values, value_out, row_bytes * rows);
    exec_.Sync();
    const std::string failure = Checked("export");
    if (!failure.empty()) return failure;
    HostRows chunk;
    chunk.n = rows;
    chunk.keys = host.keys;
    chunk.update_counts = host.counts;
    chunk.last_steps = host.steps;
    chunk.values = host.values;
    if (!visit(chunk)) return Error("export stopped");
  }
  return "";
}

template <typename Exec>
inline std::string DeviceTableImpl<Exec>::BeginSnapshot(cudaStream_t stream, int64_t since_version,
                                                        bool track, DeviceSnapshotPlan* plan) {
  const OneCaller caller(this, stream);
  if (!caller.ok()) return Busy();
  *plan = DeviceSnapshotPlan();
  const bool full = since_version < 0;
  if (!full && (!tracking_ || since_version < std::max(tracked_since_, committed_version_) ||
                since_version >= version_)) {
    plan->version = DeviceSnapshotPlan::kNoDeltaBase;
    return "";
  }
  plan->version = version_++;
  if (track) StartTracking(plan->version);
  if (full) {
    plan->rows = ReadCounter(kSize);
    return Checked("snapshot");
  }
  const TableView t = View();
  ZeroCounter(kScratch);
  exec_.For(capacity_ + kExtraSlots, [=] TF_EXT_HOST_DEVICE(int64_t s) {
    atomic::AddWhere(Stripe(t.counters, kScratch, s), Written(t, s, since_version), 1);
  });
  plan->rows = ReadCounter(kScratch);
  const uint32_t* versions = log_.versions;
  ZeroCounter(kScratch);
  exec_.For(ReadCounter(kLogged), [=] TF_EXT_HOST_DEVICE(int64_t i) {
    atomic::AddWhere(Stripe(t.counters, kScratch, i), versions[i] > since_version, 1);
  });
  plan->tombstones = ReadCounter(kScratch);
  return Checked("snapshot");
}

template <typename Exec>
inline std::string DeviceTableImpl<Exec>::ExportRemoved(
    cudaStream_t stream, int64_t since_version, int64_t chunk_rows,
    const std::function<bool(int64_t, const int64_t*)>& visit) {
  const OneCaller caller(this, stream);
  if (!caller.ok()) return Busy();
  if (!tracking_) return "";
  if (chunk_rows <= 0) chunk_rows = kDefaultChunkRows;
  const int64_t logged = ReadCounter(kLogged);
  std::vector<uint64_t> keys(static_cast<size_t>(std::min(chunk_rows, logged)));
  std::vector<uint32_t> versions(keys.size());
  std::vector<int64_t> removed;
  for (int64_t begin = 0; begin < logged; begin += chunk_rows) {
    const int64_t count = std::min(chunk_rows, logged - begin);
    exec_.ToHost(keys.data(), log_.keys + begin, sizeof(uint64_t) * count);
    exec_.ToHost(versions.data(), log_.versions + begin, sizeof(uint32_t) * count);
    exec_.Sync();
    const std::string failure = Checked("export removed ids");
    if (!failure.empty()) return failure;
    removed.clear();
    for (int64_t i = 0; i < count; ++i) {
      if (versions[i] > since_version) removed.push_back(static_cast<int64_t>(keys[i]));
    }
    if (!removed.empty() && !visit(static_cast<int64_t>(removed.size()), removed.data())) {
      return Error("export stopped");
    }
  }
  return "";
}

template <typename Exec>
inline std::string DeviceTableImpl<Exec>::CommitSnapshot(cudaStream_t stream, int64_t version) {
  const OneCaller caller(this, stream);
  if (!caller.ok()) return Busy();
  committed_version_ = std::max(committed_version_, version);
  const int64_t logged = ReadCounter(kLogged);
  const uint32_t* versions = log_.versions;
  int64_t* counters = counters_;
  ZeroCounter(kScratch);
  exec_.For(logged, [=] TF_EXT_HOST_DEVICE(int64_t i) {
    atomic::AddWhere(Stripe(counters, kScratch, i), versions[i] > version, 1);
  });
  const int64_t kept = ReadCounter(kScratch);
  if (kept > 0) return RebuildLog(std::max<int64_t>(1024, 2 * kept), version, logged);
  EmptyLog();
  return Checked("commit a snapshot");
}

template <typename Exec>
inline int64_t DeviceTableImpl<Exec>::MarkSnapshotBase(cudaStream_t stream) {
  exec_.Bind(stream);
  const int64_t version = version_++;
  StartTracking(version);
  return version;
}

template <typename Exec>
inline void DeviceTableImpl<Exec>::StartTracking(int64_t version) {
  if (tracking_) return;
  tracking_ = true;
  tracked_since_ = version;
  EmptyLog();
}

template <typename Exec>
inline void DeviceTableImpl<Exec>::StopTracking() {
  tracking_ = false;
  EmptyLog();
}

template <typename Exec>
inline void DeviceTableImpl<Exec>::EmptyLog() {
  ZeroCounter(kLogged);
  log_bound_ = 0;
  log_.Release(exec_);
}

template <typename Exec>
inline std::string DeviceTableImpl<Exec>::MakeLogRoom(int64_t removals) {
  if (!tracking_ || removals <= 0) return "";
  if (log_bound_ + removals <= log_.capacity) {
    log_bound_ += removals;
    return "";
  }
  const int64_t logged = ReadCounter(kLogged);
  if (logged + removals > log_.capacity) {
    const std::string error =
        RebuildLog(std::max<int64_t>(1024, 2 * (logged + removals)), -1, logged);
    if (!error.empty()) return error;
  }
  log_bound_ = logged + removals;
  return "";
}

template <typename Exec>
inline std::string DeviceTableImpl<Exec>::RebuildLog(int64_t capacity, int64_t after,
                                                     int64_t logged) {
  RemovalLogStorage fresh;
  Scratch<Exec, int64_t> kept(exec_, logged + 1), before(exec_, logged + 1);
  if (!fresh.Allocate(exec_, capacity) || !kept.ok() || !before.ok()) {
    fresh.Release(exec_);
    return Error("out of device memory for the log of removed ids (" + std::to_string(capacity) +
                 " entries; a committed delta or full save empties it)");
  }
  const uint64_t* old_keys = log_.keys;
  const uint32_t* old_versions = log_.versions;
  int64_t* keeps = kept.get();
  exec_.For(logged + 1, [=] TF_EXT_HOST_DEVICE(int64_t i) {
    keeps[i] = i < logged && old_versions[i] > after;
  });
  if (!exec_.ExclusiveSum(keeps, before.get(), logged + 1)) {
    fresh.Release(exec_);
    return Error("out of memory");
  }
  const int64_t* kept_before = before.get();
  uint64_t* new_keys = fresh.keys;
  uint32_t* new_versions = fresh.versions;
  exec_.For(logged, [=] TF_EXT_HOST_DEVICE(int64_t i) {
    if (!keeps[i]) return;
    new_keys[kept_before[i]] = old_keys[i];
    new_versions[kept_before[i]] = old_versions[i];
  });
  int64_t remaining = 0;
  exec_.ToHost(&remaining, kept_before + logged, sizeof(int64_t));
  exec_.Sync();
  const std::string failure = Checked("rebuild the log of removed ids");
  if (!failure.empty()) {
    fresh.Release(exec_);
    return failure;
  }
  log_.Release(exec_);
  log_ = fresh;
  SetCounter(kLogged, remaining);
  log_bound_ = remaining;
  return "";
}

template <typename Exec>
inline std::string DeviceTableImpl<Exec>::SwapContents(DeviceTable& other_table) {
  auto* other = dynamic_cast<DeviceTableImpl*>(&other_table);
  if (other == nullptr) return Error("cannot swap contents with a table of another backend");
  const DeviceTableOptions& theirs = other->options_;
  // Equal min_counts mean both or neither have a sketch.
  if (theirs.dim != options_.dim || theirs.admission.min_count != options_.admission.min_count ||
      sketch_width_mask_ != other->sketch_width_mask_ ||
      theirs.admission.sketch_depth != options_.admission.sketch_depth) {
    return Error("cannot swap contents with table '" + theirs.name +
                 "': its dim or admission differs");
  }
  exec_.Sync();  // work queued on either storage finishes first
  other->exec_.Sync();
  std::swap(storage_, other->storage_);
  std::swap(counters_, other->counters_);
  std::swap(sketch_, other->sketch_);
  std::swap(capacity_, other->capacity_);
  std::swap(num_slots_, other->num_slots_);
  std::swap(slot_init_, other->slot_init_);
  std::swap(occupied_bound_, other->occupied_bound_);
  version_ = other->version_ = std::max(version_, other->version_);
  StopTracking();
  other->StopTracking();
  return "";
}

}  // namespace gpu
}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_TABLE_SNAPSHOT_H_
