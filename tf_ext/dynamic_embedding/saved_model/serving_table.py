"""ServingTable: a dynamic embedding table frozen for serving, and the row it serves ids it has no
row for (`default_row`)."""

import numpy as np
import tensorflow as tf

from tf_ext.dynamic_embedding import variable as variable_lib

_INTEGER_IDS = (tf.int8, tf.int16, tf.int32, tf.uint8, tf.uint16, tf.uint32)


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
