"""A Variable's reads, and the initial rows its lookups read for missing keys.

Where TFRA's initializer is called per lookup (initial_rows.py), a lookup reads, for each missing
key, a row the table does not hold; the rows read through a wrapper are kept so that the next
update writes them first, and starts from the row the lookup read.
"""

import weakref

import tensorflow as tf
from tensorflow.python.eager import record as gradient_record
from tensorflow.python.framework import ops

from tf_ext import _ops_loader
from tf_ext.dynamic_embedding import alltoall
from tf_ext.dynamic_embedding import variable as table_lib
from tf_ext.dynamic_embedding.tfra import dtypes

# Eagerly, a wrapper keeps what its lookups read for their missing keys until the next update;
# lookups under a tape that are never trained keep at most this many.
_MAX_EAGER_DEFAULT_ROWS = 64


def _shaped_as(keys, flat, width=None):
  """`flat` (one value, or one row of `width`, per key of the flattened `keys`) in keys' shape
  (+ [width]), with the static shape kept."""
  tail = [] if width is None else [width]
  shaped = tf.reshape(flat, tf.concat([tf.shape(keys), tail], 0))
  shaped.set_shape(keys.shape.concatenate(tail))
  return shaped


def _with_default_rows(rows, exists, default, differentiable):
  """`rows` with `default`'s row where a key is missing (the table gave it zeros). Differentiable
  (float) rows keep their gradient for every key, missing ones too."""
  if not differentiable:
    return tf.where(exists[..., None], rows, default)
  return rows + tf.stop_gradient(tf.where(exists[..., None], tf.zeros_like(rows), default))


def _keep_default_rows(anchor, keys, present, rows):
  """Keeps the rows ([n, dim]) that a lookup through `anchor` read for its 1-D `keys` that were
  not `present`, for the next update to write: per graph in a graph (while the graph lives),
  eagerly only under a gradient tape, until the next update."""
  if tf.executing_eagerly() and not gradient_record.could_possibly_record():
    return
  missing = tf.logical_not(present)
  entry = (tf.boolean_mask(keys, missing), tf.boolean_mask(rows, missing))
  if tf.executing_eagerly():
    eager = anchor.__dict__.setdefault("_tfra_eager_default_rows", [])
    eager.append(entry)
    del eager[:-_MAX_EAGER_DEFAULT_ROWS]
    return
  per_graph = anchor.__dict__.setdefault("_tfra_default_rows", weakref.WeakKeyDictionary())
  per_graph.setdefault(ops.get_default_graph(), []).append(entry)


def _default_rows_read_through(anchor):
  """(keys, rows) that lookups through `anchor` read for missing keys and that the current graph
  can use (its own, or an enclosing graph's); eagerly, those since the last update (taken). None
  when there are none."""
  if anchor is None:
    return None
  if tf.executing_eagerly():
    read = anchor.__dict__.pop("_tfra_eager_default_rows", [])
  else:
    read, per_graph = [], anchor.__dict__.get("_tfra_default_rows")
    graph = ops.get_default_graph()
    while per_graph is not None and graph is not None and not read:
      read = per_graph.get(graph, [])
      graph = getattr(graph, "outer_graph", None)
  if not read:
    return None
  return tf.concat([k for k, _ in read], 0), tf.concat([r for _, r in read], 0)


