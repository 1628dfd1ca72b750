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

Here: the export of Keras models and tf.Modules. The core table is serving_table.py's; the rows
streamed into the SavedModel's files, and the check that no tf_ext op is left, saved_model_files.py;
the Estimator export, estimator_export.py.
"""

import os
import shutil

import tensorflow as tf
from tensorflow.python.eager.polymorphic_function import polymorphic_function
from tensorflow.python.trackable import asset, resource

from tf_ext.dynamic_embedding import alltoall, sharded
from tf_ext.dynamic_embedding import variable as variable_lib
from tf_ext.dynamic_embedding.saved_model.estimator_export import (
  export_estimator_for_serving as export_estimator_for_serving,
)
from tf_ext.dynamic_embedding.saved_model.saved_model_files import (
  OWNER,
  check_core_only,
  evaluate,
  serving_tensor_names,
  stream_rows,
  streams,
  write_range,
)
from tf_ext.dynamic_embedding.saved_model.serving_table import ServingTable
from tf_ext.dynamic_embedding.saved_model.serving_table import default_row as default_row


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
      f"{OWNER}: the Keras model {model.name!r} has no input signature yet; call it (fit, "
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
        f"{OWNER}: signature {key!r} is a tf.function without an input_signature; give it one"
      )
    return function.python_function, list(function.input_signature)
  raise TypeError(
    f"{OWNER}: signature {key!r} must be a tf.function with an input_signature (the export "
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
      f"{OWNER}: pass signatures=; {type(obj).__name__} has "
      f"{len(methods)} tf.functions with an input_signature ({sorted(methods)}), so which one "
      "serves is ambiguous"
    )
  ((_, function),) = methods.items()
  return {"serving_default": _as_traceable("serving_default", function)}


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
      f"{OWNER} runs eagerly (TF2); for an Estimator use "
      "tf_ext.saved_model.export_estimator_for_serving"
    )
  if isinstance(obj, tf.compat.v1.estimator.Estimator):
    raise TypeError(f"{OWNER}: for an Estimator use export_estimator_for_serving")
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
    if streams(table) and index not in whole:
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
  streamed = {index: table for index, table in enumerate(tables) if streams(table)}
  rows = stream_rows(export_dir, streamed, written_by_ranks) if streamed else {}
  check_core_only(export_dir, OWNER)
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
      if not streams(table):  # string keys: gathered whole (each rank gets them)
        whole[index] = tuple(t.numpy() for t in table.export_whole())
        continue
      sizes = hvd.allgather(tf.reshape(table.size(), [1])).numpy()
      first_row, total = int(sizes[:rank].sum()), int(sizes.sum())
      bundles = [os.path.join(parts, f"table_{index}_rank_{r}") for r in range(len(sizes))]
      # A table without rows writes its empty tensors once (rank 0).
      writes = [r for r, size in enumerate(sizes) if size > 0 or (total == 0 and r == 0)]
      if rank in writes:
        rows = write_range(
          table, bundles[rank], *serving_tensor_names(index), first_row, total, evaluate
        )
        if rows != sizes[rank]:
          raise RuntimeError(
            f"{OWNER}: rank {rank}'s part of table {table.name!r} changed during the export "
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
    raise RuntimeError(f"{OWNER} of tables split across ranks failed: " + "; ".join(failures))
  return result


def _check_parts_reached(written_by_ranks):
  """Rank 0 reads every rank's parts: a clear error where the export folder is not shared."""
  for _, bundles in written_by_ranks.values():
    missing = [b for b in bundles if not os.path.exists(b + ".index")]
    if missing:
      raise RuntimeError(
        f"{OWNER}: rank 0 cannot read the rows other ranks wrote ({missing[0]}): every rank "
        "must reach the export folder (a shared filesystem). Or export from one process: "
        "restore a checkpoint into the model there (every rank's part) and export it"
      )
