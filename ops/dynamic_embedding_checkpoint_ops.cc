// Op interfaces of streaming table checkpoints: full and delta snapshot files
// (kernels/dynamic_embedding/core/snapshot_file.h). Kernels:
// kernels/dynamic_embedding/checkpoint_kernels.cc.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_ext {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

namespace {

// Every input is a scalar except the ones named in `vectors`; every output `scalars` is a scalar.
Status ScalarInputsAndOutputs(InferenceContext* c, int scalars, int vector_input = -1) {
  ShapeHandle unused;
  for (int i = 0; i < c->num_inputs(); ++i) {
    TF_RETURN_IF_ERROR(c->WithRank(c->input(i), i == vector_input ? 1 : 0, &unused));
  }
  for (int i = 0; i < scalars; ++i) c->set_output(i, c->Scalar());
  return ::tensorflow::OkStatus();
}

}  // namespace

REGISTER_OP("TfExtTableSaveSnapshot")
    .Input("table: resource")
    .Input("path: string")
    .Input("since_version: int64")
    .Input("chain_id: int64")
    .Input("sequence: int64")
    .Input("step: int64")
    .Output("version: int64")
    .Output("rows: int64")
    .Output("tombstones: int64")
    .Output("bytes: int64")
    .Output("slot_initial_values: float")
    .Attr("track: bool = true")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ScalarInputsAndOutputs(c, 4));
      c->set_output(4, c->Vector(c->UnknownDim()));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Writes a table snapshot file, streaming: a full snapshot, or a delta since an earlier one.

The table is walked under its shards' read locks (lookups go on, updates wait) and written in
chunks of about 1 MiB with checksums, to `path` + a temporary suffix that is renamed to `path`
once complete: a failed or killed save never leaves a partial file under `path`. The file also
holds the table's admission state (the counts of ids waiting for admission), whole, also in a
delta.

path: The file to write (any file system TensorFlow writes).
since_version: -1 for a full snapshot; else the version an earlier snapshot of this table returned:
the delta holds the rows changed and the ids removed since then. Fails with FailedPrecondition when
the table cannot answer for that version (never snapshotted with tracking, restored since, or
older than the last delta committed).
chain_id: Recorded in the file: the chain's full snapshot id, shared by its deltas.
sequence: Recorded in the file: 0 for a full snapshot, n for the n-th delta of the chain.
step: Recorded in the file: the global step of the save.
version: This snapshot's version: the since_version of the next delta.
rows: Rows written.
tombstones: Removed ids written (deltas only).
bytes: The file's size.
slot_initial_values: The initial value of each optimizer slot.
track: Track changes from now on so that deltas can follow, and forget the changes this file
holds once it is complete. False for plain checkpoints, which start no tracking.
)doc");

REGISTER_OP("TfExtTableRestoreSnapshots")
    .Input("table: resource")
    .Input("paths: string")
    .Output("version: int64")
    .Output("step: int64")
    .Attr("track: bool = false")
    .Attr("verify_only: bool = false")
    .Attr("num_shards: int = 1")
    .Attr("shard_index: int = 0")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return ScalarInputsAndOutputs(c, 2, 1); })
    .Doc(R"doc(
Replaces a table's content with a snapshot chain, streaming and atomically.

paths[0] must be a full snapshot and each later path the next delta of the same chain. The files
are read in chunks into a new table that replaces the content only once every file was read and
its checksums held. A missing, corrupt or out-of-order file is an error naming it, and leaves the
table as it was. Slots the table already has beyond the snapshot's are kept, at their initial
values. The admission counts become the last file's that holds any (0 without).

paths: The chain's files, in order. An empty path separates chains: the chains of the parts of
a table split across ranks (disjoint ids), merged; each one's admission state is its last file's.
version: With track, the version to pass as since_version of the next delta (continuing the
chain); else -1.
step: The step recorded in the last file.
track: Make the restored content the base of later deltas.
verify_only: Read and check every file as a restore would (headers against the table, chain
order, every checksum, the counts of the end block) and change nothing, so a restore of several
tables can check them all before the first one changes. version is then -1.
num_shards: With shard_index, keep only the rows of the ids whose TfExtShardOf(id, num_shards)
is shard_index (a rank's part of a table split across num_shards ranks).
)doc");

REGISTER_OP("TfExtTableRestoreCheckpoint")
    .Input("table: resource")
    .Input("snapshot_path: string")
    .Input("checkpoint_prefix: string")
    .Input("legacy_tensor_prefix: string")
    .Attr("num_shards: int >= 1 = 1")
    .Attr("shard_index: int >= 0 = 0")
    .Attr("verify_only: bool = false")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return ScalarInputsAndOutputs(c, 0); })
    .Doc(R"doc(
Restores a table saved with a TensorFlow checkpoint (Saver, tf.train.Checkpoint, SavedModel).

Since tf_ext 0.2 a checkpoint keeps each table in a snapshot file beside its index, streamed on save
and restore. Checkpoints of tf_ext 0.1 hold the table as six tensors in the checkpoint itself;
when `snapshot_path` does not exist and the checkpoint at `checkpoint_prefix` holds
`legacy_tensor_prefix` + "keys", those are read instead (whole, as 0.1 wrote them).

snapshot_path: The table's snapshot file.
checkpoint_prefix: The checkpoint's prefix.
legacy_tensor_prefix: The name of the table's tensors in a 0.1 checkpoint, less the suffix.
num_shards: With more than 1, the table is shard `shard_index` of a table split into `num_shards`
by TfExtShardOf, and keeps only the rows of its ids. `snapshot_path` may then also be the manifest
of a sharded table saved with any number of shards (kernels/dynamic_embedding/core/sharding.h): its
files (named relative to `checkpoint_prefix`) are read, only this shard's file when the counts
match, else every file, filtered. A manifest restores into a plain table (num_shards 1) too.
shard_index: This table's shard, in [0, num_shards).
verify_only: Check every file the restore would read (the manifest, each snapshot in full with
its checksums; a 0.1 checkpoint's tensors by name and type) and change nothing.
)doc");

REGISTER_OP("TfExtTableWriteServingBundle")
    .Input("table: resource")
    .Input("prefix: string")
    .Input("keys_name: string")
    .Input("values_name: string")
    .Input("first_row: int64")
    .Input("total_rows: int64")
    .Output("rows: int64")
    .Attr("chunk_rows: int >= 1 = 65536")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return ScalarInputsAndOutputs(c, 1); })
    .Doc(R"doc(
Writes a table's ids and rows into a TensorFlow tensor bundle, streaming, for serving exports.

The bundle at `prefix` holds them as the slices of two tensors, `keys_name` [total_rows] and
`values_name` [total_rows, dim], as core MutableHashTable's checkpoint names them. The table's
rows at one instant are written `chunk_rows` rows at a time, so the op needs memory for one
chunk, not for the table's rows; RestoreV2 (and so TensorFlow Serving) reads the slices back as
whole tensors, and MergeV2Checkpoints merges them with other bundles. Tables of int64 ids in host
memory only: a table of string ids (whose sliced tensors RestoreV2 misreads) or in GPU memory is
refused with Unimplemented, and exported whole instead.

first_row: Where this table's rows start in the tensors (the shards of a table write one range
each).
total_rows: The tensors' rows; -1: first_row + this table's rows. Fails with FailedPrecondition
when the table holds more rows than fit. With 0 rows in all, the tensors are written whole and
empty.
rows: Rows written.
chunk_rows: Rows per slice.
)doc");

}  // namespace tf_ext
