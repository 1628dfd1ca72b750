"""The key and value dtypes a TFRA Variable may ask for, and how tf_ext tables hold them.

tf_ext tables hold int64 or string keys and float32 rows. TFRA's int32 keys are held as int64 and
its float16 / bfloat16 rows as float32: every value of those types converts to the stored type and
back exactly, so the conversion at the table's edge loses nothing. Other value types (integers,
float64, strings, bools as rows) are refused by name: a float32 row could not hold them exactly.
"""

import tensorflow as tf

_STORED_KEYS = {tf.int64: tf.int64, tf.int32: tf.int64, tf.string: tf.string}
_STORED_VALUES = {tf.float32: tf.float32, tf.float16: tf.float32, tf.bfloat16: tf.float32}


def stored(variable_name, key_dtype, value_dtype):
  """(stored key dtype, stored value dtype) of a Variable; TypeError (as TFRA's) for others."""
  key_dtype, value_dtype = tf.as_dtype(key_dtype), tf.as_dtype(value_dtype)
  if key_dtype not in _STORED_KEYS or value_dtype not in _STORED_VALUES:
    raise TypeError(
      f"tf_ext.tfra Variable '{variable_name}': key-value dtype ({key_dtype.name}-"
      f"{value_dtype.name}) is not supported. tf_ext tables hold keys of "
      f"{sorted(d.name for d in _STORED_KEYS)} and rows of "
      f"{sorted(d.name for d in _STORED_VALUES)} (float16 and bfloat16 rows are held as float32, "
      "exactly); keep other values in a tf.lookup.experimental.MutableHashTable"
    )
  return _STORED_KEYS[key_dtype], _STORED_VALUES[value_dtype]


def to_stored(tensor, dtype):
  """`tensor` cast to the stored `dtype` (a no-op when it has it)."""
  return tensor if tensor.dtype == dtype else tf.cast(tensor, dtype)
