// GPU tables in the CPU table's snapshot files (snapshot_file.h): a table saved from the GPU
// restores into the CPU table and back, rows, slots, update counts and last steps exact. Both
// stream in chunks, so the extra memory is one chunk, whatever the table's size.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_SNAPSHOT_FILE_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_SNAPSHOT_FILE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/dynamic_embedding/core/gpu/device_table.h"
#include "kernels/dynamic_embedding/core/snapshot_file.h"
#include "kernels/dynamic_embedding/core/snapshot_restore.h"

namespace tf_ext {
namespace de {

// Writes a snapshot of `table`, with its admission sketch: a full one (since_version < 0) or a
// delta of what changed after the snapshot of since_version (the ids removed since, then the
// rows written since), by DeviceTable::BeginSnapshot's rules; with track, deltas can follow it
// (commit it with DeviceTable::CommitSnapshot once it is stored). Of *header it keeps chain_id,
// sequence, step and table_name and fills in the rest, as written (kind, rows, tombstones, slots,
// admission). *version (optional): the snapshot's version, or DeviceSnapshotPlan::kNoDeltaBase
// when no delta since since_version can be taken (then nothing is written). "" or what went wrong.
std::string WriteDeviceSnapshot(DeviceTable& table, cudaStream_t stream, SnapshotHeader* header,
                                ByteSink* sink, int64_t chunk_rows = 0, int64_t since_version = -1,
                                bool track = false, int64_t* version = nullptr);

// The GPU table's side of a restore (snapshot_restore.h): rows and removed ids are staged in host
// memory and go to the table in chunks (Import, RemoveHostKeys), removed ids before the rows that
// follow them. A GPU table counts admission with a sketch only: a CPU table's exact pending
// counts are dropped.
class DeviceTableSink : public RestoreSink<int64_t> {
 public:
  // `table` (not owned): the new table, used on `stream`.
  DeviceTableSink(DeviceTable* table, cudaStream_t stream) : table_(table), stream_(stream) {}
  int num_slots() const override { return table_->num_slots(); }
  TableError EnsureSlots(int num_slots, const std::vector<float>& slot_init) override;
  TableError PutRow(int64_t key, uint32_t update_count, int64_t last_step, const float* values,
                    int file_slots) override;
  TableError Remove(int64_t key) override;
  TableError ClearAdmission() override;
  TableError RestorePending(int64_t, uint32_t) override { return TableError::Ok(); }
  TableError RestoreSketch(uint64_t width, int depth, uint64_t first, size_t n,
                           const uint32_t* counters) override;
  TableError Flush() override;

 private:
  static constexpr size_t kChunkRows = size_t{1} << 16;
  TableError FlushRows();
  TableError FlushRemoved();

  DeviceTable* table_;
  cudaStream_t stream_;
  std::vector<float> slot_init_ = table_->slot_initial_values();
  std::vector<int64_t> keys_, steps_, removed_;
  std::vector<uint32_t> counts_;
  std::vector<float> values_;
};

// Applies one full or delta snapshot of int64 keys to `table` (a full one onto an empty table
// restores it) by the restore rules of snapshot_restore.h, as the CPU table's restore does. *header
// (optional) receives the file's header. "" or what is wrong with the file; then the table holds
// part of it: restore into a new table and keep it only on success, as the kernels do. With
// merge_admission (the shards of a checkpoint merging into one table) the file's sketch merges
// into the table's, each counter keeping the larger value; else it replaces it.
std::string ReadDeviceSnapshot(ByteSource* source, DeviceTable& table, cudaStream_t stream,
                               SnapshotHeader* header = nullptr, bool merge_admission = false);

}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_SNAPSHOT_FILE_H_
