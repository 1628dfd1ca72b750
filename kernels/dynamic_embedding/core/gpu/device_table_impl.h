// The GPU table's algorithm (device_table.h), written once over an executor `Exec` that owns
// memory and runs kernel bodies: CudaExec (cuda_exec.cuh) launches them as CUDA kernels, HostExec
// (host_exec.h) runs them on host threads. Every body is a TF_EXT_HOST_DEVICE lambda over
// TableView, a plain copy of the table's pointers and sizes.
//
// nvcc's rules for such lambdas shape this file: the function defining one must be a public
// member, and the lambda must not capture `this` (it would point into host memory on the
// device). So every member function is public, and the bodies use locals only: a TableView, the
// op's arguments and temporary buffers.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_TABLE_IMPL_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_TABLE_IMPL_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "kernels/dynamic_embedding/core/gpu/device_slots.h"
#include "kernels/dynamic_embedding/core/gpu/device_table.h"

namespace tf_ext {
namespace de {
namespace gpu {

template <typename Exec>
std::unique_ptr<DeviceTable> MakeTable(const DeviceTableOptions& options, Exec exec,
                                       std::string* error);

// Whether slot s holds a row that eviction's criteria condemn (Condemned).
TF_EXT_HOST_DEVICE inline bool CondemnedAt(const TableView& t, const EvictionCriteria& c,
                                           int64_t s) {
  const EntryMeta meta = t.meta[s];
  return Live(t, s) &&
         Condemned(c, meta.last_step, meta.update_count, t.values + s * t.stride, t.dim);
}

// The table: its storage, and each operation as a few passes of kernel bodies over a batch.
template <typename Exec>
class DeviceTableImpl : public DeviceTable {
 public:
  using Tile = typename Exec::Tile;
  // Keys per chunk of the internal passes that stage host memory (Import, Export).
  static constexpr int64_t kDefaultChunkRows = int64_t{1} << 16;

  DeviceTableImpl(const DeviceTableOptions& options, Exec exec)
      : options_(options), exec_(std::move(exec)) {}
  ~DeviceTableImpl() override {
    storage_.Release(exec_);
    log_.Release(exec_);
    exec_.FreeLasting(counters_);
    exec_.FreeLasting(sketch_);
  }

