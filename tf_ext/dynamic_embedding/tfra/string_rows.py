"""String rows of a TFRA Variable (`value_dtype=tf.string`), held in TensorFlow's own
MutableHashTable: tf_ext tables hold numeric rows, and string rows are neither trained nor
exchanged, so they need none of a tf_ext table's machinery. A shard offers what a tf_ext.tfra
Variable asks of its tables (insert, remove, size, export, clear, colocated) and `find`, the rows
of keys with whether each had one; it is saved as the MutableHashTable is (Saver, Checkpoint)."""

import contextlib
import functools

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import ops
from tensorflow.python.trackable import base as trackable
from tensorflow.python.training.saving import saveable_object_util

# Two defaults no row equals both of: a key is missing where the lookup gave each its own default.
_ABSENT = (b"\x00tf_ext.tfra:absent:0", b"\x00tf_ext.tfra:absent:1")


def default_row(variable_name, initializer, dim):
  """The [dim] strings a missing key reads: TFRA's initializer of string rows (None: empty
  strings; a string, bytes or number; or one value per column)."""
  if initializer is None:
    return [b""] * dim
  values = np.asarray(initializer)
  if callable(initializer) or values.dtype == object and not values.shape:
    raise TypeError(
      f"tf_ext.tfra Variable '{variable_name}': string rows take a constant initializer (a "
      f"string, a number, or {dim} of them), got {initializer!r}"
    )
  values = values.reshape([-1])
  if values.size not in (1, dim):
    raise ValueError(
      f"tf_ext.tfra Variable '{variable_name}': the initializer of rows of {dim} strings has "
      f"{values.size} values; give 1 or {dim}"
    )
  row = [v if isinstance(v, bytes) else str(v).encode() for v in values.tolist()]
  return row * dim if len(row) == 1 else row


class StringRowsTable(trackable.Trackable):
  """One shard of string rows: a MutableHashTable of [dim] string rows."""

  def __init__(self, name, dim, key_dtype, default):
    self.name = name
    self.dim = dim
    self.key_dtype = key_dtype
    self._graph = None if tf.executing_eagerly() else ops.get_default_graph()
    self._default = tf.constant(default, tf.string)
    self._table = tf.lookup.experimental.MutableHashTable(
      key_dtype, tf.string, default_value=self._default, name=name
    )
    self._track_trackable(self._table, "table")

  @property
  def resource_handle(self):
    return self._table.resource_handle

  def colocated(self):
    """A context placing new ops with the table (graph mode; eager places by the handle)."""
    if tf.executing_eagerly():
      return contextlib.nullcontext()
    return ops.colocate_with(self._table.resource_handle)

  def find(self, keys):
    """(rows [n, dim], present [n]) of 1-D `keys`; a missing key reads the default row."""
    shape = tf.concat([tf.shape(keys), [self.dim]], 0)
    found = [self._table.lookup(keys, dynamic_default_values=tf.fill(shape, a)) for a in _ABSENT]
    absent = tf.logical_and(
      tf.reduce_all(tf.equal(found[0], _ABSENT[0]), -1),
      tf.reduce_all(tf.equal(found[1], _ABSENT[1]), -1),
    )
    rows = tf.where(absent[:, None], tf.broadcast_to(self._default, shape), found[0])
    return rows, tf.logical_not(absent)

  def insert(self, keys, values, name=None):
    return self._table.insert(keys, values, name=name)

  def remove(self, keys, name=None):
    return self._table.remove(keys, name=name)

  def size(self, name=None):
    return self._table.size(name=name)

  def export(self, name=None):
    return self._table.export(name=name)

  def clear(self, name=None):
    with tf.name_scope(name or f"{self.name}_clear"):
      return self._table.remove(self._table.export()[0])

  def _gather_saveables_for_checkpoint(self):
    """The MutableHashTable's, for tf.compat.v1.train.Saver(var_list=[variable, ...]) in the
    graph the table lives in; nothing elsewhere (tf.train.Checkpoint saves the MutableHashTable,
    a child)."""
    if self._graph is None or ops.get_default_graph() is not self._graph:
      return {}
    factories = saveable_object_util.saveable_objects_from_trackable(self._table)
    # Under the table's name, as tf_ext tables are: the Saver gives none.
    return {key: functools.partial(make, name=self.name) for key, make in factories.items()}
