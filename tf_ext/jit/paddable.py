"""The `paddable` declaration of tf_ext.jit.function and tf_ext.jit.Bucketing: which axes of
which arguments are which padded dimension (tf_ext/jit/function.py's module doc gives its forms).

`normalize_spec` turns a user's declaration into a tree of `Axes` leaves; `leaf_axes` aligns that
tree with the flattened argument it describes; `describe` names a bucket in logs."""

import collections

import tensorflow as tf


class Axes:
  """Leaf of a paddable declaration: {axis: dimension name}."""

  def __init__(self, axes):
    self.axes = dict(axes)

  def __repr__(self):
    return f"Axes({self.axes})"


def normalize_spec(spec, where="paddable"):
  """`spec` (a dimension name, {axis: name}, or a nested dict/list/tuple of those) with an `Axes`
  at each leaf; ValueError naming `where` for anything else."""
  if spec is None:
    return None
  if isinstance(spec, str):
    return Axes({0: spec})
  if isinstance(spec, Axes):
    return spec
  if isinstance(spec, dict) and spec and all(isinstance(k, int) for k in spec):
    for axis, dim in spec.items():
      if not isinstance(dim, str) or not dim:
        raise ValueError(f"{where}: axis {axis} must map to a dimension name, got {dim!r}")
    return Axes(spec)
  if isinstance(spec, dict):
    return {key: normalize_spec(value, f"{where}[{key!r}]") for key, value in spec.items()}
  if isinstance(spec, (list, tuple)):
    return type(spec)(normalize_spec(v, f"{where}[{i}]") for i, v in enumerate(spec))
  raise ValueError(
    f"{where}: expected a dimension name, {{axis: name}}, or a nested dict/list of those; "
    f"got {spec!r}"
  )


def leaf_axes(value, spec):
  """tf.nest.flatten(value)-aligned list of {axis: dim} (or None) from a normalized spec."""
  if spec is None:
    return [None] * len(tf.nest.flatten(value))
  if isinstance(spec, Axes):
    return [spec.axes] * len(tf.nest.flatten(value))
  if isinstance(spec, dict):
    if not isinstance(value, collections.abc.Mapping):
      raise ValueError(f"paddable: {spec!r} is a dict but the argument is {type(value).__name__}")
    out = []
    for key in sorted(value):  # tf.nest's order for dicts
      out += leaf_axes(value[key], spec.get(key))
    return out
  if not isinstance(value, (list, tuple)) or len(value) != len(spec):
    raise ValueError(f"paddable: {spec!r} does not match the argument's structure")
  out = []
  for item, item_spec in zip(value, spec):
    out += leaf_axes(item, item_spec)
  return out


def describe(dims, buckets):
  """A bucket (or sizes) for logs: "batch=8,seq=32"."""
  return ",".join(f"{d}={b}" for d, b in zip(dims, buckets)) or "(no padded dims)"
