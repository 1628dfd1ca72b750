"""TFRA's `initializer` argument as a tf_ext initializer spec, or as rows drawn per lookup.

TFRA takes a number, an array of `dim` values, a TF or Keras initializer object, or a callable, and
looks missing keys up as that (None: zeros). tf_ext tables compute a missing key's row from the key
and a seed inside the table, so:
- numbers, constant arrays and Zeros / Ones / Constant give exactly TFRA's rows, in the table;
- a random initializer object (RandomNormal, TruncatedNormal, RandomUniform, the VarianceScaling
  family: Glorot, He, Lecun) is called as TFRA calls it, for each lookup's keys of each shard
  (shape [keys, dim]), and a missing key reads the row at its position (`DefaultRows`): a Keras
  initializer gives the same values at every call, so every id new at position i of a lookup starts
  from the same row; a TensorFlow initializer draws anew; VarianceScaling scales by the number of
  keys looked up. de.DynamicEmbeddingOptimizer writes the row a key read into the table before its
  first update, so that the update starts from it, as in TFRA (a table split across Horovod
  ranks draws on each owner for the distinct ids it received, as TFRA's HvdAllToAllEmbedding).
  With the setting TF_EXT_TFRA_INITIAL_ROWS=per_key the table computes a row of the same
  distribution per key instead (a key reads the same row at every lookup; VarianceScaling takes
  fan in and fan out from `dim`), which is faster;
- what the table cannot compute itself (an array whose `dim` values differ, an int64 or float64
  constant whose two 32-bit words differ, a random initializer of float64 rows) is a default row
  the Variable adds outside the table as well.
"""

import hashlib
import math
import numbers

import numpy as np
import tensorflow as tf

from tf_ext import settings
from tf_ext.dynamic_embedding import initializers

_UNIFORM_CLASSES = ("RandomUniform", "random_uniform_initializer")
# The standard deviation of a unit normal truncated at two standard deviations (TensorFlow's).
_TRUNCATED_NORMAL_STDDEV = 0.87962566103423978


def _seed_of_name(name):
  return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:4], "little") & 0x7FFFFFFF


class _NotComputedInTable(ValueError):
  """An initializer the table cannot compute per key: `values` is the row of `dim` values."""

  def __init__(self, message, values):
    super().__init__(message)
    self.values = values


def _constant_of(values, name, dim):
  given = np.asarray(values).reshape(-1)
  values = given.astype(np.float64)
  if values.size not in (1, dim):
    raise ValueError(
      f"tf_ext.tfra Variable '{name}': initializer has {values.size} values; "
      f"give one value or dim={dim} values"
    )
  if not np.all(values == values[0]):
    raise _NotComputedInTable(
      f"tf_ext.tfra Variable '{name}': the table computes no row of {dim} different values",
      given,
    )
  return initializers.InitializerSpec("constant", float(values[0]), 0.0, 0)


def _variance_scaling(initializer, dim):
  """The spec of a VarianceScaling initializer (Glorot, He and Lecun are ones) for a row of `dim`
  values: fan in and fan out are `dim`, as TensorFlow computes them for a shape of [dim]. (TFRA
  draws [keys of the batch, dim], so its scale changes with the number of keys.) None for
  other initializers."""
  if not _is_variance_scaling(initializer):
    return None
  distribution = initializer.distribution
  variance = float(initializer.scale) / dim
  if distribution == "uniform":
    limit = math.sqrt(3.0 * variance)
    return initializers.InitializerSpec("uniform", -limit, limit, 0)
  if distribution in ("normal", "untruncated_normal"):
    return initializers.InitializerSpec("normal", 0.0, math.sqrt(variance), 0)
  return initializers.InitializerSpec(
    "truncated_normal", 0.0, math.sqrt(variance) / _TRUNCATED_NORMAL_STDDEV, 0
  )


def _spec(initializer, name, dim):
  if initializer is None:
    return initializers.InitializerSpec("zeros", 0.0, 0.0, 0)
  if isinstance(initializer, (numbers.Real, np.bool_)):  # bool too: the default of bool rows
    return initializers.InitializerSpec("constant", float(initializer), 0.0, 0)
  if isinstance(initializer, (list, tuple, np.ndarray)):
    return _constant_of(initializer, name, dim)
  if isinstance(initializer, (tf.Tensor, tf.Variable)):
    value = tf.get_static_value(initializer)
    if value is None:
      raise ValueError(
        f"tf_ext.tfra Variable '{name}': an initializer tensor must be a constant, "
        "known when the table is created"
      )
    return _constant_of(value, name, dim)
  if hasattr(initializer, "get_config"):
    config = initializer.get_config()
    if type(initializer).__name__ in _UNIFORM_CLASSES and config.get("maxval") is None:
      # TensorFlow's uniform initializers take maxval None for 1 (float values).
      initializer = type(initializer)(**{**config, "maxval": 1.0})
    base = _variance_scaling(initializer, dim) or initializers.spec_from(initializer, dim, name)
    seed = initializer.get_config().get("seed")
    if seed is not None:
      base = base._replace(seed=int(seed))
    if seed is None and base.kind in ("uniform", "normal", "truncated_normal"):
      base = base._replace(seed=_seed_of_name(name))
    return base
  if callable(initializer):  # TFRA calls a plain function for its value
    try:
      value = initializer(shape=[dim])
    except TypeError:
      value = initializer()
    return _spec(value, name, dim)
  raise TypeError(
    f"tf_ext.tfra Variable '{name}': initializer must be a number, an array, a tensor or an "
    f"initializer object, got {type(initializer).__name__}"
  )


