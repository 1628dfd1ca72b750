"""DynamicEmbeddingVariable: a hashtable-backed embedding whose rows come and go while training.

The table lives in a TensorFlow resource (kernels/dynamic_embedding). This module is a thin layer
over its ops: argument checks with errors that name the table, get-or-create by name,
checkpointing (tf.compat.v1.train.Saver and tf.train.Checkpoint) and SavedModel export.
"""

import contextlib
import threading
import weakref

import tensorflow as tf
from tensorflow.python.framework import ops
from tensorflow.python.trackable import resource

from tf_ext import _ops_loader
from tf_ext.dynamic_embedding import (
  checkpoint,
  cluster,
  fusion_markers,
  initializers,
  lifecycle,
  limits,
  live_tables,
)

# The live tables, as tf_ext.dynamic_embedding.variable.tables (their home is live_tables.py).
from tf_ext.dynamic_embedding.live_tables import tables  # noqa: F401

# The largest dim (limits.py). Copies of facts of the op library, checked against it by
# tests/dynamic_embedding/test_op_facts.py: the outputs of TfExtTableExport (inputs of
# TfExtTableImport). The suffixes named a table's tensors in tf_ext 0.1 checkpoints (which
# TfExtTableRestoreCheckpoint still reads), so they are spelled out rather than read from the ops.
MAX_DIM = limits.MAX_DIM
_SAVE_SUFFIXES = ("keys", "values", "slots", "update_counts", "last_steps", "slot_initial_values")
_KEY_DTYPES = (tf.int64, tf.string)
# Attribute set on a table's gradient anchor variable, pointing back at the table.
TABLE_OF_ANCHOR = "_tf_ext_dynamic_embedding_table"


def invalid_argument(table_name, message):
  """The error raised for bad input: InvalidArgumentError naming the table."""
  return tf.errors.InvalidArgumentError(
    None, None, f"dynamic embedding table '{table_name}': {message}"
  )


class ServedByName(type):
  """While an Estimator export for serving builds its graph, creating a table of a replaced name
  gives its core replacement (tf_ext.saved_model), however the model_fn creates it (columns,
  layers, get_dynamic_embedding_variable)."""

  def __call__(cls, *args, **kwargs):
    name = args[0] if args else kwargs.get("name")
    served = serving_replacement(name) if isinstance(name, str) else None
    return served if served is not None else super().__call__(*args, **kwargs)


class _ServedResourceType(ServedByName, type(resource.TrackableResource)):
  pass


class TableFacts:
  """What every table object (plain or sharded) shows of itself."""

  @property
  def name(self):
    return self._name

  @property
  def dim(self):
    return self._dim

  @property
  def key_dtype(self):
    return self._key_dtype

  @property
  def value_dtype(self):
    return tf.float32


