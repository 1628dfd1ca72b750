"""Export for stock TensorFlow Serving: SavedModels of core TensorFlow ops only.

A dynamic embedding table becomes a core `MutableHashTable` from id to row (its rows only: no
optimizer slots, counts or admission state), saved in the SavedModel's variables. The serving
graph is traced anew with every lookup of a table answered by that core table, so it holds no
tf_ext op: `tensorflow_model_server`, `saved_model_cli` and plain TensorFlow load it without
tf_ext or its op library.

Ids that had a row when exporting read exactly that row. Any other id reads the table's default
row (`default_row`): the mean of its initializer (zeros for the default uniform initializer,
the constant for a constant one), where tf_ext itself would serve the id's own initial row.

The rows are streamed into the SavedModel's variables (TfExtTableWriteServingBundle): each table
is written a chunk of TF_EXT_SERVING_EXPORT_CHUNK_BYTES at a time, as slices of the core table's
`-keys` and `-values` tensors, which TensorFlow reads back whole. So the export needs memory for
one chunk, not for a copy of the rows. A table split across Horovod ranks is written by every
rank, its part as its range of the whole table, and merged by rank 0. String-keyed and GPU
tables are still copied whole (TensorFlow reads no sliced string tensor; the op walks host tables
only).
"""

import os
import shutil
import tempfile

import numpy as np
import tensorflow as tf
from google.protobuf import text_format
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow.python.eager.polymorphic_function import polymorphic_function
from tensorflow.python.trackable import asset, resource

from tf_ext import _ops_loader, settings
from tf_ext.dynamic_embedding import alltoall, checkpoint, live_tables, sharded
from tf_ext.dynamic_embedding import variable as variable_lib

_OWNER = "tf_ext.saved_model.export_for_serving"
_ESTIMATOR_OWNER = "tf_ext.saved_model.export_estimator_for_serving"
_INTEGER_IDS = (tf.int8, tf.int16, tf.int32, tf.uint8, tf.uint16, tf.uint32)
_OBJECT_GRAPH_TENSOR = "_CHECKPOINTABLE_OBJECT_GRAPH"


def default_row(table):
  """The row a serving export gives ids it has no row for: the mean of the table's initializer."""
  spec = table.initializer_spec
  kind, a, b = spec.kind, spec.a, spec.b
  mean = {"zeros": 0.0, "constant": a, "uniform": (a + b) / 2}.get(kind, a)  # normal: a is mean
  return np.full([table.dim], mean, np.float32)


class ServingTable(tf.Module):
  """A dynamic embedding table frozen for serving: a core MutableHashTable from id to row.

  In eager mode it is filled now from `keys`/`values`; in a graph (the Estimator export) it is
  filled by restoring the checkpoint its saveable reads, `<name>-keys` and `<name>-values`.
  """

  def __init__(self, name, dim, key_dtype, default_value, num_shards=None, keys=None, values=None):
    super().__init__()
    self.table_name = name
    self.dim = dim
    self.key_dtype = tf.as_dtype(key_dtype)
    self.num_shards = num_shards  # the replaced table's (get-or-create compares it)
    self.hash_table = tf.lookup.experimental.MutableHashTable(
      self.key_dtype, tf.float32, default_value=default_value, name=name
    )
    if keys is not None:
      self.hash_table.insert(keys, values)

  @classmethod
  def of(cls, table, rows=None):
    """A copy of the rows of `table` (plain or sharded) as they are now (eager), or of `rows`
    ((keys, values)) given for it."""
    keys, values = rows if rows is not None else table.export()
    num_shards = getattr(table, "num_shards", None)
    return cls(table.name, table.dim, table.key_dtype, default_row(table), num_shards, keys, values)

  @classmethod
  def empty_like(cls, table):
    """An empty stand-in for `table`, whose rows are streamed into the SavedModel afterwards."""
    num_shards = getattr(table, "num_shards", None)
    return cls(table.name, table.dim, table.key_dtype, default_row(table), num_shards)

  def lookup(self, ids, name=None):
    ids = tf.convert_to_tensor(ids)
    if ids.dtype != self.key_dtype:
      if self.key_dtype == tf.int64 and ids.dtype in _INTEGER_IDS:
        ids = tf.cast(ids, tf.int64)
      else:
        raise variable_lib.invalid_argument(
          self.table_name,
          f"the exported signature feeds {ids.dtype.name} ids to this table, whose keys are "
          f"{self.key_dtype.name}: give that input dtype {self.key_dtype.name} in the "
          "signature (tf.TensorSpec) or the serving input function",
        )
    with tf.name_scope(name or f"{self.table_name}_lookup"):
      rows = self.hash_table.lookup(ids)
    rows.set_shape(ids.shape.concatenate([self.dim]))  # the op's shape function leaves it unknown
    return rows


