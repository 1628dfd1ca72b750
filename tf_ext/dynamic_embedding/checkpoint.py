"""Tables in TensorFlow checkpoints: streamed into a snapshot file beside the checkpoint.

TensorFlow's SaveV2/RestoreV2 move whole tensors, so a table saved through them is copied into
memory whole. Instead, each table is written by the op TfExtTableSaveSnapshot, streaming in chunks,
to its own file beside the checkpoint's index, and read back by TfExtTableRestoreCheckpoint:

- `tf.compat.v1.train.Saver` (and so MonitoredTrainingSession and Estimator): `TableSaveable`.
- `tf.train.Checkpoint`, `CheckpointManager`, Keras `save_weights` and SavedModel: a registered
  checkpoint saver (`register`).

The file of a table is `<prefix>.data-tXXXX-of-XXXXX` (a hash of the table's name in the
checkpoint): TensorFlow deletes a checkpoint's `<prefix>.data-?????-of-?????` files with it
(Saver's max_to_keep, CheckpointManager), so the table's file goes too, and copying `<prefix>.*`
copies it. Checkpoints of tf_ext 0.1 (the table as six tensors in the checkpoint) still restore.

A sharded table (sharded.py) writes one such file per shard, named after the shard, and at the
path of its own name a manifest that lists them (MANIFEST_HEADER). A table split across ranks
(alltoall.py) writes its rank's part beside each rank's checkpoint, and a manifest that lists
every rank's part by its whole path. Restoring reads the manifest
and keeps each shard's ids (TfExtTableRestoreCheckpoint's num_shards and shard_index), so a
checkpoint restores into any number of shards, and a plain table and a sharded one of the same
name restore from each other's checkpoints (their tensors in the index are named alike).
"""

import contextlib
import hashlib
import weakref

import tensorflow as tf
from tensorflow.python.framework import ops
from tensorflow.python.saved_model import registration
from tensorflow.python.trackable import autotrackable, resource
from tensorflow.python.training.saving import saveable_object

from tf_ext import _ops_loader

SAVER_PACKAGE, SAVER_NAME = "tf_ext", "DynamicEmbeddingTable"
# A tf.train.Checkpoint of tf_ext 0.1 named a table's tensors <object>/.ATTRIBUTES/<suffix>.
_LEGACY_ATTRIBUTES = "/.ATTRIBUTES/"
# The tensor each table adds to a checkpoint's index: its row count (the rows are in its file).
_ROWS_TENSOR = ".TF_EXT_TABLE_ROWS"
# The first line of a sharded table's manifest: kShardManifestHeader in
# kernels/dynamic_embedding/core/sharding.h, which parses it.
MANIFEST_HEADER = "tf_ext sharded table 1\n"
# Set (True) on a table that a group of tables saves with its own registered saver (a
# tf_ext.tfra Variable saved with FileSystemSaver, tfra/file_system.py): this saver leaves it out.
SAVED_WITH_GROUP = "_tf_ext_saved_with_group"


def snapshot_suffix(name):
  """The suffix that names a table's snapshot file after a checkpoint prefix."""
  digest = hashlib.sha256(name.encode("utf-8")).hexdigest()
  return f".data-t{digest[:4]}-of-{digest[4:9]}"


def _save(handle, path):
  """Streams the table of `handle` into `path` (a full snapshot that starts no delta tracking)."""
  with _colocated(handle):
    return _ops_loader.load().tf_ext_table_save_snapshot(
      handle,
      path,
      since_version=tf.constant(-1, tf.int64),
      chain_id=tf.constant(0, tf.int64),
      sequence=tf.constant(0, tf.int64),
      step=tf.constant(0, tf.int64),
      track=False,
    )


def _restore(
  handle, path, prefix, legacy_tensor_prefix, num_shards=1, shard_index=0, verify_only=False
):
  with _colocated(handle):
    return _ops_loader.load().tf_ext_table_restore_checkpoint(
      handle,
      path,
      prefix,
      legacy_tensor_prefix,
      num_shards=num_shards,
      shard_index=shard_index,
      verify_only=verify_only,
    )