class VariableReads:
  """A Variable's reads: rows of keys (with the initial rows a missing key reads), sizes and
  exports. Part of Variable (variable.py), which holds the tables, codec and default rows."""

  def read_rows(self, keys, anchor=None, return_exists=False):
    """Rows of `keys` (any shape) as keys.shape + [dim] in value_dtype (and, with
    `return_exists`, whether each key had a row). With `anchor` (a wrapper variable), the rows'
    gradient reaches it, keyed by the stored keys."""
    stored = self._stored_keys(keys)
    if self.distribution is not None:  # the exchange trains the table's own anchor
      if return_exists:
        raise NotImplementedError(
          f"tf_ext.tfra Variable '{self.name}': return_exists is not offered for a table split "
          "across Horovod ranks"
        )
      return self._codec.decode(self._tables[0].lookup(stored))
    flat = tf.reshape(stored, [-1])
    if self._string_rows:
      if anchor is not None:
        raise TypeError(
          f"tf_ext.tfra Variable '{self.name}': string rows are not trained; read them with "
          "Variable.lookup"
        )
      rows, present = self._per_shard(flat, lambda table, shard_keys: table.find(shard_keys))
      rows, exists = _shaped_as(stored, rows, self.dim), _shaped_as(stored, present)
      return (rows, exists) if return_exists else rows
    anchor_value = anchor.read_for_lookup() if anchor is not None else tf.constant(0.0)
    library = _ops_loader.load()
    width = self._codec.stored_dim
    defaults = self._default_rows
    with_presence = return_exists or defaults is not None

    def find(table, shard_keys):
      if not with_presence:
        return library.tf_ext_table_find(table.resource_handle, shard_keys, anchor_value, dim=width)
      rows, present = library.tf_ext_table_find_with_presence(
        table.resource_handle, shard_keys, anchor_value, dim=width
      )
      if defaults is None:
        return rows, present
      # Drawn per shard for the shard's keys, as TFRA calls its initializer.
      return rows, present, defaults.rows(tf.shape(shard_keys))

    found = self._per_shard(flat, find)
    if with_presence:
      found, present, *default = found
    rows = self._codec.decode(_shaped_as(stored, found, width))
    if not with_presence:
      return rows
    exists = _shaped_as(stored, present)
    if defaults is not None:
      differentiable = self.value_dtype.is_floating and not self._codec.bitwise
      rows = _with_default_rows(
        rows, exists, tf.reshape(default[0], tf.shape(rows)), differentiable
      )
      if anchor is not None:
        _keep_default_rows(anchor, flat, present, default[0])
    return (rows, exists) if return_exists else rows

  def write_default_rows(self, keys, anchor=None):
    """Inserts the default row of each of `keys` (1-D, key_dtype) that has no row, so that an
    update starts from it (de.DynamicEmbeddingOptimizer calls it before a step trains `keys`
    through `anchor`): the rows the lookups through `anchor` read, where they are reachable
    here, else rows drawn now. None when the table computes its initial rows itself."""
    if self._default_rows is None:
      return None
    read = _default_rows_read_through(anchor)
    if read is not None:  # stored keys and value_dtype rows
      read_keys, read_rows = read
      return self._each_shard(
        read_keys, lambda t, k, v: t.insert(k, v), self._codec.encode(read_rows)
      )
    keys = tf.unique(tf.reshape(keys, [-1]))[0]
    rows, exists = self.read_rows(keys, return_exists=True)
    missing = tf.logical_not(exists)
    return self.upsert(tf.boolean_mask(keys, missing), tf.boolean_mask(rows, missing))

  def lookup(self, keys, return_exists=False, name=None):
    """Rows of `keys`: keys.shape + [dim]; a missing key reads its initial row. With
    `return_exists`, (rows, exists): whether each key had a row."""
    with tf.name_scope(name or f"{self._scope_name()}_lookup"):
      return self.read_rows(keys, return_exists=return_exists)

  def size(self, index=None, name=None):
    """The number of keys in table `index`, or in all of them (int64 scalar). In a TF1 graph
    the ops are made once per graph and reused, as TFRA does, so that a finalized graph
    (MonitoredTrainingSession) still answers."""
    if tf.executing_eagerly() or ops.inside_function():
      sizes = [table.size(name=name) for table in self._tables]
      return sizes[index] if index is not None else tf.add_n(sizes)
    graph = ops.get_default_graph()
    cache = self.__dict__.setdefault("_size_ops", weakref.WeakKeyDictionary())
    if graph not in cache:
      sizes = [table.size(name=name) for table in self._tables]
      cache[graph] = (sizes, tf.add_n(sizes))
    sizes, total = cache[graph]
    return sizes[index] if index is not None else total

  def export(self, name=None):
    """(keys, values) of every row, in key_dtype and value_dtype."""
    keys, values = [], []
    for table in self._tables:
      k, v = table.export(name=name)
      keys.append(k)
      values.append(v)
    keys = tf.concat(keys, 0) if len(keys) > 1 else keys[0]
    values = tf.concat(values, 0) if len(values) > 1 else values[0]
    return dtypes.to_stored(keys, self.key_dtype), self._codec.decode(values)


class AllToAllTableOfInitialRows(alltoall.AllToAllDynamicEmbeddingVariable):
  """The table of a Variable split across Horovod ranks whose initial rows TFRA's initializer
  draws (HvdAllToAllEmbedding): as TFRA's, the Variable's partitioner names each id's rank, and
  an owner reads the distinct ids it received and gives each missing one the initializer's row
  at its position (so every id starts from the row it gets in TFRA); an update first writes
  those rows."""

  def __init__(self, *args, default_rows, partition_fn, key_dtype_of_ids, **kwargs):
    self._default_rows = default_rows
    self._partition_fn, self._key_dtype_of_ids = partition_fn, key_dtype_of_ids
    super().__init__(*args, **kwargs)

  def owner_of(self, ids):
    keys = dtypes.to_stored(ids, self._key_dtype_of_ids)
    return tf.cast(self._partition_fn(keys, self.ranks), tf.int32)

  def distinct_by_owner(self, flat_ids):
    distinct, positions = tf.unique(flat_ids)
    owners = self.owner_of(distinct)
    order = tf.argsort(owners, stable=True)
    counts = tf.math.bincount(owners, minlength=self.ranks, maxlength=self.ranks, dtype=tf.int32)
    grouped_index = tf.math.invert_permutation(order)
    return tf.gather(distinct, order), tf.gather(grouped_index, positions), counts

  def owned_rows(self, received):
    distinct, positions = tf.unique(received)
    self.mark_owned(distinct)
    anchor = self.gradient_anchor.value() if self.trainable else tf.constant(0.0)
    with self.colocated():
      rows, present = _ops_loader.load().tf_ext_table_find_with_presence(
        self.resource_handle, distinct, anchor, dim=self.dim
      )
    default = self._default_rows.rows(tf.shape(distinct))
    rows = _with_default_rows(rows, present, default, differentiable=True)
    if self.trainable:
      _keep_default_rows(self.gradient_anchor, distinct, present, default)
    return tf.gather(rows, positions)

  def write_default_rows(self):
    """Writes the rows this rank's lookups read for its missing ids (into its own part), so
    that the update starts from them; None when there are none."""
    read = _default_rows_read_through(self.gradient_anchor)
    return None if read is None else table_lib.DynamicEmbeddingVariable.insert(self, *read)