# ---- streaming the rows into the variables ----------------------------------------------------


def _shards(table):
  return list(getattr(table, "shards", None) or [table])


def _streams(table):
  """Whether the rows of `table` can be streamed: int64 ids (RestoreV2 reads no sliced string
  tensor) in host memory (the op walks host tables)."""
  return table.key_dtype == tf.int64 and "GPU" not in _shards(table)[0].device.upper()


def _write_rows(shards, keys_name, values_name, prefix, run):
  """Writes the rows of a table (its `shards`, in order) as `keys_name` and `values_name` into
  bundles `prefix`_<shard>; returns (rows, the bundles' prefixes). `run` evaluates tensors and
  ops (eagerly: their values; in a graph: Session.run)."""
  if not _streams(shards[0]):  # whole, as the export did before streaming
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
    rows = _write_range(shard, f"{prefix}_{index}", keys_name, values_name, first_row, total, run)
    if len(shards) > 1 and rows != size:
      raise RuntimeError(
        f"{_OWNER}: shard {index} of table {shard.name!r} changed during the export "
        f"({size} rows, then {rows}); export when no training step runs"
      )
    first_row += rows
    prefixes.append(f"{prefix}_{index}")
  return first_row, prefixes


def _write_range(table, bundle, keys_name, values_name, first_row, total, run):
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


def _merge_into(prefix, dense_from, skip, table_prefixes, staging):
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


def _fill_saved_tables(export_dir, names, table_prefixes, staging, owner):
  """Replaces the empty core tables' tensors `names` in the variables of the SavedModel in
  `export_dir` by the bundles of `table_prefixes` (the rows, streamed)."""
  prefix = os.path.join(export_dir, "variables", "variables")
  saved = tf.train.load_checkpoint(prefix).get_variable_to_shape_map()
  missing = [name for name in names if saved.get(name, [None])[0] != 0]
  if missing:
    raise RuntimeError(f"{owner}: the SavedModel holds no empty table tensors {missing}")
  _merge_into(prefix, prefix, names, table_prefixes, staging)


def _serving_tensor_names(index):
  """The tensors of the `index`-th ServingTable of the saved module in its variables."""
  return [f"tables/{index}/hash_table/.ATTRIBUTES/table-{part}" for part in ("keys", "values")]


def _stream_rows(export_dir, streamed, written_by_ranks):
  """Fills the empty tables of the SavedModel in `export_dir` with the rows of the tf_ext
  tables, streamed. `streamed`: {the index of a ServingTable in the saved module's `tables`:
  the table}; `written_by_ranks`: {index: (rows, bundles)} of tables split across ranks, whose
  parts every rank wrote already. Returns {index: rows}."""
  staging = tempfile.mkdtemp(prefix=".tf_ext_rows_", dir=os.path.join(export_dir, "variables"))
  try:
    rows, replaced, table_prefixes = {}, [], []
    for index, table in streamed.items():
      names = _serving_tensor_names(index)
      if index in written_by_ranks:
        rows[index], written = written_by_ranks[index]
      else:
        rows[index], written = _write_rows(
          _shards(table), *names, os.path.join(staging, f"table_{index}"), _evaluate
        )
      replaced += names
      table_prefixes += written
    _fill_saved_tables(export_dir, replaced, table_prefixes, staging, _OWNER)
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  return rows


