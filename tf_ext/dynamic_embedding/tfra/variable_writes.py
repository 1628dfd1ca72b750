"""A Variable's writes: rows set, accumulated and removed, and saved to and loaded from files."""

import tensorflow as tf
from tensorflow.python.platform import tf_logging

from tf_ext.dynamic_embedding.tfra import dtypes, file_system


class VariableWrites:
  """A Variable's writes: upsert, accum, remove, clear, restrict, and TFRA's file system
  methods. Part of Variable (variable.py), which holds the tables and codec."""

  def _rows(self, keys, values):
    """`values` (keys.shape + [dim]) as [n, dim] of value_dtype (lists and arrays converted, as
    TFRA converts them); InvalidArgumentError for another shape."""
    try:
      values = tf.convert_to_tensor(values, None if tf.is_tensor(values) else self.value_dtype)
    except (TypeError, ValueError) as error:
      raise ValueError(f"tf_ext.tfra Variable '{self.name}': bad values: {error}") from None
    if values.dtype != self.value_dtype:
      raise ValueError(
        f"tf_ext.tfra Variable '{self.name}': values must be {self.value_dtype.name}, got "
        f"{values.dtype.name}"
      )
    expected = keys.shape.concatenate([self.dim])
    if not values.shape.is_compatible_with(expected):
      raise tf.errors.InvalidArgumentError(
        None,
        None,
        f"tf_ext.tfra Variable '{self.name}': Expected shape {expected} for values, "
        f"got {values.shape}",
      )
    if not values.shape.is_fully_defined() or not keys.shape.is_fully_defined():
      check = tf.debugging.assert_equal(
        tf.shape(values),
        tf.concat([tf.shape(keys), [self.dim]], 0),
        message=f"tf_ext.tfra Variable '{self.name}': Expected shape keys.shape + [dim] for values",
      )
      with tf.control_dependencies([check]):
        values = tf.identity(values)
    return tf.reshape(values, [-1, self.dim])

  def upsert(self, keys, values, name=None):
    """Sets the rows of `keys` to `values` (keys.shape + [dim]), inserting missing keys."""
    keys = self._stored_keys(keys)
    values = self._codec.encode(self._rows(keys, values))
    keys = tf.reshape(keys, [-1])
    return self._each_shard(keys, lambda t, k, v: t.insert(k, v, name=name), values)

  def accum(self, keys, old_values, new_values, exists, name=None):
    """TFRA's update for asynchronous training, by what `exists` says a lookup found: a key that
    existed and still has a row gets `new_values - old_values` added; a key that did not exist
    and still has none gets `new_values`; the others (removed or inserted by another writer since
    the lookup) are left as they are. Not atomic against concurrent writers of the same keys: a
    read and an insert."""
    del name
    if self._string_rows:
      raise TypeError(f"tf_ext.tfra Variable '{self.name}': accum adds rows; these are strings")
    keys = self._stored_keys(keys)
    old, new = self._rows(keys, old_values), self._rows(keys, new_values)
    keys = tf.reshape(keys, [-1])
    existed = tf.reshape(tf.convert_to_tensor(exists, tf.bool), [-1])
    current, present = self.read_rows(dtypes.to_stored(keys, self.key_dtype), return_exists=True)
    current = tf.reshape(current, [-1, self.dim])
    write = tf.equal(existed, present)
    rows = tf.where(existed[:, None], current + (new - old), new)
    rows = self._codec.encode(tf.boolean_mask(rows, write))
    return self._each_shard(tf.boolean_mask(keys, write), lambda t, k, v: t.insert(k, v), rows)

  def remove(self, keys, name=None):
    """Removes `keys` (missing ones are ignored)."""
    keys = tf.reshape(self._stored_keys(keys), [-1])
    return self._each_shard(keys, lambda t, k: t.remove(k, name=name))

  def clear(self, name=None):
    """Removes every key."""
    return tf.group([table.clear(name=name) for table in self._tables])

  def restrict(self, num_reserved, **kwargs):
    """Keeps at most `num_reserved` rows, chosen by the Variable's restrict policy (None and a
    warning without one, as in TFRA)."""
    if self._restrict_policy is None:
      tf_logging.warning("Call restrict without setting restrict policy.")
      return None
    return self._restrict_policy.apply_restriction(num_reserved, **kwargs)

  def save_to_file_system(
    self,
    dirpath,
    proc_size=1,
    proc_rank=0,
    file_name_list=None,
    dirpath_env=file_system.DIRPATH_ENV,
    append_to_file=False,
    buffer_size=file_system.DEFAULT_BUFFER_SIZE,
    name=None,
  ):
    """Writes each table's keys and rows as TFRA's key and value files in `dirpath`, table i of n
    as `<its name, _mht_<i>of<n>_rank<proc_rank>_size<proc_size>>-keys` and `-values` (or the
    names of `file_name_list`). Rows only: a checkpoint keeps the optimizer's slots too."""
    return file_system.save_variable(
      self,
      dirpath,
      proc_size,
      proc_rank,
      file_name_list,
      dirpath_env=dirpath_env,
      append_to_file=append_to_file,
      buffer_size=buffer_size,
      name=name,
    )

  def load_from_file_system(
    self,
    dirpath,
    proc_size=1,
    proc_rank=0,
    file_name_list=None,
    dirpath_env=file_system.DIRPATH_ENV,
    load_entire_dir=False,
    buffer_size=file_system.DEFAULT_BUFFER_SIZE,
    name=None,
  ):
    """Sets the rows of the keys in the files save_to_file_system writes (with the same
    arguments), each table from its own; other keys keep their rows."""
    return file_system.load_variable(
      self,
      dirpath,
      proc_size,
      proc_rank,
      file_name_list,
      dirpath_env=dirpath_env,
      load_entire_dir=load_entire_dir,
      buffer_size=buffer_size,
      name=name,
    )

  def load_from_file_system_with_restore_function(
    self, dirpath, proc_size=1, proc_rank=0, buffer_size=file_system.DEFAULT_BUFFER_SIZE
  ):
    """Sets the rows of every key in this Variable's files in `dirpath` (of any number of tables,
    ranks and sizes) that its partitioner gives `proc_rank` of `proc_size`, each in the table its
    partitioner gives it now."""
    del buffer_size
    return file_system.load_variable_files(self, dirpath, proc_size, proc_rank)
