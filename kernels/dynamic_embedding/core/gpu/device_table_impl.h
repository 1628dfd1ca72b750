// The GPU table's algorithm (device_table.h), written once over an executor `Exec` that owns
// memory and runs kernel bodies: CudaExec (cuda_exec.cuh) launches them as CUDA kernels, HostExec
// (host_exec.h) runs them on host threads. Every body is a TF_EXT_HOST_DEVICE lambda over
// TableView, a plain copy of the table's pointers and sizes.
//
// nvcc's rules for such lambdas shape this file: the function defining one must be a public
// member, and the lambda must not capture `this` (it would point into host memory on the
// device). So every member function is public, and the bodies use locals only: a TableView, the
// op's arguments and temporary buffers.
//
// Files. Include this header only. It declares DeviceTableImpl whole (its state, the small
// accessors, and each member function with its contract); the other member functions are defined
// out of the class, one header per concern, as the CPU table's are (embedding_table.h):
//   device_table_lookup.h      Find, FindOrInsert, GatherRows, InitializeRows
//   device_table_update.h      ApplyGradients, GroupKeys, InsertOrAssign, AssignRows, EnsureSlots,
//                              Import
//   device_table_removal.h     Remove, RemoveHostKeys, Evict, EvictLeastRecent, Clear, EmptySlots
//   device_table_snapshot.h    Export, BeginSnapshot, ExportRemoved, CommitSnapshot,
//                              MarkSnapshotBase, the removal log, SwapContents
//   device_table_statistics.h  Size, LatestStep, Counters, the admission sketch's counters
//   device_table_growth.h      Init, CheckRowLimit, MakeRoom, Reserve, Rebuild
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
  std::string Init();

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
                  float* rows);

  std::string Find(cudaStream_t stream, int64_t n, const int64_t* keys, float* rows,
                   bool* found) override;

  // Gives the slots of newly created rows their initial row, slots and metadata: rows whose
  // created[i] is set, slot slots[i], key keys[i], for i in [0, n).
  void InitializeRows(int64_t n, const int64_t* keys, const int64_t* slots, const uint8_t* created);

  std::string FindOrInsert(cudaStream_t stream, int64_t n, const int64_t* keys,
                           float* rows) override;

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
  std::string GroupKeys(int64_t n, const int64_t* keys, Groups* groups);

  std::string ApplyGradients(cudaStream_t stream, const OptimizerParams& params, int64_t step,
                             int64_t n, const int64_t* keys, const float* gradients) override;

  // Writes rows of keys[0, n): with full_rows, the whole row (stride floats), update count and
  // last step from `counts` and `steps` (Import); else the embedding (dim floats) only
  // (InsertOrAssign). Of a key given twice, the last wins.
  std::string AssignRows(int64_t n, const int64_t* keys, const float* rows, bool full_rows,
                         const uint32_t* counts, const int64_t* steps);

  std::string InsertOrAssign(cudaStream_t stream, int64_t n, const int64_t* keys,
                             const float* rows) override;

  std::string Remove(cudaStream_t stream, int64_t n, const int64_t* keys,
                     int64_t* removed) override;

  std::string EnsureSlots(cudaStream_t stream, int num_slots,
                          const std::vector<float>& slot_init) override;

  std::string Evict(cudaStream_t stream, const EvictionCriteria& criteria,
                    int64_t* evicted) override;

  // Removes the least recently updated rows while more than max_size remain; ties in slot order.
  std::string EvictLeastRecent(int64_t max_size, int64_t* removed);

  int64_t Size(cudaStream_t stream) override;
  int64_t LatestStep(cudaStream_t stream) override;
  TableCounters Counters(cudaStream_t stream) override;

  std::string Export(cudaStream_t stream, int64_t chunk_rows,
                     const std::function<bool(const HostRows&)>& visit,
                     int64_t changed_after) override;

  std::string BeginSnapshot(cudaStream_t stream, int64_t since_version, bool track,
                            DeviceSnapshotPlan* plan) override;

  std::string ExportRemoved(cudaStream_t stream, int64_t since_version, int64_t chunk_rows,
                            const std::function<bool(int64_t, const int64_t*)>& visit) override;

  // Drops the removal log's entries of versions up to `version`, keeping the others in order,
  // and gives back the memory they held.
  std::string CommitSnapshot(cudaStream_t stream, int64_t version) override;

  int64_t MarkSnapshotBase(cudaStream_t stream) override;

  // Tracking starts with an empty log: the snapshot at `version` holds everything before it.
  void StartTracking(int64_t version);
  void StopTracking();
  // Drops every entry of the removal log, and its memory.
  void EmptyLog();

  // While tracking, makes room in the removal log for `removals` more entries (growing it to
  // twice what it needs); the exact count is read only when the running bound says it may be full.
  std::string MakeLogRoom(int64_t removals);

  // Moves the removal log's `logged` entries of versions after `after` (-1: every one), in order,
  // into new storage of `capacity` entries. "" or the error; then the log is unchanged.
  std::string RebuildLog(int64_t capacity, int64_t after, int64_t logged);

  std::string Import(cudaStream_t stream, const HostRows& rows) override;

  std::string RemoveHostKeys(cudaStream_t stream, int64_t n, const int64_t* keys) override;

  uint64_t SketchCounters() const override;
  std::string ReadSketch(cudaStream_t stream, uint64_t first, size_t n,
                         uint32_t* counters) override;
  std::string WriteSketch(cudaStream_t stream, uint64_t first, size_t n, const uint32_t* counters,
                          bool keep_larger) override;

  std::string SwapContents(DeviceTable& other_table) override;

  std::string Clear(cudaStream_t stream) override;

  // Marks every slot of `t` empty (the extra slots hold 0) and clears its bucket summaries.
  void EmptySlots(const TableView& t);

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
  void RecordStep(int64_t step, bool if_updated);

  std::vector<int64_t> ReadCounters();
  int64_t ReadCounter(Counter counter) { return Total(ReadCounters().data(), counter); }
  void ZeroCounter(Counter counter);
  void SetCounter(Counter counter, int64_t value);

  // Refuses a call of keys[0, n) that could take the table past options_.max_rows, before it
  // changes anything: far from the limit every key may be new (the running bound of occupied
  // slots, then the exact size, says so without a lookup); near it, the distinct keys the table
  // lacks count, found by a lookup and counted on the host. Keys a policy would not admit count
  // too, as on the CPU table.
  std::string CheckRowLimit(int64_t n, const int64_t* keys);

  // Makes room for `incoming` new keys: keeps (rows + tombstones + incoming) within the load
  // factor. Past it, a rebuild drops the tombstones, into the same slots while the rows and the
  // incoming keys fit, else into twice the slots (until they fill at most half the load factor, so
  // growth is amortized). The count of occupied slots is read from the device only when the
  // running upper bound says the table may be full.
  std::string MakeRoom(int64_t incoming);

  std::string Reserve(cudaStream_t stream, int64_t rows) override;

  // Moves every row into new storage of `capacity` slots and `num_slots` optimizer slots (new
  // slots start at slot_init), dropping tombstones. On failure the table is unchanged.
  std::string Rebuild(int64_t capacity, int num_slots, const std::vector<float>& slot_init);

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

// The member functions, by concern (see the top of this file). Each of these headers includes this
// one too, so that it compiles on its own; the include guards make either order work.
#include "kernels/dynamic_embedding/core/gpu/device_table_growth.h"
#include "kernels/dynamic_embedding/core/gpu/device_table_lookup.h"
#include "kernels/dynamic_embedding/core/gpu/device_table_removal.h"
#include "kernels/dynamic_embedding/core/gpu/device_table_snapshot.h"
#include "kernels/dynamic_embedding/core/gpu/device_table_statistics.h"
#include "kernels/dynamic_embedding/core/gpu/device_table_update.h"

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_TABLE_IMPL_H_
