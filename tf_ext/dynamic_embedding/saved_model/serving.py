"""Export for stock TensorFlow Serving: SavedModels of core TensorFlow ops only.

A dynamic embedding table becomes a core `MutableHashTable` from id to row (its rows only: no
optimizer slots, counts or admission state), saved in the SavedModel's variables. The serving
graph is traced anew with every lookup of a table answered by that core table, so it holds no
tf_ext op: `tensorflow_model_server`, `saved_model_cli` and plain TensorFlow load it without
tf_ext or its op library.

Ids that had a row when exporting read exactly that row. Any other id reads the table's default
row (`default_row`): the mean of its initializer (zeros for the default uniform initializer,
the constant for a constant one), where tf_ext itself would serve the id's own initial row.
"""

import os
import tempfile

import numpy as np
import tensorflow as tf
from google.protobuf import text_format
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow.python.eager.polymorphic_function import polymorphic_function
from tensorflow.python.trackable import asset, resource

from tf_ext.dynamic_embedding import checkpoint, live_tables, sharded
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
  def of(cls, table):
    """A copy of the rows of `table` (plain or sharded) as they are now (eager)."""
    keys, values = table.export()
    num_shards = getattr(table, "num_shards", None)
    return cls(table.name, table.dim, table.key_dtype, default_row(table), num_shards, keys, values)

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
  """The tf.functions with an input_signature among `obj`'s attributes, by name."""
  found = {}
  for name in dir(type(obj)):
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
  tables = {table: ServingTable.of(table) for table in found}
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
  _check_core_only(export_dir, _OWNER)
  return {table.name: int(copy.hash_table.size()) for table, copy in tables.items()}


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


def _trained_tables(estimator, serving_input_receiver_fn, checkpoint_path):
  """{name: (dim, key_dtype, default row, num_shards, keys, values)} of the tables the
  Estimator's PREDICT graph uses (a sharded table whole), read from `checkpoint_path`."""
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
    exports = {
      name: [shard.export() for shard in shards] for name, shards in shards_by_name.items()
    }
    with tf.compat.v1.Session(graph=graph) as session:
      if saveables:
        tf.compat.v1.train.Saver(var_list=saveables).restore(session, checkpoint_path)
      rows = session.run(exports)
  tables = {}
  for name, shards in shards_by_name.items():
    num_shards = len(shards) if hasattr(shards[0], "_tf_ext_shard_of") else None
    keys = np.concatenate([keys for keys, _ in rows[name]])
    values = np.concatenate([values for _, values in rows[name]])
    first = shards[0]
    tables[name] = (first.dim, first.key_dtype, default_row(first), num_shards, keys, values)
  return tables


def _write_serving_checkpoint(checkpoint_path, tables, prefix):
  """A checkpoint holding the original's dense tensors and each table as MutableHashTable's
  saveable reads it (`<name>-keys`, `<name>-values`)."""
  reader = tf.train.load_checkpoint(checkpoint_path)
  table_tensors = {f"{name}-slot_initial_values" for name in tables}
  names, tensors = [], []
  for name in sorted(reader.get_variable_to_shape_map()):
    if name in table_tensors or name == _OBJECT_GRAPH_TENSOR:
      continue
    names.append(name)
    tensors.append(reader.get_tensor(name))
  for name, (*_, keys, values) in sorted(tables.items()):
    names += [f"{name}-keys", f"{name}-values"]
    tensors += [keys, values]
  with tf.device("CPU"):
    tf.raw_ops.SaveV2(
      prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names), tensors=tensors
    )


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
  tables = _trained_tables(estimator, serving_input_receiver_fn, checkpoint_path)
  specs = {name: row[:4] for name, row in tables.items()}
  with tempfile.TemporaryDirectory(prefix="tf_ext_serving_") as scratch:
    converted = os.path.join(scratch, "serving")
    _write_serving_checkpoint(checkpoint_path, tables, converted)
    del tables
    with variable_lib.served_by(_ServingTablesByName(specs)):
      export_dir = estimator.export_saved_model(
        export_dir_base,
        serving_input_receiver_fn,
        assets_extra=assets_extra,
        as_text=as_text,
        checkpoint_path=converted,
      )
  _check_core_only(export_dir.decode(), _ESTIMATOR_OWNER)
  return export_dir