def warm_start_tables(tables_and_saved_names, checkpoint_prefix):
  """Restores each table of `tables_and_saved_names` ([(table, name of the table saved)], plain
  or sharded) from the tf.compat.v1.train.Saver checkpoint at `checkpoint_prefix`. Every file is
  checked in full before the first table changes, as a Saver restore does. Returns the op
  (eagerly, after running it)."""
  prefix = tf.convert_to_tensor(checkpoint_prefix, tf.string)

  def load(table, saved_name, verify_only):
    path = tf.strings.join([prefix, snapshot_suffix(saved_name)])
    legacy = f"{saved_name}-"
    return tf.group(
      _restore(
        table.resource_handle, path, prefix, legacy, *kept_part_of(table), verify_only=verify_only
      )
    )

  checks = [load(table, saved, True) for table, saved in tables_and_saved_names]
  with tf.control_dependencies(checks):
    return tf.group([load(table, saved, False) for table, saved in tables_and_saved_names])


def saver_list_saveables(table, graph, saveable_class):
  """A table's `_gather_saveables_for_checkpoint`: what tf.compat.v1.train.Saver(var_list=[table,
  ...]) saves, the saveable the Saver's default list holds (under the table's name), in the TF1
  graph the table lives in; nothing elsewhere (tf.train.Checkpoint and SavedModel use the
  registered saver)."""
  if graph is None or ops.get_default_graph() is not graph:
    return {}
  return {"table": lambda name=None: saveable_class(table, table.name)}


def _manifest(suffixes):
  return MANIFEST_HEADER + f"{len(suffixes)}\n" + "".join(f"{s}\n" for s in suffixes)


def _save_sharded(shards, name, prefix):
  """Streams each shard to `prefix` + its suffix, then writes the manifest; returns each shard's
  (rows, slot_initial_values) after the manifest is written."""
  suffixes = [snapshot_suffix(f"{name}/part_{i}") for i in range(len(shards))]
  saved = [
    _save(_handle(shard), tf.strings.join([prefix, suffix]))
    for shard, suffix in zip(shards, suffixes)
  ]
  with tf.control_dependencies([out[1] for out in saved]):
    written = tf.io.write_file(
      tf.strings.join([prefix, snapshot_suffix(name)]), tf.constant(_manifest(suffixes))
    )
  with tf.control_dependencies([written]):
    return [(tf.identity(out[1]), tf.identity(out[4])) for out in saved]


def _save_split(table, name, prefix):
  """Streams this rank's part of a table split across ranks (alltoall.py) beside the checkpoint
  at `prefix`, then writes the manifest of every rank's part; returns (rows,
  slot_initial_values) after the manifest is written."""
  part_path, manifest = table.checkpoint_files(prefix, name)
  saved = _save(_handle(table), part_path)
  with tf.control_dependencies([saved[1]]):
    written = tf.io.write_file(tf.strings.join([prefix, snapshot_suffix(name)]), manifest)
  with tf.control_dependencies([written]):
    return tf.identity(saved[1]), tf.identity(saved[4])


def _restore_sharded(shards, path, prefix, legacy_tensor_prefix, verify_only=False):
  return tf.group(
    *(
      _restore(_handle(shard), path, prefix, legacy_tensor_prefix, len(shards), index, verify_only)
      for index, shard in enumerate(shards)
    )
  )


def _shards_of(obj):
  """The shards of a sharded table (sharded.py), also of one that tf.saved_model.load restored
  without tf_ext's classes (an object whose children part_0, part_1, ... are restored tables);
  None for anything else."""
  if getattr(type(obj), "_TF_EXT_SHARDED", False):
    return obj.shards
  if not isinstance(obj, autotrackable.AutoTrackable) or isinstance(obj, resource.RestoredResource):
    return None
  shards = []
  while _restored_table(vars(obj).get(f"part_{len(shards)}")):
    shards.append(vars(obj)[f"part_{len(shards)}"])
  return shards or None


def _colocated(handle):
  return contextlib.nullcontext() if tf.executing_eagerly() else ops.colocate_with(handle)


