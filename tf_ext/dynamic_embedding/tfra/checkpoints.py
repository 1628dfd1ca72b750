"""TFRA 0.7.2 checkpoints, read without TFRA, restored into tf_ext.tfra Variables.

`restore_from_tfra(path, variables, optimizer)` fills the Variables' tf_ext tables from a checkpoint
that TFRA wrote: their rows, and the optimizer's slots, which TFRA keeps as Variables of their own
and tf_ext inside each row's table entry. The tables are streamed in chunks into tf_ext snapshot
files (snapshot_file.cc's format) in a temporary directory, then restored by the table's own
restore op, which replaces a table only once its file was read whole: a truncated or corrupt TFRA
file is a DataLossError naming it, and leaves every table as it was.

How TFRA names a table (one per device of a Variable, and one per slot Variable):
  table             `<variable name, "/" as "_">_mht_<i>of<n>` (i from 1)
  slot Variable     `<variable name>/<scope>/<slot>`: scope is the TF1 optimizer's name ("Adam"),
                    or for Keras optimizers the trainable's name (a ShadowVariable's,
                    "DynamicEmbedding/<layer>-shadow" in a Keras layer); slot "m", "v", "vhat",
                    "accumulator", "momentum", "linear" (TF1 FTRL: "accum")
  tf.compat.v1.train.Saver   `<op scope>/<table>-keys` [n] and `<op scope>/<table>-values` [n, dim]
  object-based (tf.train.Checkpoint, Keras save_weights, SavedModel variables/)
                    `<object path>/tables_of_<variable name>/<i-1>/.ATTRIBUTES/table-keys|-values`;
                    slot Variables are the optimizer's children, named by their full name
  FileSystemSaver   files `<table>_rank<r>_size<s>-keys|-values` (raw little-endian keys and
                    rows); a checkpoint then holds `.../table-shard_upsert_restore` instead, and
                    the files are in `TFRADynamicEmbedding-<step>/` beside it (a SavedModel's in
                    `variables/TFRADynamicEmbedding/`)

What restores exactly: keys, rows (any row dtype a tf_ext.tfra Variable holds: float16 and
bfloat16 widened to float32, int32, int64 and float64 rows as their bits; int32 keys as int64) and
the slots of the optimizer (Adam m and v, AMSGrad vhat, Adagrad accumulator, TF1 momentum, Keras
SGD momentum, FTRL accumulator and linear) into tf_ext's slot layout (optimizers.h: the slots in
that order). TFRA bias-corrects every Adam row at the optimizer's global step t (TF1 `beta1_power`
and `beta2_power`, or Keras' `iterations`): a Keras optimizer passed in gets `iterations` = t, and
every row gets update count t (the steps the optimizer took: log(beta1_power) / log(beta1) - 1, or
`iterations`), so that the next step of every row is TFRA's next step whether tf_ext corrects by
the optimizer's step (its default) or by the row's own count. A TF1 program's global step comes
back with its Saver. A row's last step is t - 1 (TFRA keeps none). A key with a row
but no slot row gets the slot's initial value, as TFRA would read it; a slot row without a row is
dropped. Not restored here: dense variables (restore them with TensorFlow's savers, or convert the
checkpoint with convert.py, which keeps them), TFRA's restrict-policy status tables, and
FileSystemSaver files of string keys (their layout is not read). Key/value files keep no
step count: pass update_count= for Adam.

The parts it restores with: TFRA's files read in tensor_bundle.py (TensorFlow's bundle, crc32c.py
its checksum) and checkpoint_tables.py (the tables in them), the optimizers' slots and step count
in checkpoint_slots.py, tf_ext's snapshot files written in snapshot_writer.py and
snapshot_streaming.py.
"""

import os
import shutil
import tempfile

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import variable_scope

from tf_ext import _ops_loader
from tf_ext.dynamic_embedding import checkpoint as table_checkpoint
from tf_ext.dynamic_embedding.tfra import variable as variable_lib
from tf_ext.dynamic_embedding.tfra.checkpoint_slots import optimizer_slots, step_count
from tf_ext.dynamic_embedding.tfra.checkpoint_tables import KeyValueFiles as KeyValueFiles
from tf_ext.dynamic_embedding.tfra.checkpoint_tables import Shard as Shard
from tf_ext.dynamic_embedding.tfra.checkpoint_tables import TableGroup, TfraCheckpoint
from tf_ext.dynamic_embedding.tfra.checkpoint_tables import flat_name as flat_name
from tf_ext.dynamic_embedding.tfra.checkpoint_tables import (
  unescape_local_name as unescape_local_name,
)
from tf_ext.dynamic_embedding.tfra.crc32c import crc32c_extend, standard_crc32c
from tf_ext.dynamic_embedding.tfra.snapshot_streaming import (
  CHUNK_ROWS,
  row_encoder,
  write_snapshots,
)
from tf_ext.dynamic_embedding.tfra.snapshot_writer import SnapshotWriter
from tf_ext.dynamic_embedding.tfra.tensor_bundle import Bundle as Bundle
from tf_ext.dynamic_embedding.tfra.tensor_bundle import data_loss

