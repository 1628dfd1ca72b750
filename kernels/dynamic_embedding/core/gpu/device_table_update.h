// DeviceTableImpl's writes: ApplyGradients (grouping a batch's keys), InsertOrAssign, EnsureSlots,
// Import. Part of device_table_impl.h, which includes it at its end.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_TABLE_UPDATE_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_TABLE_UPDATE_H_

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
inline std::string DeviceTableImpl<Exec>::GroupKeys(int64_t n, const int64_t* keys,
                                                    Groups* groups) {
  if (!groups->ok()) return Error("out of device memory for a batch of " + std::to_string(n));
  Scratch<Exec, uint64_t> unsorted(exec_, n);
  Scratch<Exec, int64_t> order(exec_, n);
  if (!unsorted.ok() || !order.ok()) return Error("out of device memory");
  uint64_t* as_unsigned = unsorted.get();
  int64_t* identity = order.get();
  exec_.For(n, [=] TF_EXT_HOST_DEVICE(int64_t i) {
    as_unsigned[i] = static_cast<uint64_t>(keys[i]);
    identity[i] = i;
  });
  if (!exec_.SortPairs(as_unsigned, groups->sorted.get(), identity, groups->position.get(), n)) {
    return Error("out of device memory sorting a batch of " + std::to_string(n));
  }
  const uint64_t* sorted = groups->sorted.get();
  int64_t* heads = groups->heads.get();
  exec_.For(n + 1, [=] TF_EXT_HOST_DEVICE(int64_t i) {
    heads[i] = i < n && (i == 0 || sorted[i] != sorted[i - 1]);
  });
  int64_t* distinct_before = groups->first.get();  // reused below as `first`
  if (!exec_.ExclusiveSum(heads, distinct_before, n + 1)) return Error("out of device memory");
  exec_.ToHost(&groups->distinct, distinct_before + n, sizeof(int64_t));
  exec_.Sync();
  // heads <- the distinct index of each sorted index, first <- each distinct key's first index.
  exec_.For(n, [=] TF_EXT_HOST_DEVICE(int64_t i) {
    const bool head = i == 0 || sorted[i] != sorted[i - 1];
    heads[i] = distinct_before[i] + (head ? 0 : -1);
  });
  const int64_t distinct = groups->distinct;
  int64_t* first = groups->first.get();
  exec_.For(n, [=] TF_EXT_HOST_DEVICE(int64_t i) {
    if (i == 0 || sorted[i] != sorted[i - 1]) first[heads[i]] = i;
    if (i == 0) first[distinct] = n;
  });
  return "";
}