def _evaluate(fetches):
  """Eager `run` of _write_rows: the values of tensors (None for ops)."""
  return tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, fetches)


# ---- Keras models and tf.Modules ------------------------------------------------------------


def _is_table(obj):
  return isinstance(
    obj, (variable_lib.DynamicEmbeddingVariable, sharded.ShardedDynamicEmbeddingVariable)
  )


def _tracked(obj):
  """What `obj` tracks, in one walk: (its tables, sharded ones whole and plain ones that are no
  shard; what the serving graph may capture besides them: the variables and core resources, e.g.
  vocabulary tables, without tf_ext's tables and gradient anchors)."""
  tables, kept = [], []
  for child in tf.train.TrackableView(obj).descendants():
    if _is_table(child):
      tables.append(child)
    elif hasattr(child, variable_lib.TABLE_OF_ANCHOR):
      continue
    elif isinstance(child, (tf.Variable, resource.CapturableResource, asset.Asset)):
      kept.append(child)
  shards = {id(shard) for table in tables for shard in getattr(table, "shards", ())}
  return [table for table in tables if id(table) not in shards], kept


def _keras_signature(model):
  spec = model.save_spec() if hasattr(model, "save_spec") else None
  if spec is None:
    raise ValueError(
      f"{_OWNER}: the Keras model {model.name!r} has no input signature yet; call it (fit, "
      "predict) once, or pass signatures= (a tf.function with an input_signature)"
    )
  args, kwargs = spec
  output_names = list(model.output_names)

  def serve(*inputs):
    outputs = model(*inputs, training=False, **kwargs)
    if isinstance(outputs, dict):
      return outputs
    flat = tf.nest.flatten(outputs)
    return dict(zip(output_names, flat)) if len(output_names) == len(flat) else outputs

  return {"serving_default": (serve, list(args))}


def _traced_functions(obj):
  """The tf.functions with an input_signature among `obj`'s attributes, by name: methods of its
  class and functions set on the object itself (`module.serve = tf.function(...)`)."""
  found = {}
  for name in dir(obj):
    if name.startswith("_"):
      continue
    try:
      value = getattr(obj, name)
    except Exception:  # noqa: BLE001 (properties may fail on a half-built object)
      continue
    if isinstance(value, polymorphic_function.Function) and value.input_signature is not None:
      found[name] = value
  return found


def _as_traceable(key, function):
  if isinstance(function, polymorphic_function.Function):
    if function.input_signature is None:
      raise ValueError(
        f"{_OWNER}: signature {key!r} is a tf.function without an input_signature; give it one"
      )
    return function.python_function, list(function.input_signature)
  raise TypeError(
    f"{_OWNER}: signature {key!r} must be a tf.function with an input_signature (the export "
    f"traces it again with core lookup tables), got {type(function).__name__}; pass the "
    "tf.function itself rather than a concrete function"
  )


def _signatures_to_trace(obj, signatures, methods):
  """{signature key: (python function, input signature)}; `methods`: obj's _traced_functions."""
  if signatures is not None:
    if not isinstance(signatures, dict):
      signatures = {"serving_default": signatures}
    return {key: _as_traceable(key, function) for key, function in signatures.items()}
  if isinstance(obj, tf.keras.Model):
    return _keras_signature(obj)
  if len(methods) != 1:
    raise ValueError(
      f"{_OWNER}: pass signatures=; {type(obj).__name__} has "
      f"{len(methods)} tf.functions with an input_signature ({sorted(methods)}), so which one "
      "serves is ambiguous"
    )
  ((_, function),) = methods.items()
  return {"serving_default": _as_traceable("serving_default", function)}


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