__all__ = [
  "SnapshotWriter",
  "TableGroup",
  "TfraCheckpoint",
  "crc32c_extend",
  "standard_crc32c",
  "optimizer_slots",
  "restore_from_tfra",
  "step_count",
]


def _router(variable, session):
  """keys -> the shard of each, by the Variable's partitioner."""
  if variable.shard_num == 1:
    return lambda keys: np.zeros(len(keys), np.int32)
  dtype = tf.string if variable.key_dtype == tf.string else tf.int64
  if tf.executing_eagerly():
    return lambda keys: variable.partition(tf.constant(keys, dtype)).numpy()
  with tf.name_scope("restore_from_tfra"):
    placeholder = tf.compat.v1.placeholder(dtype, [None])
    parts = variable.partition(placeholder)
  return lambda keys: session.run(parts, {placeholder: keys})


def _variables_of_store():
  store = variable_scope._get_default_variable_store()._vars  # noqa: SLF001 (TF's variable store)
  return [v for v in store.values() if isinstance(v, variable_lib.Variable)]


def _restore_op(table, path, verify_only):
  with table.colocated():
    return _ops_loader.load().tf_ext_table_restore_snapshots(
      table.resource_handle, [path], track=False, verify_only=verify_only
    )


def restore_from_tfra(
  checkpoint_path,
  variables=None,
  optimizer=None,
  update_count=None,
  session=None,
  key_dtype=None,
  chunk_rows=CHUNK_ROWS,
):
  """Fills tf_ext.tfra Variables from a checkpoint that TFRA wrote; needs no TFRA.

  checkpoint_path: a checkpoint prefix (tf.compat.v1.train.Saver, tf.train.Checkpoint, Keras
    save_weights), a checkpoint directory (its latest), a SavedModel directory, or a directory of
    FileSystemSaver files (also found beside a checkpoint saved with FileSystemSaver).
  variables: the de.Variables to fill, each from the TFRA Variable of its name (its tables are
    routed to this Variable's shards by its partitioner, whatever TFRA's count was); None: every
    Variable of de.get_variable and the Keras layers (TF's variable store) that the checkpoint
    holds.
  optimizer: the optimizer the program trains with (TF1, Keras or legacy Keras; wrapped or not):
    its slots are restored, in tf_ext's order, and its initial accumulator fills missing slot rows.
    None: the slots the checkpoint holds, by their names.
  update_count: every row's update count, and a Keras `optimizer`'s `iterations`; default: TFRA's
    step count (`step_count`), so that the next Adam step is TFRA's (tf_ext bias-corrects every
    row by the optimizer's step, as TFRA does, or by the row's own count: either is then TFRA's).
  session: in a TF1 graph, the session to run the restore in (default: the default session);
    the tables must exist in it (run their initializers first).
  key_dtype: the key dtype of FileSystemSaver files (they do not say); default each Variable's.

  Returns {variable name: {"rows", "slots" (TFRA slot names), "update_count",
  "missing_slot_rows", "dropped_slot_rows"}}. Raises DataLossError (naming the file) for a
  truncated or corrupt checkpoint, NotFoundError for a Variable it does not hold; either way no
  table changes. Every table is read into a snapshot file in a temporary directory first, then
  all are checked, then restored.
  """
  eager = tf.executing_eagerly()
  if not eager:
    session = session or tf.compat.v1.get_default_session()
    if session is None:
      raise ValueError(
        "tf_ext.tfra: restore_from_tfra in a TF1 graph needs session= (or a default session)"
      )
  if variables is None:
    variables = _variables_of_store()
  variables = list(variables)
  guessed_keys = key_dtype or (variables[0].key_dtype if variables else tf.int64)
  stored_keys = tf.int64 if tf.as_dtype(guessed_keys) == tf.int32 else guessed_keys
  values = variables[0].value_dtype if variables else tf.float32
  checkpoint = TfraCheckpoint(checkpoint_path, key_dtype=stored_keys, value_dtype=values)
  plan = []
  primaries = []
  for variable in variables:
    group = checkpoint.group_of(variable.name)
    if group is None:
      raise tf.errors.NotFoundError(
        None,
        None,
        f"TFRA checkpoint '{checkpoint_path}' holds no Variable '{variable.name}' "
        f"(it holds {sorted(g.name for g in checkpoint.variables())})",
      )
    if group.dim != variable.dim and group.source == "files":
      files = [v for shard in group.shards for _, v in shard.files]
      raise data_loss(
        files[0] if len(files) == 1 else os.path.dirname(files[0]),
        f"truncated or corrupt: its rows are not rows of dim {variable.dim} ('{variable.name}')",
      )
    if group.dim != variable.dim:
      raise ValueError(
        f"tf_ext.tfra Variable '{variable.name}' has dim {variable.dim}, the TFRA checkpoint's "
        f"has dim {group.dim}"
      )
    primaries.append(group)
    plan.append((variable, group))
  steps = step_count(checkpoint, optimizer) if update_count is None else int(update_count)
  results = {}
  directory = tempfile.mkdtemp(prefix="tf_ext_tfra_restore_")
  try:
    restores = []
    for variable, group in plan:
      kind, slots, initial = optimizer_slots(checkpoint, variable.name, optimizer, primaries)
      stored_dim, encode = row_encoder(variable.value_dtype, variable.dim)
      if stored_dim != variable.dim and any(slots):
        # Rows held as bits are never trained in tf_ext: they take no slots.
        kind, slots, initial = "sgd", [], []
      writers = []
      for index, table in enumerate(variable.tables):
        writers.append(
          SnapshotWriter(
            os.path.join(directory, f"{len(restores)}_{index}.snapshot"),
            table.name,
            table.key_dtype,
            stored_dim,
            initial,
            step=steps,
            initializer_version=table.initializer_spec.version,
          )
        )
      try:
        stats = write_snapshots(
          checkpoint,
          group,
          slots,
          initial,
          writers,
          _router(variable, session),
          steps,
          chunk_rows,
          encode=encode,
        )
        for writer in writers:
          writer.finish()
      finally:
        for writer in writers:
          writer.close()
      restores.extend((table, writer.path) for table, writer in zip(variable.tables, writers))
      results[variable.name] = {
        "rows": stats["rows"],
        "slots": [s.name if s is not None else None for s in slots],
        "kind": kind,
        "update_count": steps,
        "missing_slot_rows": stats["missing_slot_rows"],
        "dropped_slot_rows": stats["dropped_slot_rows"],
      }
    # Every file checked before the first table changes.
    if eager:
      for table, path in restores:
        _restore_op(table, path, True)
      for table, path in restores:
        _restore_op(table, path, False)
    else:
      checks = [_restore_op(table, path, True) for table, path in restores]
      session.run(checks)
      session.run([_restore_op(table, path, False) for table, path in restores])
    _restore_keras_step(optimizer, steps, session)
  finally:
    shutil.rmtree(directory, ignore_errors=True)
  return results


def _restore_keras_step(optimizer, steps, session):
  """Sets a Keras optimizer's `iterations` to TFRA's step count: tf_ext's table updates
  bias-correct every row by it (DynamicEmbeddingOptimizer's bias_correction_step), as TFRA's."""
  iterations = getattr(optimizer, "iterations", None)
  if iterations is None or isinstance(optimizer, tf.compat.v1.train.Optimizer):
    return
  assign = iterations.assign(steps)
  if session is not None and not tf.executing_eagerly():
    session.run(assign)


def describe(checkpoint_path):
  """A JSON-able summary of a TFRA checkpoint: its Variables, their shards, rows and slots."""
  checkpoint = TfraCheckpoint(checkpoint_path)
  out = {"path": checkpoint.path, "kind": checkpoint.kind, "variables": {}}
  for group in checkpoint.variables():
    scopes = checkpoint.slot_groups(group.name)
    out["variables"][group.name] = {
      "shards": len(group.shards),
      "rows": group.rows,
      "dim": group.dim,
      "slots": {scope: sorted(slots) for scope, slots in scopes.items()},
    }
  return out


# The table snapshots' file names beside a tf_ext checkpoint prefix (checkpoint.py).
snapshot_suffix = table_checkpoint.snapshot_suffix