# ---- tf.compat.v1.train.Saver ---------------------------------------------------------------


def _saver_prefix():
  """The checkpoint prefix tensor of the Saver being built.

  A SaveableObject's tensors are created while tf.compat.v1.train.Saver builds its save ops, under
  the Saver's name scope, whose "Const" tensor is the prefix the save is fed (saver.py keeps that
  name for compatibility). Fails clearly if a Saver builds its ops some other way.
  """
  graph = ops.get_default_graph()
  parts = graph.get_name_scope().split("/")
  for end in range(len(parts), 0, -1):
    try:
      tensor = graph.get_tensor_by_name("/".join(parts[:end]) + "/Const:0")
    except KeyError:
      continue
    if tensor.dtype == tf.string and tensor.op.type == "PlaceholderWithDefault":
      return tensor
  raise ValueError(
    "tf_ext: a dynamic embedding table can be saved by tf.compat.v1.train.Saver's own save ops "
    f"only (no checkpoint prefix found under name scope {graph.get_name_scope()!r})"
  )


def _restore_beside(restored_tensors, suffix, load):
  """A Saver restore of a table from its file beside the checkpoint: load(path, prefix,
  verify_only), run once RestoreV2 has read the table's first tensor
  (`<name>-slot_initial_values`), whose prefix input is the checkpoint's.

  The restore is atomic across the Saver's tables: every table's files are checked in full
  (load(..., verify_only=True)) before the first table changes."""
  slot_initial_values = restored_tensors[0]
  prefix = slot_initial_values.op.inputs[0]  # RestoreV2's prefix
  with tf.control_dependencies([slot_initial_values]):
    path = tf.strings.join([prefix, suffix])
    check = tf.group(load(path, prefix, True))
  checks, gates = _saver_restore_group(prefix)
  # The Saver builds its tables' restores one after another: each restore waits on a gate, and
  # the gates built so far get this table's check too (a control edge added to an existing op,
  # as TensorFlow's own graph building does).
  for gate in gates:
    gate._add_control_input(check)  # pylint: disable=protected-access
  checks.append(check)
  with tf.control_dependencies(checks):
    gate = tf.no_op(name="after_every_table_check")
  gates.append(gate)
  with tf.control_dependencies([gate]):
    return tf.group(load(path, prefix, False))


_SAVER_RESTORE_GROUPS = weakref.WeakKeyDictionary()  # graph -> {prefix tensor name: group}


def _saver_restore_group(prefix):
  """(checks, gates) of the tables one Saver restores: those whose RestoreV2 reads the same
  prefix tensor (one per Saver, shared by a sharded Saver's per-device restores)."""
  groups = _SAVER_RESTORE_GROUPS.setdefault(prefix.graph, {})
  return groups.setdefault(prefix.name, ([], []))


class TableSaveable(saveable_object.SaveableObject):
  """Lets tf.compat.v1.train.Saver (and so Estimator, MonitoredTrainingSession) save a table.

  Its one tensor in the checkpoint is `<table name>-slot_initial_values` (as in tf_ext 0.1, so
  0.1 checkpoints restore through the same spec); computing it streams the table into its file.
  The saveable itself is named after the table's resource op: an exported meta graph lists the
  SAVEABLE_OBJECTS collection by name, and importing it (SavedModel loaders) looks each name up
  as an operation.
  """

  def __init__(self, table, name):
    self._table = table
    self._suffix = snapshot_suffix(name)
    self._legacy_prefix = f"{name}-"

    def save_table():
      if hasattr(table, "checkpoint_files"):  # split across ranks
        return _save_split(table, name, _saver_prefix())[1]
      path = tf.strings.join([_saver_prefix(), self._suffix])
      return _save(table.resource_handle, path)[4]  # slot_initial_values

    spec = saveable_object.SaveSpec(
      save_table, "", f"{name}-slot_initial_values", dtype=tf.float32, device=table.device
    )
    super().__init__(table, [spec], table.resource_handle.op.name)

  def restore(self, restored_tensors, restored_shapes):
    del restored_shapes
    return _restore_beside(
      restored_tensors,
      self._suffix,
      lambda path, prefix, verify_only: _restore(
        self._table.resource_handle,
        path,
        prefix,
        self._legacy_prefix,
        *kept_part_of(self._table),
        verify_only=verify_only,
      ),
    )