class DynamicEmbeddingVariable(
  TableFacts, resource.TrackableResource, metaclass=_ServedResourceType
):
  """An embedding table keyed by exact int64 or string ids, growing with the ids it sees.

  - `lookup(ids)` never changes the table: a missing id reads its initial row, computed from
    (id, seed) alone, so evaluation and serving cannot pollute the table.
  - Rows are created by `insert` or when an optimizer wrapped with
    `tf_ext.DynamicEmbeddingOptimizer` first updates them; the optimizer's slots live in the
    same table entry as the row.
  - Saved and restored by tf.compat.v1.train.Saver, tf.train.Checkpoint and SavedModel, streamed
    into a file beside the checkpoint (tf_ext/dynamic_embedding/checkpoint.py); and in full and
    delta snapshots by tf_ext.DeltaCheckpointManager.

  Create it with `tf_ext.get_dynamic_embedding_variable` (get-or-create by name).
  """

  def __init__(
    self,
    name,
    dim,
    key_dtype=tf.int64,
    value_dtype=tf.float32,
    initializer=None,
    trainable=True,
    gradient_anchor=None,
    admission=None,
    eviction=None,
  ):
    self._name = name
    self._validate(dim, key_dtype, value_dtype)
    lifecycle.check_policies(name, trainable, admission, eviction)
    self._admission = admission
    self._eviction = eviction
    self._dim = int(dim)
    self._key_dtype = tf.as_dtype(key_dtype)
    self._initializer = initializers.spec_from(initializer, dim, name)
    self._trainable = trainable
    # SavedModel export works on shallow copies of trackables; the checkpoint saver maps a copy
    # back to this table (checkpoint._handle).
    self._original = weakref.ref(self)
    with tf.init_scope():
      executing_eagerly = tf.executing_eagerly()
      # The TF1 graph the table lives in (None eagerly): where a Saver's var_list may name it.
      self._saver_graph = None if executing_eagerly else ops.get_default_graph()
      # Eager resources are shared by name across the process: give each table its own. A
      # shared name may not start with "_" (TensorFlow's rule); a table's name may.
      shared = f"table{name}" if name.startswith("_") else name
      self._shared_name = f"{shared}_{ops.uid()}" if executing_eagerly else shared
      super().__init__()
      _ = self.resource_handle  # Created now, under the caller's device scope.
      if gradient_anchor is None:
        with tf.compat.v1.name_scope(None):
          gradient_anchor = tf.Variable(
            0.0, trainable=trainable, dtype=tf.float32, name=f"{name}/gradient_anchor"
          )
      self._gradient_anchor = gradient_anchor
      setattr(gradient_anchor, TABLE_OF_ANCHOR, weakref.ref(self))
      if not executing_eagerly:
        ops.add_to_collection(
          tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS, checkpoint.TableSaveable(self, name)
        )
        # A table on a task that does not answer: an error now, not a session that waits forever.
        cluster.check_device_reachable(self.device, name)
      live_tables.remember(self)

  def _validate(self, dim, key_dtype, value_dtype):
    try:
      key_dtype = tf.as_dtype(key_dtype)
      value_dtype = tf.as_dtype(value_dtype)
    except TypeError as error:
      raise invalid_argument(self._name, f"bad dtype: {error}") from None
    if key_dtype not in _KEY_DTYPES:
      raise invalid_argument(
        self._name, f"key_dtype must be tf.int64 or tf.string, got {key_dtype.name}"
      )
    if value_dtype != tf.float32:
      raise invalid_argument(self._name, f"value_dtype must be tf.float32, got {value_dtype.name}")
    if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= MAX_DIM:
      raise invalid_argument(self._name, f"dim must be an int in [1, {MAX_DIM}], got {dim!r}")

  # ---- properties -------------------------------------------------------------------------

  @property
  def trainable(self):
    return self._trainable

  @property
  def initializer_spec(self):
    return self._initializer

  @property
  def admission(self):
    """The tf_ext.FrequencyAdmission the table was created with, or None."""
    return self._admission

  @property
  def eviction(self):
    """The tf_ext.EvictionPolicy `evict()` applies, or None."""
    return self._eviction

  @property
  def gradient_anchor(self):
    """The scalar variable through which gradients reach this table.

    Optimizers see it in `trainable_variables`; its gradient is an IndexedSlices whose indices
    are the looked-up keys. `tf_ext.DynamicEmbeddingOptimizer` routes it to the table.
    """
    return self._gradient_anchor

  @property
  def device(self):
    return self.resource_handle.device

  def __repr__(self):
    return (
      f"<tf_ext.DynamicEmbeddingVariable '{self._name}' dim={self._dim} "
      f"key_dtype={self._key_dtype.name}>"
    )

  # ---- resource ---------------------------------------------------------------------------

  def _create_resource(self):
    spec = self._initializer
    admission = self._admission.op_attrs() if self._admission else {}
    # Only when not 1: graphs of version 1 tables keep the NodeDef that earlier builds read.
    version = {"initializer_version": spec.version} if spec.version != 1 else {}
    return _ops_loader.load().tf_ext_dynamic_table(
      **admission,
      **version,
      table_name=self._name,
      shared_name=self._shared_name,
      key_dtype=self._key_dtype,
      dim=self._dim,
      initializer=spec.kind,
      init_a=spec.a,
      init_b=spec.b,
      seed=spec.seed,
    )

  @property
  def saver_graph(self):
    """The TF1 graph the table lives in (None: created eagerly)."""
    return self._saver_graph

  def _gather_saveables_for_checkpoint(self):
    return checkpoint.saver_list_saveables(self, self._saver_graph, checkpoint.TableSaveable)

  def _destroy_resource(self):
    if tf.executing_eagerly():
      tf.raw_ops.DestroyResourceOp(resource=self.resource_handle, ignore_lookup_error=True)

  def colocated(self):
    """A context placing new ops with the table (graph mode; eager places by the handle)."""
    if tf.executing_eagerly():
      return contextlib.nullcontext()
    return ops.colocate_with(self.resource_handle)

  # ---- input checks -----------------------------------------------------------------------

  def _check_keys(self, keys, what="ids"):
    """Converts keys to a Tensor of the table's key dtype; int32 ids are widened."""
    if isinstance(keys, (tf.SparseTensor, tf.RaggedTensor)):
      raise invalid_argument(
        self._name,
        f"{what} is a {type(keys).__name__}; use tf_ext.embedding_lookup(table, "
        f"{what}, combiner=...) or tf_ext.dynamic_embedding(..., combiner=...) for it",
      )
    try:
      keys = tf.convert_to_tensor(keys)
    except (TypeError, ValueError) as error:
      raise invalid_argument(
        self._name, f"{what} cannot be converted to a tensor: {error}"
      ) from None
    if keys.dtype == self._key_dtype:
      return keys
    if self._key_dtype == tf.int64 and keys.dtype in (
      tf.int32,
      tf.uint8,
      tf.int16,
      tf.int8,
      tf.uint16,
      tf.uint32,
    ):
      return tf.cast(keys, tf.int64)
    raise invalid_argument(
      self._name, f"{what} must be {self._key_dtype.name}, got {keys.dtype.name}"
    )

  def _check_rows(self, keys, values):
    try:
      values = tf.convert_to_tensor(values, dtype_hint=tf.float32)
    except (TypeError, ValueError) as error:
      raise invalid_argument(
        self._name, f"values cannot be converted to a tensor: {error}"
      ) from None
    if values.dtype != tf.float32:
      raise invalid_argument(self._name, f"values must be float32, got {values.dtype.name}")
    keys_rank, values_rank = keys.shape.rank, values.shape.rank
    if keys_rank is not None and values_rank is not None:
      if values_rank != keys_rank + 1:
        raise invalid_argument(
          self._name,
          f"values must have rank keys.rank + 1 = {keys_rank + 1} "
          f"(shape keys.shape + [{self._dim}]), got rank {values_rank}",
        )
    if (
      values.shape.rank is not None
      and values.shape[-1] is not None
      and values.shape[-1] != self._dim
    ):
      raise invalid_argument(
        self._name, f"values have dim {values.shape[-1]}, the table has dim {self._dim}"
      )
    return values

  # ---- table operations -------------------------------------------------------------------

  def lookup(self, ids, name=None):
    """Rows for `ids` (any shape): a float32 tensor of shape ids.shape + [dim].

    Never inserts: missing ids read their initial rows.
    """
    served = serving_replacement(self)
    if served is not None:  # tf_ext.saved_model.export_for_serving is tracing
      return served.lookup(ids, name)
    ids = self._check_keys(ids)
    anchor = self._gradient_anchor.value() if self._trainable else tf.constant(0.0)
    with tf.name_scope(name or f"{self._name}_lookup"), self.colocated():
      return _ops_loader.load().tf_ext_table_find(self.resource_handle, ids, anchor, dim=self._dim)

  def insert(self, keys, values, name=None):
    """Sets the rows of `keys` (any shape) to `values` (keys.shape + [dim])."""
    keys = self._check_keys(keys, "keys")
    values = self._check_rows(keys, values)
    with tf.name_scope(name or f"{self._name}_insert"), self.colocated():
      return _ops_loader.load().tf_ext_table_insert(
        self.resource_handle, keys, values, dim=self._dim
      )

  def remove(self, keys, name=None):
    """Removes `keys`; missing keys are ignored. Their memory is reused by later ids."""
    keys = self._check_keys(keys, "keys")
    with tf.name_scope(name or f"{self._name}_remove"), self.colocated():
      return _ops_loader.load().tf_ext_table_remove(self.resource_handle, keys)

  def size(self, name=None):
    """Number of ids in the table (int64 scalar)."""
    with tf.name_scope(name or f"{self._name}_size"), self.colocated():
      return _ops_loader.load().tf_ext_table_size(self.resource_handle)

  def memory_bytes(self, name=None):
    """Bytes the table holds for its entries and index (int64 scalar)."""
    with tf.name_scope(name or f"{self._name}_memory_bytes"), self.colocated():
      return _ops_loader.load().tf_ext_table_memory_bytes(self.resource_handle)

  def clear(self, name=None):
    """Removes every id."""
    with tf.name_scope(name or f"{self._name}_clear"), self.colocated():
      return _ops_loader.load().tf_ext_table_clear(self.resource_handle)

  def evict(self, step=None, name=None):
    """Removes the rows the table's EvictionPolicy condemns; returns how many (int64 scalar).

    It runs inside the table, shard by shard, while lookups and updates go on. `step` is the
    current global step; by default, the latest step a training update of the table had.
    """
    if self._eviction is None:
      raise invalid_argument(
        self._name,
        "evict() needs an eviction policy: create the table with "
        "eviction=tf_ext.EvictionPolicy(...)",
      )
    now = tf.constant(-1, tf.int64) if step is None else tf.cast(step, tf.int64)
    with tf.name_scope(name or f"{self._name}_evict"), self.colocated():
      return _ops_loader.load().tf_ext_table_evict(
        self.resource_handle, now, **self._eviction.op_attrs()
      )

  def statistics(self, name=None):
    """{name: scalar tensor}: size, bytes, admitted, rejected, evicted, lookups, lookup_hits
    (int64, counted since the table was created in this process) and lookup_hit_rate (float64:
    the fraction of looked-up ids that had a row)."""
    with tf.name_scope(name or f"{self._name}_statistics"), self.colocated():
      values = _ops_loader.load().tf_ext_table_statistics(self.resource_handle)
      return lifecycle.statistics_dict(tf.unstack(values, num=len(lifecycle.STATISTICS)))

  def export(self, name=None):
    """(keys, values): every id and its row, a consistent snapshot."""
    keys, values, *_ = self.export_with_slots(name)
    return keys, values

  def export_with_slots(self, name=None):
    """(keys, values, slots, update_counts, last_steps, slot_initial_values)."""
    with tf.name_scope(name or f"{self._name}_export"), self.colocated():
      return tuple(
        _ops_loader.load().tf_ext_table_export(
          self.resource_handle, Tkey=self._key_dtype, dim=self._dim
        )
      )

  def import_with_slots(
    self, keys, values, slots, update_counts, last_steps, slot_initial_values, name=None
  ):
    """Replaces the whole content with the given snapshot, atomically (all or nothing)."""
    keys = self._check_keys(keys, "keys")
    with tf.name_scope(name or f"{self._name}_import"), self.colocated():
      return _ops_loader.load().tf_ext_table_import(
        self.resource_handle,
        keys,
        tf.convert_to_tensor(values, tf.float32),
        tf.convert_to_tensor(slots, tf.float32),
        tf.convert_to_tensor(update_counts, tf.int64),
        tf.convert_to_tensor(last_steps, tf.int64),
        tf.convert_to_tensor(slot_initial_values, tf.float32),
        dim=self._dim,
      )


