// The GPU table core: a dynamic embedding table whose keys, rows, optimizer slots and metadata live
// in GPU memory, serving the same rows as the CPU table (embedding_table.h). No TensorFlow types;
// every call takes the CUDA stream it runs on.
//
// What it shares with the CPU table, so both serve and train the same rows:
//   - initial rows: InitialRowKeyHash and the initializer's stream (initializers.h), computed on
//     the device by the same functions: bit-identical rows for every initializer kind;
//   - optimizer steps: the same per-element functions (optimizers.h), compiled without fused
//     multiply-adds (host_device.h), so updates match to the rounding of the device's pow;
//   - admission (SketchCounterIndex: the same count-min sketch), eviction (Condemned, then the
//     least recently updated rows over max_size), update counts, last steps;
//   - the snapshot format (snapshot_file.h, through device_snapshot_file.h): a table saved from
//     the GPU restores into the CPU table and back.
// Differences, by design:
//   - int64 keys only: string tables stay on the CPU (the TF kernels refuse a GPU placement);
//   - exact admission counting (AdmissionSpec::exact) is CPU-only: the GPU table refuses it;
//   - duplicate ids in one ApplyGradients are summed into one update (the CPU op receives ids the
//     Python layer already deduplicated the same way);
//   - ties at the max_size cutoff of eviction (rows last updated at the same step) go in slot
//     order, the CPU table's in shard order: which of those tied rows go may differ.
//
// Layout: open addressing over a power-of-two number of slots (at least 64), probed in buckets of
// 8 slots that follow one another by double hashing (device_slots.h's Probe), each with a summary
// word that lets a lookup skip buckets and stop early. Slot i holds
// the key (keys[i]), the row (values[i * stride]: the embedding, then each optimizer slot, as a
// snapshot row) and its metadata. A key is claimed with one 64-bit compare-and-swap, so threads
// inserting the same key agree on one slot and never lock. Removal leaves a tombstone. Before an
// operation that may add keys, the table makes room for all of them: past the load factor it
// rebuilds, dropping tombstones, into twice the slots if the rows need them. So an insert always
// finds a free slot, and no key is ever dropped for want of space. If the device runs out of
// memory, the operation fails with an error naming the table and the size it was growing to, and
// the table is unchanged.
//
// Pointers to keys, rows and gradients are device memory (host memory for MakeEmulatedGpuTable's
// table). Calls return "" or what went wrong; a table is used from one host thread at a time (a
// call from another thread while one runs returns an error saying so, and changes nothing).
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_TABLE_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_TABLE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/dynamic_embedding/core/admission.h"
#include "kernels/dynamic_embedding/core/initializers.h"
#include "kernels/dynamic_embedding/core/limits.h"
#include "kernels/dynamic_embedding/core/optimizers.h"
#include "kernels/dynamic_embedding/core/table_policies.h"

// CUDA's stream type, declared as CUDA's driver_types.h declares it, so that this header needs no
// CUDA header.
struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;

namespace tf_ext {
namespace de {

struct DeviceTableOptions {
  std::string name;  // named in every error
  int dim = 0;
  InitializerSpec initializer;
  AdmissionSpec admission;
  int64_t initial_capacity = 1024;  // slots; rounded up to a power of two
  // Keys plus tombstones per slot past which the table grows. Higher packs more rows per byte
  // and probes longer.
  double max_load_factor = 0.75;
  // GPU threads that probe for one key and copy its row together: 1, 2, 4, 8, 16 or 32; 0 takes
  // kDefaultTileLanes. The benchmark compares them; the host table ignores it.
  int tile_lanes = 0;
  // Rows the table may hold (limits.h): a call that would add more is refused before it changes
  // anything, with CheckTableRows' error.
  int64_t max_rows = kMaxTableRows;
};

// Four lanes: on an H200 (benchmarks/gpu_table.py, 2026-11-27) they beat 8, 16 and 32 at every
// dim measured (8 and 128), in find and find-or-insert: fewer lanes per key keep more keys in
// flight, and four 16-byte vectors per lane still move a row of 128 floats in two rounds.
constexpr int kDefaultTileLanes = 4;

// What a snapshot begun by DeviceTable::BeginSnapshot will hold.
struct DeviceSnapshotPlan {
  int64_t version = -1;    // the snapshot's version; kNoDeltaBase: no delta since that version
  int64_t rows = 0;        // rows it holds
  int64_t tombstones = 0;  // ids removed since its base (a delta's)
  static constexpr int64_t kNoDeltaBase = -2;
};

// Rows in host memory, as a snapshot holds them: for each of n keys its update count, last step
// and the embedding followed by each optimizer slot (dim * (1 + num_slots) floats).
struct HostRows {
  int64_t n = 0;
  const int64_t* keys = nullptr;
  const uint32_t* update_counts = nullptr;
  const int64_t* last_steps = nullptr;
  const float* values = nullptr;
};

class DeviceTable {
 public:
  virtual ~DeviceTable() = default;

