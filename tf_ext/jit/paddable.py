"""The `paddable` declaration of tf_ext.jit: which axes of which arguments are which padded
dimension."""

import collections

import tensorflow as tf


class _Axes:
  """Leaf of a paddable declaration: {axis: dimension name}."""

  def __init__(self, axes):
    self.axes = dict(axes)

  def __repr__(self):
    return f"_Axes({self.axes})"


def _normalize_spec(spec, where="paddable"):
  if spec is None:
    return None
  if isinstance(spec, str):
    return _Axes({0: spec})
  if isinstance(spec, _Axes):
    return spec
  if isinstance(spec, dict) and spec and all(isinstance(k, int) for k in spec):
    for axis, dim in spec.items():
      if not isinstance(dim, str) or not dim:
        raise ValueError(f"{where}: axis {axis} must map to a dimension name, got {dim!r}")
    return _Axes(spec)
  if isinstance(spec, dict):
    return {key: _normalize_spec(value, f"{where}[{key!r}]") for key, value in spec.items()}
  if isinstance(spec, (list, tuple)):
    return type(spec)(_normalize_spec(v, f"{where}[{i}]") for i, v in enumerate(spec))
  raise ValueError(
    f"{where}: expected a dimension name, {{axis: name}}, or a nested dict/list of those; "
    f"got {spec!r}"
  )


def _leaf_axes(value, spec):
  """tf.nest.flatten(value)-aligned list of {axis: dim} (or None) from a normalized spec."""
  if spec is None:
    return [None] * len(tf.nest.flatten(value))
  if isinstance(spec, _Axes):
    return [spec.axes] * len(tf.nest.flatten(value))
  if isinstance(spec, dict):
    if not isinstance(value, collections.abc.Mapping):
      raise ValueError(f"paddable: {spec!r} is a dict but the argument is {type(value).__name__}")
    out = []
    for key in sorted(value):  # tf.nest's order for dicts
      out += _leaf_axes(value[key], spec.get(key))
    return out
  if not isinstance(value, (list, tuple)) or len(value) != len(spec):
    raise ValueError(f"paddable: {spec!r} does not match the argument's structure")
  out = []
  for item, item_spec in zip(value, spec):
    out += _leaf_axes(item, item_spec)
  return out


def _describe(dims, buckets):
  return ",".join(f"{d}={b}" for d, b in zip(dims, buckets)) or "(no padded dims)"