class ShardedTableSaveable(saveable_object.SaveableObject):
  """TableSaveable for a sharded table: its one tensor is named as a plain table's (so either
  restores the other's checkpoint); computing it streams every shard into its file, on the
  shard's device, and writes the manifest."""

  def __init__(self, sharded, name):
    self._shards = sharded.shards
    self._suffix = snapshot_suffix(name)
    self._legacy_prefix = f"{name}-"

    def save_table():
      return _save_sharded(self._shards, name, _saver_prefix())[0][1]

    first = self._shards[0]
    spec = saveable_object.SaveSpec(
      save_table, "", f"{name}-slot_initial_values", dtype=tf.float32, device=first.device
    )
    # The gradient anchor of the plain table of this name (always 0): the shards' anchors are
    # not saved (their number varies), and a plain table restored from this checkpoint needs it.
    with ops.device(first.device):
      anchor = saveable_object.SaveSpec(tf.constant(0.0), "", f"{name}/gradient_anchor")
    super().__init__(sharded, [spec, anchor], first.resource_handle.op.name)

  def restore(self, restored_tensors, restored_shapes):
    del restored_shapes
    return _restore_beside(
      restored_tensors,
      self._suffix,
      lambda path, prefix, verify_only: _restore_sharded(
        self._shards, path, prefix, self._legacy_prefix, verify_only
      ),
    )


# ---- groups of tables that another module saves (tfra/file_system.py) --------------------------


def save_group(tables, name, prefix):
  """Streams each of `tables` beside the checkpoint at `prefix` as a sharded table's shards
  (`<name>/part_<i>`), then the manifest `name`; [(rows, slot_initial_values)] of each table once
  the manifest is written."""
  return _save_sharded(tables, name, prefix)


def restore_snapshot(table, path, prefix, verify_only=False):
  """The op that replaces `table`'s content with the snapshot (or every file of the manifest) at
  `path` of the checkpoint at `prefix`, whole; with verify_only, checks the files in full and
  changes nothing."""
  return _restore(_handle(table), path, prefix, "", verify_only=verify_only)


def saver_prefix():
  """The checkpoint prefix tensor of the tf.compat.v1.train.Saver being built (_saver_prefix)."""
  return _saver_prefix()


def restore_beside(restored_tensors, suffix, load):
  """A Saver restore of tables from files beside the checkpoint (see _restore_beside)."""
  return _restore_beside(restored_tensors, suffix, load)


# ---- tf.train.Checkpoint and SavedModel: a registered saver ------------------------------------


def _handle(table):
  """The resource handle the saver captures for a table (or a SavedModel's restored table).

  SavedModel export traces the saver with shallow copies of the tables, whose handles live in
  the export graph, but maps only the originals' handles into that graph: use the original's.
  """
  original = getattr(table, "_original", None)
  return (original() or table).resource_handle if original else table.resource_handle


def write_index_shard(trackables, file_prefix, saver_name, save_one):
  """The body of a registered saver's save_fn: save_one(object_name, obj, final_prefix) streams
  each object beside the final checkpoint and returns its number of rows; those are the small
  index shard written at `file_prefix` (saver_name: the registered saver's name)."""
  # What TensorFlow appends to the checkpoint prefix for a registered saver's own files.
  registered_suffix = f"-{SAVER_PACKAGE}.{saver_name}"
  final_prefix = tf.strings.substr(
    file_prefix, 0, tf.strings.length(file_prefix) - len(registered_suffix)
  )
  names, rows = [], []
  for object_name, obj in sorted(trackables.items()):
    names.append(f"{object_name}/{_ROWS_TENSOR}")
    rows.append(save_one(object_name, obj, final_prefix))
  with ops.device("CPU"):
    written = tf.raw_ops.SaveV2(
      prefix=file_prefix, tensor_names=names, shape_and_slices=[""] * len(names), tensors=rows
    )
    with tf.control_dependencies([written]):
      return [tf.identity(file_prefix)]