def _check_core_only(export_dir, owner):
  found = _tf_ext_ops_in(export_dir)
  if found:
    raise ValueError(
      f"{owner}: the export in {export_dir} still uses tf_ext ops {found}, so stock TensorFlow "
      "Serving cannot load it. Something reached a table other than through its lookup "
      "(e.g. statistics or size in a signature), or built a table with the "
      "DynamicEmbeddingVariable subclass"
    )


def export_for_serving(obj, export_dir, signatures=None, options=None):
  """Saves `obj` (a Keras model or tf.Module) as a SavedModel of core TensorFlow ops only.

  As `tf.saved_model.save(obj, export_dir, signatures, options)`, but every dynamic embedding
  table is replaced by a core lookup table holding its current rows (see the module doc for ids
  without a row), so stock TensorFlow Serving serves it without tf_ext. `signatures`: a
  tf.function with an input_signature or a dict of them (traced again, with core tables); by
  default a Keras model's call on its saved input spec, or the one tf.function with an
  input_signature of a tf.Module. A tf.Module's tf.functions with an input_signature stay
  callable on the loaded object. For warm-starting training, keep using tf.saved_model.save
  (full fidelity: slots, counts, admission state; needs tf_ext to load). Eager only.

  With tables split across Horovod ranks (distribution="alltoall") it is a collective: every
  rank calls it with the same `export_dir`, on a filesystem every rank reaches; rank 0 writes
  the SavedModel, holding every rank's rows, and every rank returns the same result.

  Returns {table name: rows exported}.
  """
  if not tf.executing_eagerly():
    raise RuntimeError(
      f"{_OWNER} runs eagerly (TF2); for an Estimator use "
      "tf_ext.saved_model.export_estimator_for_serving"
    )
  if isinstance(obj, tf.compat.v1.estimator.Estimator):
    raise TypeError(f"{_OWNER}: for an Estimator use export_estimator_for_serving")
  methods = {} if isinstance(obj, tf.keras.Model) else _traced_functions(obj)
  to_trace = _signatures_to_trace(obj, signatures, methods)
  found, kept = _tracked(obj)
  split = alltoall.split_tables(found)
  if not split:
    return _export(obj, export_dir, options, methods, to_trace, found, kept, {}, {})
  return _export_split(obj, export_dir, options, methods, to_trace, found, kept, split)


def _export(obj, export_dir, options, methods, to_trace, found, kept, written_by_ranks, whole):
  """export_for_serving's SavedModel. `written_by_ranks` and `whole` ({index in `found`: ...}):
  the rows of tables split across ranks, as bundles that every rank wrote ((rows, prefixes)) or
  gathered whole ((keys, values))."""
  tables = {}
  for index, table in enumerate(found):
    if _streams(table) and index not in whole:
      tables[table] = ServingTable.empty_like(table)
    else:
      tables[table] = ServingTable.of(table, whole.get(index))
  served = tf.Module()
  served.tables = list(tables.values())
  served.state = kept
  retraced = {}  # python function -> its tf.function traced with the core tables

  def retrace(python_function, input_signature):
    if python_function not in retraced:
      retraced[python_function] = tf.function(python_function, input_signature=input_signature)
    return retraced[python_function]

  concrete = {}
  with variable_lib.served_by(tables):
    # A method that also serves as a signature is traced once for both.
    for name, method in methods.items():
      setattr(served, name, retrace(method.python_function, method.input_signature))
    for key, (python_function, input_signature) in to_trace.items():
      concrete[key] = retrace(python_function, input_signature).get_concrete_function()
    # Saving traces the methods again (its own cache key): with the replacements still on.
    tf.saved_model.save(served, export_dir, signatures=concrete, options=options)
  streamed = {index: table for index, table in enumerate(tables) if _streams(table)}
  rows = _stream_rows(export_dir, streamed, written_by_ranks) if streamed else {}
  _check_core_only(export_dir, _OWNER)
  return {
    table.name: rows[index] if index in rows else int(tables[table].hash_table.size())
    for index, table in enumerate(tables)
  }


