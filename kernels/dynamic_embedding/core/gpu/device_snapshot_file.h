// GPU tables in the CPU table's snapshot files (snapshot_file.h): a table saved from the GPU
// restores into the CPU table and back, rows, slots, update counts and last steps exact. Both
// stream in chunks, so the extra memory is one chunk, whatever the table's size.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_SNAPSHOT_FILE_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_SNAPSHOT_FILE_H_

#include <cstdint>
#include <string>

#include "kernels/dynamic_embedding/core/gpu/device_table.h"
#include "kernels/dynamic_embedding/core/snapshot_file.h"

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

// Applies a full or delta snapshot of int64 keys to `table` (a full one onto an empty table
// restores it): removed ids first, then rows. Rows with fewer optimizer slots than the table get
// the table's initial slot values; a file with more gives the table its slots first. *header
// (optional) receives the file's header. "" or what is wrong with the file; then the table holds
// part of it: restore into a new table and keep it only on success, as the CPU kernels do.
// Admission state, as the CPU table restores it: a file's sketch replaces the table's (with
// merge_admission, as when the shards of a checkpoint merge into one table, each counter keeps
// the larger value); a sketch of another width or depth than the table's is dropped, and so are
// a CPU table's exact pending counts, which a GPU table cannot hold.
std::string ReadDeviceSnapshot(ByteSource* source, DeviceTable& table, cudaStream_t stream,
                               SnapshotHeader* header = nullptr, bool merge_admission = false);

}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_SNAPSHOT_FILE_H_
