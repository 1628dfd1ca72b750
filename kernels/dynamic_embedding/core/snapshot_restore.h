// Restoring snapshot files into a table, written once for every storage: the rules of chains (a
// full snapshot, then its deltas, in order), tombstones, the initializer version, row limits,
// optimizer slots, shard filtering, merging the parts of a split table, and admission state. A
// storage takes part through RestoreSink, the rows-in side of its table; the restore fills a new
// empty table through it, and the caller swaps that table in only once every file read cleanly,
// so a failure leaves the live table as it was.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_SNAPSHOT_RESTORE_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_SNAPSHOT_RESTORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/dynamic_embedding/core/snapshot_file.h"
#include "kernels/dynamic_embedding/core/table_error.h"

namespace tf_ext {
namespace de {

template <typename Key>
struct RestoreKey {
  using View = int64_t;
};
template <>
struct RestoreKey<std::string> {
  using View = std::string_view;
};

// What a restore writes into: a new, empty table of some storage.
template <typename Key>
class RestoreSink {
 public:
  using KeyView = typename RestoreKey<Key>::View;
  virtual ~RestoreSink() = default;
  virtual int num_slots() const = 0;
  // Gives every row at least num_slots optimizer slots, new ones starting at slot_init.
  virtual TableError EnsureSlots(int num_slots, const std::vector<float>& slot_init) = 0;
  // Sets a key's row exactly: the embedding and file_slots optimizer slots in values (the table's
  // other slots keep their initial values), its update count and last step. A row the table's
  // max_rows has no room for is refused with CheckTableRows' error (kResourceExhausted).
  virtual TableError PutRow(KeyView key, uint32_t update_count, int64_t last_step,
                            const float* values, int file_slots) = 0;
  virtual TableError Remove(KeyView key) = 0;
  // Admission state: forget every count; an id's exact count (a storage that counts with a sketch
  // only may drop it); sketch counters [first, first + n) of a width x depth sketch, each keeping
  // the larger of its count and the file's (a sketch of another shape cannot be re-hashed and is
  // dropped).
  virtual TableError ClearAdmission() = 0;
  virtual TableError RestorePending(KeyView key, uint32_t count) = 0;
  virtual TableError RestoreSketch(uint64_t width, int depth, uint64_t first, size_t n,
                                   const uint32_t* counters) = 0;
  // Writes what the sink holds back (a storage that stages rows); after each file.
  virtual TableError Flush() { return TableError::Ok(); }
};

// A snapshot file opened for reading; io_error says why a read failed ("" at a clean end).
struct OpenedSnapshot {
  std::unique_ptr<ByteSource> source;
  std::function<std::string()> io_error;
};
using OpenSnapshot = std::function<TableError(const std::string& path, OpenedSnapshot* opened)>;

struct RestoreOptions {
  std::string table_name;  // named in every error
  int dim = 0;
  int initializer_version = 1;
  int64_t max_rows = kMaxTableRows;
  // As shard `shard_index` of `num_shards`, keep only that shard's ids (ShardOf).
  int num_shards = 1;
  int shard_index = 0;
  // Read and check every file the same way, but write nothing into the sink.
  bool verify_only = false;
  // The sink holds other parts of the table already: merge with them, as several chains do.
  bool merge_into_sink = false;
  // Whether each chain must start with a full snapshot and its deltas follow in order. Off, a
  // single delta applies onto a sink that holds its base already.
  bool check_chain_order = true;
};

// Reads snapshot chains (each a full snapshot, then its deltas) into `sink`, a new empty table.
// Several chains (the parts of a table split across ranks, whose ids are disjoint, or the shards
// of a sharded checkpoint) merge into one table. Admission state: a file of a chain that holds
// some replaces the earlier files' (it is the whole state at its save); merged chains add up,
// each with its last file's state: exact counts of this shard's ids, sketch counters by
// element-wise max (admission.h says why); exact counts restored into a sketch raise the ids'
// estimates; files without admission state (format version 1) leave the counts at 0.
// *step: the last file's training step; *last_header (optional): the last file's header.
template <typename Key>
TableError RestoreChains(const RestoreOptions& options,
                         const std::vector<std::vector<std::string>>& chains,
                         const OpenSnapshot& open, RestoreSink<Key>* sink, int64_t* step,
                         SnapshotHeader* last_header = nullptr);

}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_SNAPSHOT_RESTORE_H_
