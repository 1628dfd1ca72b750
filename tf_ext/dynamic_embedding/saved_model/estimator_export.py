"""export_estimator_for_serving: an Estimator's SavedModel of core TensorFlow ops only."""

import os
import shutil
import tempfile

import tensorflow as tf

from tf_ext.dynamic_embedding import checkpoint, live_tables
from tf_ext.dynamic_embedding import variable as variable_lib
from tf_ext.dynamic_embedding.saved_model.saved_model_files import (
  check_core_only,
  fill_saved_tables,
  merge_into,
  write_rows,
)
from tf_ext.dynamic_embedding.saved_model.serving_table import ServingTable, default_row

_ESTIMATOR_OWNER = "tf_ext.saved_model.export_estimator_for_serving"


_OBJECT_GRAPH_TENSOR = "_CHECKPOINTABLE_OBJECT_GRAPH"


class _ServingTablesByName:
  """Tables created while an Estimator export builds its graph (by name): a
  ServingTable per table name (created once per graph), filled by the checkpoint restore."""

  def __init__(self, specs):
    self._specs = specs  # name -> (dim, key_dtype, default row, num_shards)
    self._made = {}

  def get(self, key):
    if not isinstance(key, str) or key not in self._specs:
      return None
    graph_key = (tf.compat.v1.get_default_graph(), key)
    if graph_key not in self._made:
      with tf.compat.v1.name_scope(None):
        self._made[graph_key] = ServingTable(key, *self._specs[key])
    return self._made[graph_key]


def _export_with_trained_tables(estimator, serving_input_receiver_fn, checkpoint_path, export):
  """Restores the tables the Estimator's PREDICT graph uses (a sharded table whole) from
  `checkpoint_path`, calls `export`({name: (dim, key_dtype, default row, num_shards)}), which
  writes a SavedModel of empty core tables `<name>` and returns its folder, and streams the
  tables' rows into it (`<name>-keys`, `<name>-values`, see write_rows). Returns the folder."""
  with tf.Graph().as_default() as graph:
    receiver = serving_input_receiver_fn()
    estimator._call_model_fn(  # pylint: disable=protected-access
      receiver.features, None, tf.estimator.ModeKeys.PREDICT, estimator.config
    )
    # A table built in a graph is shared there by its name, so names identify tables; the
    # shards of a sharded table (named <table>/part_<i>) are gathered under the table's name.
    shards_by_name = {}
    for table in live_tables.tables(graph):
      shards_by_name.setdefault(getattr(table, "_tf_ext_shard_of", None) or table.name, []).append(
        table
      )
    saveables = [
      s
      for s in tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS)
      if isinstance(s, (checkpoint.TableSaveable, checkpoint.ShardedTableSaveable))
    ]
    saver = tf.compat.v1.train.Saver(var_list=saveables) if saveables else None
  specs = {}
  for name, shards in shards_by_name.items():
    num_shards = len(shards) if hasattr(shards[0], "_tf_ext_shard_of") else None
    first = shards[0]
    specs[name] = (first.dim, first.key_dtype, default_row(first), num_shards)
  # The session stays open (the restored tables in it) while export runs eagerly, outside the
  # graph; the rows are written in the graph, merged into the export eagerly.
  session = tf.compat.v1.Session(graph=graph)
  try:
    if saver:
      with graph.as_default():
        saver.restore(session, checkpoint_path)
    export_dir = export(specs)
    # Staged beside the variables: merging moves the bundles' files (a rename).
    staging = tempfile.mkdtemp(prefix=".tf_ext_rows_", dir=os.path.join(export_dir, "variables"))
    try:
      names, prefixes = [], []
      with graph.as_default():
        for index, (name, shards) in enumerate(sorted(shards_by_name.items())):
          names += [f"{name}-keys", f"{name}-values"]
          bundle = os.path.join(staging, f"table_{index}")
          prefixes += write_rows(shards, *names[-2:], bundle, session.run)[1]
      fill_saved_tables(export_dir, names, prefixes, staging, _ESTIMATOR_OWNER)
    finally:
      shutil.rmtree(staging, ignore_errors=True)
  finally:
    session.close()
  return export_dir


def _write_converted_checkpoint(checkpoint_path, specs, prefix, scratch):
  """A checkpoint holding the original's dense tensors and each table as MutableHashTable's
  saveable reads it (`<name>-keys`, `<name>-values`), empty: an export restores and saves the
  core tables whole, so their rows are streamed into the export afterwards."""
  names, tensors = [], []
  for name, (dim, key_dtype, *_) in sorted(specs.items()):
    names += [f"{name}-keys", f"{name}-values"]
    tensors += [tf.zeros([0], key_dtype), tf.zeros([0, dim], tf.float32)]
  empty_tables = os.path.join(scratch, "empty_tables")
  with tf.device("CPU"):
    tf.raw_ops.SaveV2(
      prefix=empty_tables, tensor_names=names, shape_and_slices=[""] * len(names), tensors=tensors
    )
  skip = [f"{name}-slot_initial_values" for name in specs] + [_OBJECT_GRAPH_TENSOR]
  merge_into(prefix, checkpoint_path, skip, [empty_tables], scratch)


def export_estimator_for_serving(
  estimator,
  export_dir_base,
  serving_input_receiver_fn,
  checkpoint_path=None,
  assets_extra=None,
  as_text=False,
):
  """As `estimator.export_saved_model(...)`, but a SavedModel of core TensorFlow ops only.

  The model_fn's dynamic embedding tables (made by tf_ext's columns, tf_ext.dynamic_embedding
  or get_dynamic_embedding_variable) become core lookup tables holding the rows of
  `checkpoint_path` (default: the latest checkpoint); see the module doc for ids without a row.
  Returns the export's directory (bytes, as Estimator does).
  """
  if not tf.executing_eagerly():
    raise RuntimeError(f"{_ESTIMATOR_OWNER} runs eagerly (TF2), outside any graph")
  checkpoint_path = checkpoint_path or estimator.latest_checkpoint()
  if not checkpoint_path:
    raise ValueError(
      f"{_ESTIMATOR_OWNER}: no checkpoint in {estimator.model_dir}; train the Estimator first "
      "or pass checkpoint_path="
    )
  with tempfile.TemporaryDirectory(prefix="tf_ext_serving_") as scratch:
    converted = os.path.join(scratch, "serving")

    def export(specs):
      _write_converted_checkpoint(checkpoint_path, specs, converted, scratch)
      with variable_lib.served_by(_ServingTablesByName(specs)):
        return estimator.export_saved_model(
          export_dir_base,
          serving_input_receiver_fn,
          assets_extra=assets_extra,
          as_text=as_text,
          checkpoint_path=converted,
        ).decode()

    export_dir = _export_with_trained_tables(
      estimator, serving_input_receiver_fn, checkpoint_path, export
    )
  check_core_only(export_dir, _ESTIMATOR_OWNER)
  return export_dir.encode()