def restore_verified(trackables, merged_prefix, restore_one, what):
  """The body of a registered saver's restore_fn: restore_one(object_name, obj, merged_prefix,
  verify_only) checks every object's files in full first (missing, corrupt, of another key type
  or dim), so a bad file changes nothing; then restores each. `what` names them in the error of
  a TF1 graph."""
  # TensorFlow drops what a registered restore function returns: its ops run only eagerly or
  # inside a tf.function (automatic control dependencies), never in a TF1 graph.
  if not tf.executing_eagerly() and not ops.get_default_graph().building_function:
    raise ValueError(
      f"{what} in a TF1 graph; use tf.compat.v1.train.Saver there (or restore eagerly)"
    )
  items = sorted(trackables.items())
  verified = [restore_one(*item, merged_prefix, True) for item in items]
  with tf.control_dependencies(verified):
    for item in items:
      restore_one(*item, merged_prefix, False)


def _save_table_beside(object_name, table, final_prefix):
  if _shards_of(table):
    saved = _save_sharded(_shards_of(table), object_name, final_prefix)
    return tf.add_n([shard_rows for shard_rows, _ in saved])
  if hasattr(table, "checkpoint_files"):  # split across ranks
    return _save_split(table, object_name, final_prefix)[0]
  path = tf.strings.join([final_prefix, snapshot_suffix(object_name)])
  return _save(_handle(table), path)[1]


def _save_tables(trackables, file_prefix):
  """Streams each table to its file beside the final checkpoint; returns a small index shard."""
  return write_index_shard(trackables, file_prefix, SAVER_NAME, _save_table_beside)


def _restore_tables(trackables, merged_prefix):
  restore_verified(
    trackables,
    merged_prefix,
    _restore_table,
    "tf_ext: tf.train.Checkpoint cannot restore dynamic embedding tables",
  )


def _restore_table(object_name, table, merged_prefix, verify_only):
  # A 0.1 checkpoint names the table by the first of its tensors' keys.
  legacy = ""
  if _LEGACY_ATTRIBUTES in object_name:
    legacy = object_name[: object_name.index(_LEGACY_ATTRIBUTES) + len(_LEGACY_ATTRIBUTES)]
  path = tf.strings.join([merged_prefix, snapshot_suffix(object_name)])
  if _shards_of(table):
    return _restore_sharded(_shards_of(table), path, merged_prefix, legacy, verify_only)
  return _restore(
    _handle(table), path, merged_prefix, legacy, *kept_part_of(table), verify_only=verify_only
  )


def kept_part_of(table):
  """(num_shards, shard_index): the ids a restore of `table` keeps (a table split across ranks
  keeps its own, so it restores from a plain table's checkpoint too); (1, 0), all, by default."""
  kept_part = getattr(table, "kept_part", None)
  return kept_part() if kept_part else (1, 0)


def _restored_table(obj):
  """Whether `obj` is a table that tf.saved_model.load restored without tf_ext's class: a
  RestoredResource whose creator function makes a TfExtDynamicTable."""
  if not isinstance(obj, resource.RestoredResource):
    return False
  creator = getattr(obj, "_create_resource", None)
  for function in getattr(creator, "concrete_functions", None) or ():
    if any(op.type == "TfExtDynamicTable" for op in function.graph.get_operations()):
      return True
  return False


def register(table_class):
  """Registers the saver of tables for tf.train.Checkpoint and SavedModel."""
  registration.register_checkpoint_saver(
    package=SAVER_PACKAGE,
    name=SAVER_NAME,
    # A sharded table is saved whole (shards and manifest), its shards not again on their own.
    predicate=lambda obj: (
      (
        isinstance(obj, table_class)
        and not getattr(obj, "_tf_ext_shard_of", None)
        and not getattr(obj, SAVED_WITH_GROUP, False)
      )
      or _shards_of(obj) is not None
      or _restored_table(obj)
    ),
    save_fn=_save_tables,
    restore_fn=_restore_tables,
  )
