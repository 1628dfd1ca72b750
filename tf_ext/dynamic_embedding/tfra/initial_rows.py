"""TFRA's `initializer` argument as a tf_ext initializer spec.

TFRA takes a number, an array of `dim` values, a TF or Keras initializer object, or a callable, and
looks missing keys up as that (None: zeros). tf_ext tables compute a missing key's row from the key
and a seed inside the table, so:
- numbers, constant arrays and Zeros / Ones / Constant give exactly TFRA's rows;
- RandomNormal, TruncatedNormal and RandomUniform give rows of the same distribution, drawn per key
  (TFRA draws anew at every lookup, so a key missing twice reads two different rows there; here it
  reads the same row, which is the row it gets when first trained). Without a seed, the seed comes
  from the table's name, so two tables do not start with the same rows for the same id.
- VarianceScaling initializers (Glorot, He, Lecun) draw from their distribution for a row of `dim`
  values (TFRA's scale depends on the number of keys looked up);
- what the table cannot compute itself (an array whose `dim` values differ, an int64 or float64
  constant whose two 32-bit words differ, a random initializer of float64 rows) is a default row
  the Variable adds outside the table (`plan`, `DefaultRows`): a missing key reads it (float64
  random rows drawn anew at every lookup, as TFRA draws them), and de.DynamicEmbeddingOptimizer
  writes it into the table before a key's first update, so that the update starts from it.
"""

import hashlib
import math
import numbers

import numpy as np
import tensorflow as tf

from tf_ext.dynamic_embedding import initializers

_UNIFORM_CLASSES = ("RandomUniform", "random_uniform_initializer")


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
  scale = getattr(initializer, "scale", None)
  distribution = getattr(initializer, "distribution", None)
  if scale is None or distribution is None or not hasattr(initializer, "mode"):
    return None
  variance = float(scale) / dim
  if distribution == "uniform":
    limit = math.sqrt(3.0 * variance)
    return initializers.InitializerSpec("uniform", -limit, limit, 0)
  if distribution in ("normal", "untruncated_normal"):
    return initializers.InitializerSpec("normal", 0.0, math.sqrt(variance), 0)
  # The stddev of a normal truncated at two standard deviations (TensorFlow's constant).
  return initializers.InitializerSpec(
    "truncated_normal", 0.0, math.sqrt(variance) / 0.87962566103423978, 0
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
  """The row a missing key reads where the table cannot compute it: a constant row of `dim`
  values, or (float64 rows) random rows of `kind` with parameters a and b, drawn at each call."""

  def __init__(self, value_dtype, dim, constant=None, random=None):
    self.value_dtype, self.dim = tf.as_dtype(value_dtype), dim
    self.constant = None if constant is None else np.asarray(constant).reshape([dim])
    self.random = random

  def rows(self, shape):
    """Rows for keys of `shape` (a 1-D int tensor): shape + [dim] of value_dtype."""
    full = tf.concat([tf.cast(shape, tf.int32), [self.dim]], 0)
    if self.constant is not None:
      return tf.broadcast_to(tf.constant(self.constant, self.value_dtype), full)
    kind, a, b = self.random.kind, self.random.a, self.random.b
    if kind == "uniform":
      return tf.random.uniform(full, a, b, dtype=self.value_dtype)
    if kind == "normal":
      return tf.random.normal(full, a, b, dtype=self.value_dtype)
    return tf.random.truncated_normal(full, a, b, dtype=self.value_dtype)


def plan(initializer, name, dim, codec):
  """(InitializerSpec the table computes, DefaultRows or None) of TFRA's `initializer`: with
  DefaultRows, the table's spec is zeros and the Variable gives missing keys those rows."""
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
  if found.kind in _RANDOM_KINDS and codec.bitwise:  # float64 rows, held as bits
    return _ZEROS, DefaultRows(codec.value_dtype, dim, random=found)
  return found, None
