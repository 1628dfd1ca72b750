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
- an array whose `dim` values differ has no per-key spec: it is refused by name.
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


def _constant_of(values, name, dim):
  values = np.asarray(values, dtype=np.float64).reshape(-1)
  if values.size not in (1, dim):
    raise ValueError(
      f"tf_ext.tfra Variable '{name}': initializer has {values.size} values; "
      f"give one value or dim={dim} values"
    )
  if not np.all(values == values[0]):
    raise ValueError(
      f"tf_ext.tfra Variable '{name}': an initializer whose {dim} values differ "
      f"({values[:4].tolist()}...) is not offered: tf_ext computes each missing key's row inside "
      "the table from one value or a distribution; use a number, tf.keras.initializers.Constant, "
      "RandomNormal, TruncatedNormal or RandomUniform"
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


def spec(initializer, name, dim, codec):
  """The InitializerSpec of TFRA's `initializer` for the table `name` of width `dim`, whose rows
  `codec` (dtypes.RowCodec) stores."""
  found = _spec(initializer, name, dim)
  if found.kind == "constant":
    return found._replace(a=codec.initial_constant(name, found.a))
  if found.kind != "zeros" and not codec.value_dtype.is_floating:
    raise ValueError(
      f"tf_ext.tfra Variable '{name}': a {found.kind} initializer for {codec.value_dtype.name} "
      "rows is not offered; give a number"
    )
  return found


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
