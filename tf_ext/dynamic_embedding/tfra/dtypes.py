"""The key and value dtypes a TFRA Variable may ask for, and how tf_ext tables hold them exactly.

tf_ext tables hold int64 or string keys and float32 rows. TFRA's int32 keys are held as int64. Rows
of other types are held in float32 rows without loss:
- float16, bfloat16, int8, uint8, int16 and bool rows as their float32 value (every value of those
  types is a float32 exactly);
- int32 rows as their 32 bits, and int64 and float64 rows as their 64 bits in two float32 columns
  (a bit-for-bit copy: the table copies rows, it does no arithmetic on them unless trained, and
  only float rows are trained).
String rows are held in TensorFlow's MutableHashTable (tfra/string_rows.py).
"""

import numpy as np
import tensorflow as tf

_STORED_KEYS = {tf.int64: tf.int64, tf.int32: tf.int64, tf.string: tf.string}
_BY_VALUE = (tf.float32, tf.float16, tf.bfloat16, tf.int8, tf.uint8, tf.int16, tf.bool)
_BY_BITS = {tf.int32: 1, tf.int64: 2, tf.float64: 2}  # float32 columns per value


def stored_key_dtype(variable_name, key_dtype, value_dtype):
  """The stored key dtype; TypeError (as TFRA's) for a key or value dtype not offered."""
  key_dtype, value_dtype = tf.as_dtype(key_dtype), tf.as_dtype(value_dtype)
  pair = f"key-value dtype ({key_dtype.name}-{value_dtype.name}) is not supported"
  if key_dtype not in _STORED_KEYS or (
    value_dtype not in _BY_VALUE and value_dtype not in _BY_BITS and value_dtype != tf.string
  ):
    raise TypeError(
      f"tf_ext.tfra Variable '{variable_name}': {pair}. tf_ext tables hold keys of "
      f"{sorted(d.name for d in _STORED_KEYS)} and rows of "
      f"{sorted(d.name for d in _BY_VALUE + tuple(_BY_BITS) + (tf.string,))}"
    )
  if key_dtype == tf.string and value_dtype == tf.string:
    raise TypeError(
      f"tf_ext.tfra Variable '{variable_name}': {pair}: TensorFlow's MutableHashTable, which "
      "holds string rows, has int64 keys for them"
    )
  return _STORED_KEYS[key_dtype]


def to_stored(tensor, dtype):
  """`tensor` cast to the stored `dtype` (a no-op when it has it)."""
  return tensor if tensor.dtype == dtype else tf.cast(tensor, dtype)


def trainable_rows(value_dtype):
  """Whether rows of `value_dtype` are floats an optimizer can train."""
  return tf.as_dtype(value_dtype).is_floating and tf.as_dtype(value_dtype) != tf.float64


class RowCodec:
  """Rows of a value dtype to the table's float32 rows ([n, dim] -> [n, dim * columns]) and back
  (string rows: as they are)."""

  def __init__(self, value_dtype, dim):
    self.value_dtype = tf.as_dtype(value_dtype)
    self.dim = dim
    self.columns = _BY_BITS.get(self.value_dtype, 1)
    self.bitwise = self.value_dtype in _BY_BITS
    self.stored_dtype = tf.string if self.value_dtype == tf.string else tf.float32

  @property
  def stored_dim(self):
    return self.dim * self.columns

  def encode(self, rows):
    """[..., dim] rows of value_dtype as [..., stored_dim] of stored_dtype."""
    if not self.bitwise:
      return to_stored(rows, self.stored_dtype)
    bits = tf.bitcast(rows, tf.float32)  # [..., dim] or [..., dim, 2]
    return tf.reshape(bits, tf.concat([tf.shape(rows)[:-1], [self.stored_dim]], 0))

  def decode(self, stored):
    """[..., stored_dim] float32 rows as [..., dim] of value_dtype."""
    if not self.bitwise:
      return to_stored(stored, self.value_dtype)
    if self.columns == 1:
      return tf.bitcast(stored, self.value_dtype)
    pairs = tf.reshape(stored, tf.concat([tf.shape(stored)[:-1], [self.dim, 2]], 0))
    return tf.bitcast(pairs, self.value_dtype)

  def initial_constant(self, variable_name, value):
    """The float32 constant whose stored bits read as `value` of value_dtype."""
    if not self.bitwise:
      return float(np.asarray(value, self.value_dtype.as_numpy_dtype).astype(np.float32))
    words = np.asarray([value], self.value_dtype.as_numpy_dtype).view(np.uint32)
    # One constant fills every column; a float32 signalling NaN would not keep its bits.
    signalling = (words & 0x7FC00000) == 0x7F800000
    if not np.all(words == words[0]) or (signalling & ((words & 0x003FFFFF) != 0)).any():
      raise ValueError(
        f"tf_ext.tfra Variable '{variable_name}': the initial value {value!r} of a "
        f"{self.value_dtype.name} table cannot be held; tf_ext holds these rows as their bits, "
        "and offers initial values whose 32-bit words are equal and no signalling NaN (0 and -1 "
        "are)"
      )
    return float(words[:1].view(np.float32)[0])