checkpoint.register(DynamicEmbeddingVariable)


# ---- serving export ------------------------------------------------------------------------

_serving = threading.local()


@contextlib.contextmanager
def served_by(replacements):
  """Within this context (in this thread), lookups of the tables that are keys of `replacements`
  are answered by their values, and creating a table whose name is a key gives its value:
  tf_ext.saved_model traces serving graphs of core ops this way."""
  previous = getattr(_serving, "replacements", None)
  _serving.replacements = replacements
  try:
    yield
  finally:
    _serving.replacements = previous


def source_tensor(tensor):
  """The graph tensor that `tensor` is, looking through reshapes and identities; None eagerly,
  where a tensor keeps no op."""
  while getattr(tensor, "op", None) is not None and tensor.op.type in ("Reshape", "Identity"):
    tensor = tensor.op.inputs[0]
  return tensor if getattr(tensor, "op", None) is not None else None


def serving_replacement(table_or_name):
  """The replacement of a table (or a table's full name) in the active `served_by`, or None."""
  replacements = getattr(_serving, "replacements", None)
  return None if replacements is None else replacements.get(table_or_name)


@ops.RegisterGradient("TfExtTableFind")
def _table_find_gradient(op, grad):
  """The gradient of a lookup, as IndexedSlices keyed by the looked-up ids, to the anchor."""
  dim = op.get_attr("dim")
  keys = tf.reshape(op.inputs[1], [-1])
  rows = fusion_markers.marked_rows_gradient(op, keys, tf.reshape(grad, [-1, dim]))
  dense_shape = tf.stack([tf.size(keys, out_type=tf.int64), tf.constant(dim, tf.int64)])
  return [None, None, tf.IndexedSlices(rows, keys, dense_shape)]


@ops.RegisterGradient("TfExtTableFindWithPresence")
def _table_find_with_presence_gradient(op, grad, present_grad):
  """As a lookup's; `present` (bool) has no gradient."""
  del present_grad
  return _table_find_gradient(op, grad)