template <typename Exec>
inline std::string DeviceTableImpl<Exec>::ApplyGradients(cudaStream_t stream,
                                                         const OptimizerParams& params,
                                                         int64_t step, int64_t n,
                                                         const int64_t* keys,
                                                         const float* gradients) {
  const OneCaller caller(this, stream);
  if (!caller.ok()) return Busy();
  std::string error = EnsureSlots(stream, NumSlots(params.kind), SlotInitialValues(params));
  if (!error.empty() || n <= 0) return error;
  error = CheckRowLimit(n, keys);
  if (!error.empty()) return error;
  Groups groups(exec_, n);
  error = GroupKeys(n, keys, &groups);
  if (error.empty()) error = MakeRoom(groups.distinct);
  if (!error.empty()) return error;
  const int64_t m = groups.distinct;
  Scratch<Exec, int64_t> unique_keys(exec_, m), slots(exec_, m);
  Scratch<Exec, uint8_t> created(exec_, m);
  Scratch<Exec, float> sums(exec_, m * options_.dim);
  Scratch<Exec, RowStep> row_steps(exec_, m);
  if (!unique_keys.ok() || !slots.ok() || !created.ok() || !sums.ok() || !row_steps.ok()) {
    return Error("out of device memory for an update of " + std::to_string(m) + " rows");
  }
  const TableView t = View();
  const SketchView sketch = Sketch();
  const uint64_t* sorted = groups.sorted.get();
  const int64_t* position = groups.position.get();
  const int64_t* first = groups.first.get();
  int64_t* key_of = unique_keys.get();
  int64_t* slot_of = slots.get();
  uint8_t* created_at = created.get();
  float* sum = sums.get();
  RowStep* row_step = row_steps.get();
  const OptimizerParams p = params;
  // Nadam's momentum product up to where its factors stop changing, once for all rows.
  const NadamHead head = p.kind == OptimizerKind::kNadam ? NadamHeadOf(p) : NadamHead{};
  exec_.For(m, [=] TF_EXT_HOST_DEVICE(int64_t d) {
    const int64_t key = static_cast<int64_t>(sorted[first[d]]);
    key_of[d] = key;
    int64_t s = FindSlot(t, key);
    const bool missing = s < 0;
    const bool admitted = missing && Admit(sketch, InitialRowKeyHash(key));
    bool claimed = false;
    if (admitted) s = FindOrClaimSlot(t, key, &claimed);
    atomic::AddWhere(Stripe(t.counters, kAdmitted, d), admitted, 1);
    atomic::AddWhere(Stripe(t.counters, kRejected, d), missing && !admitted, 1);
    CountRows(t, claimed, d);
    slot_of[d] = s;
    created_at[d] = claimed;
  });
  InitializeRows(m, key_of, slot_of, created_at);
  const int dim = t.dim;
  // Duplicates summed in the order given, starting from the first (not from 0: -0 + 0 is +0).
  exec_.For(m * dim, [=] TF_EXT_HOST_DEVICE(int64_t e) {
    const int64_t d = e / dim;
    const int j = static_cast<int>(e - d * dim);
    float total = gradients[position[first[d]] * dim + j];
    for (int64_t r = first[d] + 1; r < first[d + 1]; ++r) total += gradients[position[r] * dim + j];
    sum[e] = total;
  });
  // Every kind (the others' RowStep is its defaults): the element step reads initialised memory.
  exec_.For(m, [=] TF_EXT_HOST_DEVICE(int64_t d) {
    if (slot_of[d] < 0) return;
    row_step[d] = RowStepOf(p, head, t.meta[slot_of[d]].update_count);
  });
  exec_.For(m * dim, [=] TF_EXT_HOST_DEVICE(int64_t e) {
    const int64_t d = e / dim;
    if (slot_of[d] < 0) return;
    float* row = t.values + slot_of[d] * t.stride;
    ApplyGradientToElement(p, row_step[d], sum[e], dim, static_cast<int>(e - d * dim), row,
                           row + dim);
  });
  ZeroCounter(kScratch);
  exec_.For(m, [=] TF_EXT_HOST_DEVICE(int64_t d) {
    const bool updated = slot_of[d] >= 0;
    atomic::AddWhere(Stripe(t.counters, kScratch, d), updated, 1);
    if (!updated) return;
    EntryMeta& meta = t.meta[slot_of[d]];
    if (meta.update_count != ~uint32_t{0}) ++meta.update_count;
    meta.last_step = step;
    meta.version = t.version;
  });
  RecordStep(step, /*if_updated=*/true);
  return Checked("apply_gradients");
}

