"""What a serving export writes into a SavedModel's files, and checks in them: the tables' rows
streamed into its variables (a chunk at a time, as slices of each core table's `-keys` and
`-values` tensors, merged with the variables saved besides), and that its graphs hold no tf_ext
op."""

import os
import shutil
import tempfile

import tensorflow as tf
from google.protobuf import text_format
from tensorflow.core.protobuf import saved_model_pb2

from tf_ext import _ops_loader, settings

OWNER = "tf_ext.saved_model.export_for_serving"


def _shards(table):
  return list(getattr(table, "shards", None) or [table])


def streams(table):
  """Whether the rows of `table` can be streamed: int64 ids (RestoreV2 reads no sliced string
  tensor) in host memory (the op walks host tables)."""
  return table.key_dtype == tf.int64 and "GPU" not in _shards(table)[0].device.upper()


def write_rows(shards, keys_name, values_name, prefix, run):
  """Writes the rows of a table (its `shards`, in order) as `keys_name` and `values_name` into
  bundles `prefix`_<shard>; returns (rows, the bundles' prefixes). `run` evaluates tensors and
  ops (eagerly: their values; in a graph: Session.run)."""
  if not streams(shards[0]):  # whole, as the export did before streaming
    exports = [shard.export() for shard in shards]
    keys = tf.concat([keys for keys, _ in exports], 0)
    values = tf.concat([values for _, values in exports], 0)
    with tf.device("CPU"):
      save = tf.raw_ops.SaveV2(
        prefix=prefix,
        tensor_names=[keys_name, values_name],
        shape_and_slices=["", ""],
        tensors=[keys, values],
      )
    _, rows = run([save, tf.shape(keys)[0]])
    return int(rows), [prefix]
  sizes = [int(size) for size in run([shard.size() for shard in shards])]
  # One table fits its tensors to the rows it holds when walked; shards share them, so each
  # writes its range, and a shard that changed size since is an error.
  total = -1 if len(shards) == 1 else sum(sizes)
  first_row, prefixes = 0, []
  for index, (shard, size) in enumerate(zip(shards, sizes)):
    if size == 0 and (sum(sizes) > 0 or index > 0):
      continue  # no slice (a table without rows writes its empty tensors once)
    rows = write_range(shard, f"{prefix}_{index}", keys_name, values_name, first_row, total, run)
    if len(shards) > 1 and rows != size:
      raise RuntimeError(
        f"{OWNER}: shard {index} of table {shard.name!r} changed during the export "
        f"({size} rows, then {rows}); export when no training step runs"
      )
    first_row += rows
    prefixes.append(f"{prefix}_{index}")
  return first_row, prefixes


def write_range(table, bundle, keys_name, values_name, first_row, total, run):
  """Writes the rows of `table` as rows [first_row, ...) of the `total` rows (-1: the table's)
  of `keys_name` and `values_name`, into the bundle `bundle`; returns how many it wrote."""
  chunk_rows = max(1, settings.get("TF_EXT_SERVING_EXPORT_CHUNK_BYTES") // (8 + 4 * table.dim))
  with table.colocated():
    rows = _ops_loader.load().tf_ext_table_write_serving_bundle(
      table.resource_handle,
      bundle,
      keys_name,
      values_name,
      first_row,
      total,
      chunk_rows=chunk_rows,
    )
  return int(run(rows))


def merge_into(prefix, dense_from, skip, table_prefixes, staging):
  """Writes the bundle `prefix`: the tensors of the bundle `dense_from` but those in `skip`
  (each whole: what a SavedModel or checkpoint saves besides tables), and the bundles of
  `table_prefixes` (moved: their slices are not read)."""
  reader = tf.train.load_checkpoint(dense_from)
  names = sorted(set(reader.get_variable_to_shape_map()) - set(skip))
  dense = os.path.join(staging, os.path.basename(prefix) + "_dense")
  with tf.device("CPU"):
    tf.raw_ops.SaveV2(
      prefix=dense,
      tensor_names=names,
      shape_and_slices=[""] * len(names),
      tensors=[reader.get_tensor(name) for name in names],
    )
    del reader
    if dense_from == prefix:
      folder, base = os.path.split(prefix)
      for name in os.listdir(folder):
        if name.startswith(base + "."):
          os.remove(os.path.join(folder, name))
    tf.raw_ops.MergeV2Checkpoints(
      checkpoint_prefixes=[dense, *table_prefixes],
      destination_prefix=prefix,
      delete_old_dirs=False,
    )


def fill_saved_tables(export_dir, names, table_prefixes, staging, owner):
  """Replaces the empty core tables' tensors `names` in the variables of the SavedModel in
  `export_dir` by the bundles of `table_prefixes` (the rows, streamed)."""
  prefix = os.path.join(export_dir, "variables", "variables")
  saved = tf.train.load_checkpoint(prefix).get_variable_to_shape_map()
  missing = [name for name in names if saved.get(name, [None])[0] != 0]
  if missing:
    raise RuntimeError(f"{owner}: the SavedModel holds no empty table tensors {missing}")
  merge_into(prefix, prefix, names, table_prefixes, staging)


def serving_tensor_names(index):
  """The tensors of the `index`-th ServingTable of the saved module in its variables."""
  return [f"tables/{index}/hash_table/.ATTRIBUTES/table-{part}" for part in ("keys", "values")]


def stream_rows(export_dir, streamed, written_by_ranks):
  """Fills the empty tables of the SavedModel in `export_dir` with the rows of the tf_ext
  tables, streamed. `streamed`: {the index of a ServingTable in the saved module's `tables`:
  the table}; `written_by_ranks`: {index: (rows, bundles)} of tables split across ranks, whose
  parts every rank wrote already. Returns {index: rows}."""
  staging = tempfile.mkdtemp(prefix=".tf_ext_rows_", dir=os.path.join(export_dir, "variables"))
  try:
    rows, replaced, table_prefixes = {}, [], []
    for index, table in streamed.items():
      names = serving_tensor_names(index)
      if index in written_by_ranks:
        rows[index], written = written_by_ranks[index]
      else:
        rows[index], written = write_rows(
          _shards(table), *names, os.path.join(staging, f"table_{index}"), evaluate
        )
      replaced += names
      table_prefixes += written
    fill_saved_tables(export_dir, replaced, table_prefixes, staging, OWNER)
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  return rows


def evaluate(fetches):
  """Eager `run` of write_rows: the values of tensors (None for ops)."""
  return tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, fetches)


def _tf_ext_ops_in(export_dir):
  """The tf_ext op types anywhere in a SavedModel's graphs and functions."""
  proto = saved_model_pb2.SavedModel()
  binary = os.path.join(export_dir, "saved_model.pb")
  if os.path.exists(binary):
    with open(binary, "rb") as f:
      proto.ParseFromString(f.read())
  else:
    with open(os.path.join(export_dir, "saved_model.pbtxt")) as f:
      text_format.Parse(f.read(), proto)
  found = set()
  for meta_graph in proto.meta_graphs:
    nodes = list(meta_graph.graph_def.node)
    for function in meta_graph.graph_def.library.function:
      nodes.extend(function.node_def)
    found.update(node.op for node in nodes if node.op.startswith("TfExt"))
  return sorted(found)


def check_core_only(export_dir, owner):
  found = _tf_ext_ops_in(export_dir)
  if found:
    raise ValueError(
      f"{owner}: the export in {export_dir} still uses tf_ext ops {found}, so stock TensorFlow "
      "Serving cannot load it. Something reached a table other than through its lookup "
      "(e.g. statistics or size in a signature), or built a table with the "
      "DynamicEmbeddingVariable subclass"
    )