_RANDOM_KINDS = ("uniform", "normal", "truncated_normal")
_ZEROS = initializers.InitializerSpec("zeros", 0.0, 0.0, 0)


class DefaultRows:
  """The rows missing keys read where the table does not compute them: a constant row of `dim`
  values, random rows of `random`'s kind (an InitializerSpec, for float64 rows) drawn at each call,
  or the rows of TFRA's `initializer` object called for the keys' shape, as TFRA calls it."""

  def __init__(self, value_dtype, dim, constant=None, random=None, initializer=None):
    self.value_dtype, self.dim = tf.as_dtype(value_dtype), dim
    self.constant = None if constant is None else np.asarray(constant).reshape([dim])
    self.random = random
    self.initializer = initializer

  def rows(self, shape):
    """Rows for keys of `shape` (a 1-D int tensor): shape + [dim] of value_dtype."""
    full = tf.concat([tf.cast(shape, tf.int32), [self.dim]], 0)
    if self.constant is not None:
      return tf.broadcast_to(tf.constant(self.constant, self.value_dtype), full)
    if self.initializer is not None:
      return tf.reshape(self._called(tf.reduce_prod(shape)), full)
    kind, a, b = self.random.kind, self.random.a, self.random.b
    if kind == "uniform":
      return tf.random.uniform(full, a, b, dtype=self.value_dtype)
    if kind == "normal":
      return tf.random.normal(full, a, b, dtype=self.value_dtype)
    return tf.random.truncated_normal(full, a, b, dtype=self.value_dtype)

  def _called(self, count):
    """[count, dim] rows of the initializer, called for shape [count, dim] as TFRA calls it."""
    if _is_variance_scaling(self.initializer):
      values = _variance_scaling_rows(self.initializer, count, self.dim)
    else:
      try:
        values = self.initializer([count, self.dim])
      except (TypeError, ValueError):  # TFRA's fallback: one row for every key
        values = self.initializer([self.dim])
    values = tf.cast(values, self.value_dtype)
    return tf.broadcast_to(values, tf.stack([count, self.dim]))


def _is_variance_scaling(initializer):
  return all(hasattr(initializer, a) for a in ("scale", "mode", "distribution"))


def _variance_scaling_rows(initializer, count, dim):
  """A VarianceScaling initializer's [count, dim] rows with fan in `count` (a tensor) and fan out
  `dim`, as TFRA draws them (TFRA patches TensorFlow's VarianceScaling classes to take a dynamic
  shape; tf_ext patches nothing and draws the same here). Keras initializers draw through their
  own generator, so they repeat their values at every call as they do."""
  fan_in, fan_out = tf.cast(count, tf.float32), float(dim)
  fans = {"fan_in": fan_in, "fan_out": fan_out}.get(initializer.mode, (fan_in + fan_out) / 2.0)
  scale = float(initializer.scale) / tf.maximum(1.0, fans)
  shape = tf.stack([count, dim])
  generator = getattr(initializer, "_random_generator", None)
  seed = getattr(initializer, "seed", None)
  if initializer.distribution in ("normal", "truncated_normal"):  # "normal": TF1's truncated
    stddev = tf.sqrt(scale) / _TRUNCATED_NORMAL_STDDEV
    if generator is not None:
      return generator.truncated_normal(shape, 0.0, stddev, tf.float32)
    return tf.random.truncated_normal(shape, 0.0, stddev, seed=seed)
  if initializer.distribution == "untruncated_normal":
    if generator is not None:
      return generator.random_normal(shape, 0.0, tf.sqrt(scale), tf.float32)
    return tf.random.normal(shape, 0.0, tf.sqrt(scale), seed=seed)
  limit = tf.sqrt(3.0 * scale)
  if generator is not None:
    return generator.random_uniform(shape, -limit, limit, tf.float32)
  return tf.random.uniform(shape, -limit, limit, seed=seed)


def drawn_per_lookup():
  """Whether random initializer objects are called per lookup, as TFRA does
  (TF_EXT_TFRA_INITIAL_ROWS)."""
  return settings.get("TF_EXT_TFRA_INITIAL_ROWS") == "tfra"


def plan(initializer, name, dim, codec, per_lookup=False):
  """(InitializerSpec the table computes, DefaultRows or None) of TFRA's `initializer`: with
  DefaultRows, the table's spec is zeros and the Variable gives missing keys those rows. With
  `per_lookup`, a random initializer object is called for each lookup's keys, as TFRA calls it."""
  try:
    found = _spec(initializer, name, dim)
  except _NotComputedInTable as error:
    constant = np.asarray(error.values).astype(codec.value_dtype.as_numpy_dtype)
    return _ZEROS, DefaultRows(codec.value_dtype, dim, constant=constant)
  if found.kind == "constant":
    try:
      return found._replace(a=codec.initial_constant(name, found.a)), None
    except ValueError:  # a 64-bit constant whose words differ
      constant = np.full([dim], found.a, codec.value_dtype.as_numpy_dtype)
      return _ZEROS, DefaultRows(codec.value_dtype, dim, constant=constant)
  if found.kind != "zeros" and not codec.value_dtype.is_floating:
    raise ValueError(
      f"tf_ext.tfra Variable '{name}': a {found.kind} initializer for {codec.value_dtype.name} "
      "rows is not offered; give a number"
    )
  if found.kind in _RANDOM_KINDS and per_lookup and hasattr(initializer, "get_config"):
    return _ZEROS, DefaultRows(codec.value_dtype, dim, initializer=initializer)
  if found.kind in _RANDOM_KINDS and codec.bitwise:  # float64 rows, held as bits
    return _ZEROS, DefaultRows(codec.value_dtype, dim, random=found)
  return found, None