template <typename Exec>
inline std::string DeviceTableImpl<Exec>::AssignRows(int64_t n, const int64_t* keys,
                                                     const float* rows, bool full_rows,
                                                     const uint32_t* counts, const int64_t* steps) {
  if (n <= 0) return "";
  std::string error = CheckRowLimit(n, keys);
  if (!error.empty()) return error;
  Groups groups(exec_, n);
  error = GroupKeys(n, keys, &groups);
  if (error.empty()) error = MakeRoom(groups.distinct);
  if (!error.empty()) return error;
  const int64_t m = groups.distinct;
  Scratch<Exec, int64_t> unique_keys(exec_, m), slots(exec_, m), source(exec_, m);
  Scratch<Exec, uint8_t> created(exec_, m);
  if (!unique_keys.ok() || !slots.ok() || !source.ok() || !created.ok()) {
    return Error("out of device memory for " + std::to_string(m) + " rows");
  }
  const TableView t = View();
  const uint64_t* sorted = groups.sorted.get();
  const int64_t* position = groups.position.get();
  const int64_t* first = groups.first.get();
  int64_t* key_of = unique_keys.get();
  int64_t* slot_of = slots.get();
  int64_t* source_of = source.get();
  uint8_t* created_at = created.get();
  exec_.For(m, [=] TF_EXT_HOST_DEVICE(int64_t d) {
    key_of[d] = static_cast<int64_t>(sorted[first[d]]);
    source_of[d] = position[first[d + 1] - 1];  // the last occurrence
    bool claimed = false;
    slot_of[d] = FindOrClaimSlot(t, key_of[d], &claimed);
    CountRows(t, claimed, d);
    created_at[d] = claimed;
  });
  if (!full_rows) InitializeRows(m, key_of, slot_of, created_at);
  const int width = full_rows ? t.stride : t.dim;
  exec_.For(m * width, [=] TF_EXT_HOST_DEVICE(int64_t e) {
    const int64_t d = e / width;
    const int j = static_cast<int>(e - d * width);
    t.values[slot_of[d] * t.stride + j] = rows[source_of[d] * width + j];
    if (j == 0) {
      EntryMeta& meta = t.meta[slot_of[d]];
      if (full_rows) meta = EntryMeta{steps[source_of[d]], counts[source_of[d]], 0};
      meta.version = t.version;
    }
  });
  return Checked("assign");
}

template <typename Exec>
inline std::string DeviceTableImpl<Exec>::InsertOrAssign(cudaStream_t stream, int64_t n,
                                                         const int64_t* keys, const float* rows) {
  const OneCaller caller(this, stream);
  if (!caller.ok()) return Busy();
  return AssignRows(n, keys, rows, /*full_rows=*/false, nullptr, nullptr);
}

template <typename Exec>
inline std::string DeviceTableImpl<Exec>::EnsureSlots(cudaStream_t stream, int num_slots,
                                                      const std::vector<float>& slot_init) {
  const OneCaller caller(this, stream);
  if (!caller.ok()) return Busy();
  if (num_slots <= num_slots_) return "";
  if (num_slots > kMaxSlots || static_cast<int>(slot_init.size()) < num_slots) {
    return Error("bad optimizer slots: " + std::to_string(num_slots));
  }
  std::vector<float> init = slot_init_;
  init.insert(init.end(), slot_init.begin() + num_slots_, slot_init.begin() + num_slots);
  return Rebuild(capacity_, num_slots, init);
}

template <typename Exec>
inline std::string DeviceTableImpl<Exec>::Import(cudaStream_t stream, const HostRows& rows) {
  const OneCaller caller(this, stream);
  if (!caller.ok()) return Busy();
  const int stride = Stride();
  for (int64_t begin = 0; begin < rows.n; begin += kDefaultChunkRows) {
    const int64_t count = std::min(kDefaultChunkRows, rows.n - begin);
    Scratch<Exec, int64_t> keys(exec_, count), steps(exec_, count);
    Scratch<Exec, uint32_t> counts(exec_, count);
    Scratch<Exec, float> values(exec_, count * stride);
    if (!keys.ok() || !steps.ok() || !counts.ok() || !values.ok()) {
      return Error("out of device memory importing " + std::to_string(count) + " rows");
    }
    exec_.ToDevice(keys.get(), rows.keys + begin, sizeof(int64_t) * count);
    exec_.ToDevice(steps.get(), rows.last_steps + begin, sizeof(int64_t) * count);
    exec_.ToDevice(counts.get(), rows.update_counts + begin, sizeof(uint32_t) * count);
    exec_.ToDevice(values.get(), rows.values + begin * stride, sizeof(float) * stride * count);
    const std::string error =
        AssignRows(count, keys.get(), values.get(), /*full_rows=*/true, counts.get(), steps.get());
    if (!error.empty()) return error;
    // Restored steps count as training steps: eviction and new rows measure from them.
    RecordStep(*std::max_element(rows.last_steps + begin, rows.last_steps + begin + count),
               /*if_updated=*/false);
    exec_.Sync();  // the host rows may be freed once this returns
  }
  return Checked("import");
}

}  // namespace gpu
}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_TABLE_UPDATE_H_
