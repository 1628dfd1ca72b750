// GPU tables in the CPU table's snapshot files (snapshot_file.h): a table saved from the GPU
// restores into the CPU table and back, rows, slots, update counts and last steps exact. Both
// stream in chunks, so the extra memory is one chunk, whatever the table's size.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_TABLE_SNAPSHOT_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_TABLE_SNAPSHOT_H_

#include <cstdint>
#include <string>

#include "kernels/dynamic_embedding/core/gpu/device_table.h"
#include "kernels/dynamic_embedding/core/snapshot_file.h"

namespace tf_ext {
namespace de {

// Writes a full snapshot of `table`, with its admission sketch. Of *header it keeps chain_id,
// step and table_name and fills in the rest, as written (rows, slots, admission). "" or what
// went wrong.
std::string WriteDeviceSnapshot(DeviceTable& table, cudaStream_t stream, SnapshotHeader* header,
                                ByteSink* sink, int64_t chunk_rows = 0);

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

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_TABLE_SNAPSHOT_H_