def _export_split(obj, export_dir, options, methods, to_trace, found, kept, split):
  """export_for_serving of tables split across ranks: a collective. Every rank writes its parts'
  rows as their ranges of the whole tables, into `export_dir` (which every rank must reach: a
  shared filesystem); rank 0 saves the SavedModel and merges the parts into it; every rank
  returns its result or raises its error."""
  hvd = split[0].horovod
  rank = hvd.rank()
  parts = os.path.join(export_dir, ".tf_ext_rank_parts")
  written_by_ranks, whole, failure = {}, {}, None
  try:
    os.makedirs(parts, exist_ok=True)
    for index, table in enumerate(found):
      if table not in split:
        continue
      if not _streams(table):  # string keys: gathered whole (each rank gets them)
        whole[index] = tuple(t.numpy() for t in table.export_whole())
        continue
      sizes = hvd.allgather(tf.reshape(table.size(), [1])).numpy()
      first_row, total = int(sizes[:rank].sum()), int(sizes.sum())
      bundles = [os.path.join(parts, f"table_{index}_rank_{r}") for r in range(len(sizes))]
      # A table without rows writes its empty tensors once (rank 0).
      writes = [r for r, size in enumerate(sizes) if size > 0 or (total == 0 and r == 0)]
      if rank in writes:
        rows = _write_range(
          table, bundles[rank], *_serving_tensor_names(index), first_row, total, _evaluate
        )
        if rows != sizes[rank]:
          raise RuntimeError(
            f"{_OWNER}: rank {rank}'s part of table {table.name!r} changed during the export "
            f"({sizes[rank]} rows, then {rows}); export when no training step runs"
          )
      written_by_ranks[index] = (total, [bundles[r] for r in writes])
  except Exception as error:  # noqa: BLE001 (every rank learns it below, instead of a hang)
    failure = f"rank {rank}: {type(error).__name__}: {error}"
  failures = [f for f in hvd.allgather_object(failure, name="tf_ext_serving_export") if f]
  result = None
  if rank == 0 and not failures:
    try:
      _check_parts_reached(written_by_ranks)
      result = _export(
        obj, export_dir, options, methods, to_trace, found, kept, written_by_ranks, whole
      )
    except Exception as error:  # noqa: BLE001
      failures = [f"rank 0: {type(error).__name__}: {error}"]
  failures, result = hvd.broadcast_object((failures, result), name="tf_ext_serving_export_done")
  shutil.rmtree(parts, ignore_errors=True)  # every rank, once rank 0 merged (or failed)
  if failures:
    raise RuntimeError(f"{_OWNER} of tables split across ranks failed: " + "; ".join(failures))
  return result


def _check_parts_reached(written_by_ranks):
  """Rank 0 reads every rank's parts: a clear error where the export folder is not shared."""
  for _, bundles in written_by_ranks.values():
    missing = [b for b in bundles if not os.path.exists(b + ".index")]
    if missing:
      raise RuntimeError(
        f"{_OWNER}: rank 0 cannot read the rows other ranks wrote ({missing[0]}): every rank "
        "must reach the export folder (a shared filesystem). Or export from one process: "
        "restore a checkpoint into the model there (every rank's part) and export it"
      )


# ---- Estimators -------------------------------------------------------------------------------


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
  tables' rows into it (`<name>-keys`, `<name>-values`, see _write_rows). Returns the folder."""
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
          prefixes += _write_rows(shards, *names[-2:], bundle, session.run)[1]
      _fill_saved_tables(export_dir, names, prefixes, staging, _ESTIMATOR_OWNER)
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
  _merge_into(prefix, checkpoint_path, skip, [empty_tables], scratch)


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
  _check_core_only(export_dir, _ESTIMATOR_OWNER)
  return export_dir.encode()