  virtual const DeviceTableOptions& options() const = 0;
  // Whether keys, rows and the pointers calls take are host memory (MakeEmulatedGpuTable's table).
  virtual bool InHostMemory() const = 0;
  // A new empty table of the same options on the same backend (a restore fills one aside).
  virtual std::unique_ptr<DeviceTable> NewEmpty(std::string* error) const = 0;
  int dim() const { return options().dim; }
  virtual int num_slots() const = 0;
  virtual std::vector<float> slot_initial_values() const = 0;
  virtual int64_t Capacity() const = 0;  // slots
  virtual size_t BytesInUse() const = 0;

  // The rows of keys[0, n) into rows[n, dim]; a missing key reads its initial row and adds
  // nothing. found (optional): whether each key was present.
  virtual std::string Find(cudaStream_t stream, int64_t n, const int64_t* keys, float* rows,
                           bool* found) = 0;
  // Find, but each missing key that the admission policy admits (every one without admission;
  // each occurrence counts once) gets its row: its initial row and slots, no updates, and the
  // latest training step as its last step.
  virtual std::string FindOrInsert(cudaStream_t stream, int64_t n, const int64_t* keys,
                                   float* rows) = 0;
  // Sets the embeddings of keys[0, n) to rows[n, dim]; an existing key keeps its slots and
  // metadata, a new one gets FindOrInsert's. Of a key given twice, the last row wins.
  virtual std::string InsertOrAssign(cudaStream_t stream, int64_t n, const int64_t* keys,
                                     const float* rows) = 0;
  // Removes keys[0, n); *removed (host, optional): how many were present.
  virtual std::string Remove(cudaStream_t stream, int64_t n, const int64_t* keys,
                             int64_t* removed) = 0;
  // Gives every row at least num_slots optimizer slots, new ones starting at slot_init[i].
  virtual std::string EnsureSlots(cudaStream_t stream, int num_slots,
                                  const std::vector<float>& slot_init) = 0;
  // One optimizer step at global step `step` for keys[0, n) with gradients[n, dim]. The
  // gradients of a key given more than once are summed, in the order given, into one update. A
  // missing key is counted by the admission policy once per call and, when admitted, gets its
  // initial row first; a key not admitted is dropped. Each updated row counts the update and
  // records the step. Gives the table the optimizer's slots first.
  virtual std::string ApplyGradients(cudaStream_t stream, const OptimizerParams& params,
                                     int64_t step, int64_t n, const int64_t* keys,
                                     const float* gradients) = 0;
  // Removes the rows `criteria` condemns (Condemned), then, over max_size, the least recently
  // updated; *evicted (host, optional): how many.
  virtual std::string Evict(cudaStream_t stream, const EvictionCriteria& criteria,
                            int64_t* evicted) = 0;

  // Makes room for `rows` more keys now (growing, or dropping removed rows' tombstones), so that
  // inserting them later does not rebuild the table.
  virtual std::string Reserve(cudaStream_t stream, int64_t rows) = 0;

  // These wait for the stream.
  virtual int64_t Size(cudaStream_t stream) = 0;
  virtual int64_t LatestStep(cudaStream_t stream) = 0;
  virtual TableCounters Counters(cudaStream_t stream) = 0;