  // Allocates the first slots; "" or the error.
  std::string Init() {
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

  // The table is used from one host thread at a time (device_table.h): a call made while
  // another thread's call runs gets Busy()'s error instead of racing on the table's host state.
  // A call made inside another on the same thread (RemoveHostKeys's Remove) runs. Binds the
  // stream for the call.
  class OneCaller {
   public:
    OneCaller(DeviceTableImpl* table, cudaStream_t stream) : table_(table) {
      const std::thread::id me = std::this_thread::get_id();
      std::thread::id holder;
      owns_ = table->caller_.compare_exchange_strong(holder, me, std::memory_order_acquire);
      nested_ = !owns_ && holder == me;
      if (ok()) table->exec_.Bind(stream);
    }
    ~OneCaller() {
      if (owns_) table_->caller_.store(std::thread::id(), std::memory_order_release);
    }
    bool ok() const { return owns_ || nested_; }

   private:
    DeviceTableImpl* table_;
    bool owns_ = false, nested_ = false;
  };
  std::string Busy() const {
    return Error("called from two threads at once; a table is used from one host thread at a time");
  }

  const DeviceTableOptions& options() const override { return options_; }
  bool InHostMemory() const override { return Exec::kHostMemory; }
  std::unique_ptr<DeviceTable> NewEmpty(std::string* error) const override {
    return MakeTable(options_, exec_, error);
  }
  int num_slots() const override { return num_slots_; }
  std::vector<float> slot_initial_values() const override { return slot_init_; }
  int64_t Capacity() const override { return capacity_; }
  size_t BytesInUse() const override {
    const size_t slots = static_cast<size_t>(capacity_ + kExtraSlots);
    return slots * (sizeof(uint64_t) + sizeof(EntryMeta) + sizeof(float) * Stride()) +
           sizeof(uint32_t) * SummaryWords(capacity_) +
           (sketch_ ? sizeof(uint32_t) * (sketch_width_mask_ + 1) * options_.admission.sketch_depth
                    : 0) +
           static_cast<size_t>(log_.capacity) * (sizeof(uint64_t) + sizeof(uint32_t));
  }

  TableView View() const {
    return TableView{storage_.keys, storage_.values,    storage_.meta,
                     counters_,     storage_.summaries, static_cast<uint64_t>(capacity_ - 1),
                     capacity_,     options_.dim,       Stride(),
                     version_};
  }
  RemovalLog Log() const {
    return RemovalLog{tracking_ ? log_.keys : nullptr, log_.versions, Stripe(counters_, kLogged),
                      version_};
  }
  SketchView Sketch() const {
    return SketchView{sketch_, sketch_width_mask_, options_.admission.sketch_depth,
                      sketch_ ? options_.admission.min_count : 0};
  }
  int Stride() const { return options_.dim * (1 + num_slots_); }
  std::string Error(const std::string& what) const {
    return "dynamic embedding table '" + options_.name + "' (GPU): " + what;
  }
  std::string Checked(const std::string& what) {
    const std::string failure = exec_.LastError();
    return failure.empty() ? "" : Error(what + ": " + failure);
  }

  // Rows of the slots slots[0, n) (-1: missing, the key's initial row) into rows[n, dim]. A row
  // created[i] by this operation holds its initial row: computed again, it needs no read.
  void GatherRows(int64_t n, const int64_t* keys, const int64_t* slots, const uint8_t* created,
                  float* rows) {
    const TableView t = View();
    const InitializerSpec init = options_.initializer;
    exec_.ForTilesInFlight(n, [=] TF_EXT_HOST_DEVICE(int64_t i, const Tile& tile) {
      ReadRow(t, init, keys[i], created[i] ? -1 : slots[i], rows + i * t.dim, tile);
    });
  }

  std::string Find(cudaStream_t stream, int64_t n, const int64_t* keys, float* rows,
                   bool* found) override {
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

  // Gives the slots of newly created rows their initial row, slots and metadata: rows whose
  // created[i] is set, slot slots[i], key keys[i], for i in [0, n).
  void InitializeRows(int64_t n, const int64_t* keys, const int64_t* slots,
                      const uint8_t* created) {
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

  std::string FindOrInsert(cudaStream_t stream, int64_t n, const int64_t* keys,
                           float* rows) override {
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

  // Groups keys[0, n) by key: sorted keys and the positions they came from (in order within a
  // key), the first sorted index of each distinct key (first[d], d < distinct, first[distinct] =
  // n) and the number of distinct keys, read back to the host.
  struct Groups {
    Groups(Exec& exec, int64_t n)
        : sorted(exec, n), position(exec, n), first(exec, n + 1), heads(exec, n + 1) {}
    bool ok() const { return sorted.ok() && position.ok() && first.ok() && heads.ok(); }
    Scratch<Exec, uint64_t> sorted;
    Scratch<Exec, int64_t> position;
    Scratch<Exec, int64_t> first;
    Scratch<Exec, int64_t> heads;  // then the distinct index of each key's first sorted index
    int64_t distinct = 0;
  };
  std::string GroupKeys(int64_t n, const int64_t* keys, Groups* groups) {
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

  std::string ApplyGradients(cudaStream_t stream, const OptimizerParams& params, int64_t step,
                             int64_t n, const int64_t* keys, const float* gradients) override {
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
      for (int64_t r = first[d] + 1; r < first[d + 1]; ++r)
        total += gradients[position[r] * dim + j];
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

  // Writes rows of keys[0, n): with full_rows, the whole row (stride floats), update count and
  // last step from `counts` and `steps` (Import); else the embedding (dim floats) only
  // (InsertOrAssign). Of a key given twice, the last wins.
  std::string AssignRows(int64_t n, const int64_t* keys, const float* rows, bool full_rows,
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

  std::string InsertOrAssign(cudaStream_t stream, int64_t n, const int64_t* keys,
                             const float* rows) override {
    const OneCaller caller(this, stream);
    if (!caller.ok()) return Busy();
    return AssignRows(n, keys, rows, /*full_rows=*/false, nullptr, nullptr);
  }

  std::string Remove(cudaStream_t stream, int64_t n, const int64_t* keys,
                     int64_t* removed) override {
    const OneCaller caller(this, stream);
    if (!caller.ok()) return Busy();
    if (removed != nullptr) *removed = 0;
    if (n <= 0) return "";
    const std::string error = MakeLogRoom(n);
    if (!error.empty()) return error;
    const TableView t = View();
    const RemovalLog log = Log();
    ZeroCounter(kScratch);
    exec_.For(n, [=] TF_EXT_HOST_DEVICE(int64_t i) {
      RemoveAt(t, log, FindSlot(t, keys[i]), keys[i], i);
    });
    if (removed != nullptr) *removed = ReadCounter(kScratch);
    return Checked("remove");
  }

  std::string EnsureSlots(cudaStream_t stream, int num_slots,
                          const std::vector<float>& slot_init) override {
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

  std::string Evict(cudaStream_t stream, const EvictionCriteria& criteria,
                    int64_t* evicted) override {
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

  // Removes the least recently updated rows while more than max_size remain; ties in slot order.
  std::string EvictLeastRecent(int64_t max_size, int64_t* removed) {
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

  int64_t Size(cudaStream_t stream) override {
    exec_.Bind(stream);
    return ReadCounter(kSize);
  }
  int64_t LatestStep(cudaStream_t stream) override {
    exec_.Bind(stream);
    return ReadCounter(kLatestStep);
  }
  TableCounters Counters(cudaStream_t stream) override {
    exec_.Bind(stream);
    const std::vector<int64_t> values = ReadCounters();
    TableCounters counters;
    counters.admitted = Total(values.data(), kAdmitted);
    counters.rejected = Total(values.data(), kRejected);
    counters.evicted = evicted_;
    counters.lookups = lookups_;
    counters.lookup_hits = Total(values.data(), kHits);
    return counters;
  }

  std::string Export(cudaStream_t stream, int64_t chunk_rows,
                     const std::function<bool(const HostRows&)>& visit,
                     int64_t changed_after) override {
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

  std::string BeginSnapshot(cudaStream_t stream, int64_t since_version, bool track,
                            DeviceSnapshotPlan* plan) override {
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

  std::string ExportRemoved(cudaStream_t stream, int64_t since_version, int64_t chunk_rows,
                            const std::function<bool(int64_t, const int64_t*)>& visit) override {
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

  // Drops the removal log's entries of versions up to `version`, keeping the others in order,
  // and gives back the memory they held.
  std::string CommitSnapshot(cudaStream_t stream, int64_t version) override {
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

  int64_t MarkSnapshotBase(cudaStream_t stream) override {
    exec_.Bind(stream);
    const int64_t version = version_++;
    StartTracking(version);
    return version;
  }

  // Tracking starts with an empty log: the snapshot at `version` holds everything before it.
  void StartTracking(int64_t version) {
    if (tracking_) return;
    tracking_ = true;
    tracked_since_ = version;
    EmptyLog();
  }
  void StopTracking() {
    tracking_ = false;
    EmptyLog();
  }
  // Drops every entry of the removal log, and its memory.
  void EmptyLog() {
    ZeroCounter(kLogged);
    log_bound_ = 0;
    log_.Release(exec_);
  }

  // While tracking, makes room in the removal log for `removals` more entries (growing it to
  // twice what it needs); the exact count is read only when the running bound says it may be full.
  std::string MakeLogRoom(int64_t removals) {
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

  // Moves the removal log's `logged` entries of versions after `after` (-1: every one), in order,
  // into new storage of `capacity` entries. "" or the error; then the log is unchanged.
  std::string RebuildLog(int64_t capacity, int64_t after, int64_t logged) {
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

  std::string Import(cudaStream_t stream, const HostRows& rows) override {
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
      const std::string error = AssignRows(count, keys.get(), values.get(), /*full_rows=*/true,
                                           counts.get(), steps.get());
      if (!error.empty()) return error;
      // Restored steps count as training steps: eviction and new rows measure from them.
      RecordStep(*std::max_element(rows.last_steps + begin, rows.last_steps + begin + count),
                 /*if_updated=*/false);
      exec_.Sync();  // the host rows may be freed once this returns
    }
    return Checked("import");
  }

  std::string RemoveHostKeys(cudaStream_t stream, int64_t n, const int64_t* keys) override {
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

  uint64_t SketchCounters() const override {
    return sketch_ == nullptr
               ? 0
               : (sketch_width_mask_ + 1) * static_cast<uint64_t>(options_.admission.sketch_depth);
  }
  std::string ReadSketch(cudaStream_t stream, uint64_t first, size_t n,
                         uint32_t* counters) override {
    const OneCaller caller(this, stream);
    if (!caller.ok()) return Busy();
    if (first + n > SketchCounters()) return Error("sketch counters out of range");
    if (n == 0) return "";
    exec_.ToHost(counters, sketch_ + first, sizeof(uint32_t) * n);
    exec_.Sync();
    return Checked("read the admission sketch");
  }
  std::string WriteSketch(cudaStream_t stream, uint64_t first, size_t n, const uint32_t* counters,
                          bool keep_larger) override {
    const OneCaller caller(this, stream);
    if (!caller.ok()) return Busy();
    if (first + n > SketchCounters()) return Error("sketch counters out of range");
    if (n == 0) return "";
    Scratch<Exec, uint32_t> staged(exec_, static_cast<int64_t>(n));
    if (!staged.ok()) return Error("out of device memory for the admission sketch");
    exec_.ToDevice(staged.get(), counters, sizeof(uint32_t) * n);
    uint32_t* target = sketch_ + first;
    const uint32_t* given = staged.get();
    exec_.For(static_cast<int64_t>(n), [=] TF_EXT_HOST_DEVICE(int64_t i) {
      target[i] = keep_larger ? MaxOf(target[i], given[i]) : given[i];
    });
    exec_.Sync();  // `counters` is the caller's again on return
    return Checked("write the admission sketch");
  }

  std::string SwapContents(DeviceTable& other_table) override {
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

  std::string Clear(cudaStream_t stream) override {
    const OneCaller caller(this, stream);
    if (!caller.ok()) return Busy();
    EmptySlots(View());
    ZeroCounter(kSize);
    ZeroCounter(kTombstones);
    StopTracking();
    return Checked("clear");
  }

  // Marks every slot of `t` empty (the extra slots hold 0) and clears its bucket summaries.
  void EmptySlots(const TableView& t) {
    exec_.For(t.capacity + kExtraSlots,
              [=] TF_EXT_HOST_DEVICE(int64_t s) { t.keys[s] = s < t.capacity ? kEmptyKey : 0; });
    exec_.Fill(t.summaries, uint32_t{0}, SummaryWords(t.capacity));
  }

  // Host staging of one export chunk, in pinned memory so copies run at full speed.
  struct PinnedRows {
    PinnedRows(Exec& exec, int64_t rows, int stride) : exec_(exec) {
      keys = static_cast<int64_t*>(exec.AllocPinned(sizeof(int64_t) * rows));
      steps = static_cast<int64_t*>(exec.AllocPinned(sizeof(int64_t) * rows));
      counts = static_cast<uint32_t*>(exec.AllocPinned(sizeof(uint32_t) * rows));
      values = static_cast<float*>(exec.AllocPinned(sizeof(float) * stride * rows));
    }
    ~PinnedRows() {
      exec_.FreePinned(keys);
      exec_.FreePinned(steps);
      exec_.FreePinned(counts);
      exec_.FreePinned(values);
    }
    bool ok() const { return keys && steps && counts && values; }
    Exec& exec_;
    int64_t* keys;
    int64_t* steps;
    uint32_t* counts;
    float* values;
  };

  // Raises the latest training step to `step`; with if_updated, only if the last operation
  // updated a row (its count in kScratch), as the CPU table records steps.
  void RecordStep(int64_t step, bool if_updated) {
    int64_t* counters = counters_;
    exec_.For(1, [=] TF_EXT_HOST_DEVICE(int64_t) {
      if (!if_updated || Total(counters, kScratch) > 0) {
        atomic::Max(Stripe(counters, kLatestStep), step);
      }
    });
  }

  std::vector<int64_t> ReadCounters() {
    std::vector<int64_t> values(kCounterWords);
    exec_.ToHost(values.data(), counters_, sizeof(int64_t) * kCounterWords);
    exec_.Sync();
    return values;
  }
  int64_t ReadCounter(Counter counter) { return Total(ReadCounters().data(), counter); }
  void ZeroCounter(Counter counter) {
    exec_.Fill(Stripe(counters_, counter), int64_t{0}, kCounterStripes * kCounterStride);
  }
  void SetCounter(Counter counter, int64_t value) {
    ZeroCounter(counter);
    exec_.Fill(Stripe(counters_, counter), value, 1);
  }

  // Refuses a call of keys[0, n) that could take the table past options_.max_rows, before it
  // changes anything: far from the limit every key may be new (the running bound of occupied
  // slots, then the exact size, says so without a lookup); near it, the distinct keys the table
  // lacks count, found by a lookup and counted on the host. Keys a policy would not admit count
  // too, as on the CPU table.
  std::string CheckRowLimit(int64_t n, const int64_t* keys) {
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

  // Makes room for `incoming` new keys: keeps (rows + tombstones + incoming) within the load
  // factor. Past it, a rebuild drops the tombstones, into the same slots while the rows and the
  // incoming keys fit, else into twice the slots (until they fill at most half the load factor, so
  // growth is amortized). The count of occupied slots is read from the device only when the
  // running upper bound says the table may be full.
  std::string MakeRoom(int64_t incoming) {
    const double limit = options_.max_load_factor * static_cast<double>(capacity_);
    if (static_cast<double>(occupied_bound_ + incoming) <= limit) {
      occupied_bound_ += incoming;
      return "";
    }
    const std::vector<int64_t> counts = ReadCounters();  // one read for both
    const int64_t size = Total(counts.data(), kSize),
                  tombstones = Total(counts.data(), kTombstones);
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

  std::string Reserve(cudaStream_t stream, int64_t rows) override {
    const OneCaller caller(this, stream);
    if (!caller.ok()) return Busy();
    occupied_bound_ = capacity_;  // read the exact count
    return MakeRoom(rows);
  }

  // Moves every row into new storage of `capacity` slots and `num_slots` optimizer slots (new
  // slots start at slot_init), dropping tombstones. On failure the table is unchanged.
  std::string Rebuild(int64_t capacity, int num_slots, const std::vector<float>& slot_init) {
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

  // The removal log's device storage (RemovalLog).
  struct RemovalLogStorage {
    uint64_t* keys = nullptr;
    uint32_t* versions = nullptr;
    int64_t capacity = 0;
    bool Allocate(Exec& exec, int64_t entries) {
      keys = static_cast<uint64_t*>(exec.AllocLasting(sizeof(uint64_t) * entries));
      versions = static_cast<uint32_t*>(exec.AllocLasting(sizeof(uint32_t) * entries));
      capacity = entries;
      return keys && versions;
    }
    void Release(Exec& exec) {
      exec.FreeLasting(keys);
      exec.FreeLasting(versions);
      *this = RemovalLogStorage();
    }
  };

  // The table's device storage for one capacity and number of optimizer slots.
  struct Storage {
    uint64_t* keys = nullptr;
    float* values = nullptr;
    EntryMeta* meta = nullptr;
    float* slot_init = nullptr;     // the optimizer slots' initial values
    uint32_t* summaries = nullptr;  // TableView::summaries

    // Storage for `capacity` probed slots (and the extra ones).
    bool Allocate(Exec& exec, int64_t capacity, int stride, int num_slots) {
      const int64_t slots = capacity + kExtraSlots;
      keys = static_cast<uint64_t*>(exec.AllocLasting(sizeof(uint64_t) * slots));
      values = static_cast<float*>(exec.AllocLasting(sizeof(float) * stride * slots));
      meta = static_cast<EntryMeta*>(exec.AllocLasting(sizeof(EntryMeta) * slots));
      summaries =
          static_cast<uint32_t*>(exec.AllocLasting(sizeof(uint32_t) * SummaryWords(capacity)));
      if (num_slots > 0)
        slot_init = static_cast<float*>(exec.AllocLasting(sizeof(float) * num_slots));
      return keys && values && meta && summaries && (num_slots == 0 || slot_init);
    }
    void Release(Exec& exec) {
      exec.FreeLasting(summaries);
      exec.FreeLasting(keys);
      exec.FreeLasting(values);
      exec.FreeLasting(meta);
      exec.FreeLasting(slot_init);
      *this = Storage();
    }
  };

 private:
  const DeviceTableOptions options_;
  Exec exec_;
  Storage storage_;
  int64_t* counters_ = nullptr;
  uint32_t* sketch_ = nullptr;
  uint64_t sketch_width_mask_ = 0;
  int64_t capacity_ = 0;
  int num_slots_ = 0;
  std::vector<float> slot_init_;
  int64_t occupied_bound_ = 0;  // an upper bound of rows + tombstones
  int64_t lookups_ = 0, evicted_ = 0;
  // Delta snapshots: the version stamped on rows written now (1 and up, as the CPU table's), and
  // whether removals are logged, since which version, up to which one a snapshot is stored.
  uint32_t version_ = 1;
  bool tracking_ = false;
  int64_t tracked_since_ = 0, committed_version_ = 0;
  RemovalLogStorage log_;
  int64_t log_bound_ = 0;                  // an upper bound of the log's entries
  std::atomic<std::thread::id> caller_{};  // OneCaller
};

// Builds a table over `exec`: null and *error if it cannot.
template <typename Exec>
std::unique_ptr<DeviceTable> MakeTable(const DeviceTableOptions& options, Exec exec,
                                       std::string* error) {
  auto table = std::make_unique<DeviceTableImpl<Exec>>(options, std::move(exec));
  *error = table->Init();
  if (!error->empty()) return nullptr;
  return table;
}

}  // namespace gpu
}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_TABLE_IMPL_H_