  // Every row (with changed_after >= 0, those written after the snapshot of that version), in
  // chunks of at most chunk_rows through pinned host memory: visit(rows) for each chunk, valid
  // during the call; false stops. The table is not changed; extra memory is one chunk on the
  // device and one on the host.
  virtual std::string Export(cudaStream_t stream, int64_t chunk_rows,
                             const std::function<bool(const HostRows&)>& visit,
                             int64_t changed_after = -1) = 0;

  // Delta snapshots, with the CPU table's rules (embedding_table_snapshot.h). Every row written
  // carries the table's version; each snapshot takes the current version and moves the table to
  // the next. While the table tracks changes (from a tracked snapshot or MarkSnapshotBase on, until
  // Clear or SwapContents), each removal also logs its id and version.
  //
  // Begins a snapshot, full (since_version < 0) or a delta of what changed after the snapshot of
  // since_version; with track, the table tracks changes from this snapshot on, so that deltas can
  // follow it. A delta needs the table to have tracked since since_version, and no later snapshot
  // committed: else plan->version is kNoDeltaBase and nothing changed. Then Export(...,
  // changed_after = since_version) and ExportRemoved(since_version, ...) give its content.
  virtual std::string BeginSnapshot(cudaStream_t stream, int64_t since_version, bool track,
                                    DeviceSnapshotPlan* plan) = 0;
  // The ids removed after the snapshot of since_version (while tracking), in chunks of at most
  // chunk_rows in host memory: visit(n, ids) for each; false stops.
  virtual std::string ExportRemoved(cudaStream_t stream, int64_t since_version, int64_t chunk_rows,
                                    const std::function<bool(int64_t, const int64_t*)>& visit) = 0;
  // The snapshot of `version` is stored: the log drops what it covers, and no delta can be taken
  // since an earlier version any more.
  virtual std::string CommitSnapshot(cudaStream_t stream, int64_t version) = 0;
  // After a restore: starts tracking changes from the content as it is; returns the version a
  // delta can be taken since.
  virtual int64_t MarkSnapshotBase(cudaStream_t stream) = 0;
  // Restores rows exactly (embedding, slots, update count, last step), replacing the rows of
  // keys already present. The rows carry num_slots() slots (EnsureSlots first).
  virtual std::string Import(cudaStream_t stream, const HostRows& rows) = 0;
  // Remove for keys in host memory (staged through the device; for restores of deltas).
  virtual std::string RemoveHostKeys(cudaStream_t stream, int64_t n, const int64_t* keys) = 0;
  // Removes every row, and stops tracking changes (as the CPU table's Clear does).
  virtual std::string Clear(cudaStream_t stream) = 0;
  // The admission sketch's counters (admission.h; 0 without sketch admission): width * depth of
  // them, in the CPU table's CountMinSketch order, read or written [first, first + n) at a time
  // through host memory. With keep_larger, a write keeps the larger of each counter and the given
  // value (merging sketches); else it sets them.
  virtual uint64_t SketchCounters() const = 0;
  virtual std::string ReadSketch(cudaStream_t stream, uint64_t first, size_t n,
                                 uint32_t* counters) = 0;
  virtual std::string WriteSketch(cudaStream_t stream, uint64_t first, size_t n,
                                  const uint32_t* counters, bool keep_larger) = 0;
  // Exchanges the rows, slots, metadata and admission counts of this table and `other`, a table
  // of the same options made by the same factory: a restore fills a new table and swaps it in
  // only once every file read cleanly. Both stop tracking changes (MarkSnapshotBase starts it
  // again) and continue from the later of their versions. "" or why not (then neither table
  // changed).
  virtual std::string SwapContents(DeviceTable& other) = 0;
};

// The table on the current CUDA device. Without CUDA in the build (TF_EXT_CUDA=0, or no nvcc),
// returns null and says why in *error.
std::unique_ptr<DeviceTable> MakeCudaTable(const DeviceTableOptions& options, std::string* error);
// Whether this build has the CUDA table.
bool CudaTableBuilt();
// The same table, algorithm and arithmetic on the host: every kernel body runs on `threads` CPU
// threads instead of a GPU, pointers are host memory, the stream is ignored. The CPU build tests
// the GPU table's logic with it; it is not a fast CPU table.
std::unique_ptr<DeviceTable> MakeEmulatedGpuTable(const DeviceTableOptions& options,
                                                  std::string* error, int threads = 1);

}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_TABLE_H_
