"""The padding contract that dynamic embedding lookups and tf_ext.jit share.

tf_ext.jit pads declared dimensions (batch, sequence length) to a few bucket sizes. Code that runs
on padded tensors reads the true sizes through these helpers, and they work the same unpadded, so
a model has one code path:

* `size(dim)`: the true size of `dim` in this call, a scalar int32 tensor;
* `mask(dim)`: bool over the padded length of `dim`, True at real positions;
* `masked_sum(values, dim, axis)` / `masked_mean(...)`: reductions that leave padded positions out
  (outside a padding context: tf.reduce_sum / tf.reduce_mean);
* `padded_extent(tensor)`: which axes of `tensor` are padded and their true sizes (lookups use it
  to look up the real ids of a padded id tensor only).

A padding context is active inside a tf_ext.jit function and a tf_ext.jit.Bucketing.padded block:
they make a `Context` and enter it with `active(context)`. tf_ext.jit exports the helpers
(tf_ext.jit.size, ...); this module is their home so that tables can read them without depending
on tf_ext.jit.
"""

import contextlib
import threading

import tensorflow as tf

# The name scope of the helpers' ops: scans of a traced function tell them from the model's own.
HELPER_SCOPE = "tf_ext_jit_helper"

_local = threading.local()


class Context:
  """The padded dimensions of one call (a tf_ext.jit function's, or a Bucketing.padded block's)."""

  def __init__(self, dims, sizes, lengths, padded_inputs):
    self.dims = dims  # dimension names, in the order of `sizes`
    self.sizes = sizes  # int32 [len(dims)] tensor: the true sizes
    self.lengths = lengths  # dim -> (tensor, axis) holding it (padded length)
    self.padded_inputs = padded_inputs  # tensor.ref() -> {axis: dim} of the padded inputs


def _context(dim):
  stack = getattr(_local, "stack", None)
  if not stack:
    raise RuntimeError(
      "tf_ext.jit.size/mask/masked_* work only inside a function made by tf_ext.jit.function"
    )
  ctx = stack[-1]
  if dim not in ctx.dims:
    raise ValueError(
      f"tf_ext.jit: {dim!r} is not a padded dimension of this function (it has {ctx.dims}); "
      "declare it in `paddable`"
    )
  return ctx


def size(dim="batch"):
  """The true (unpadded) size of dimension `dim` in this call: a scalar int32 tensor."""
  ctx = _context(dim)
  with tf.name_scope(HELPER_SCOPE):
    return ctx.sizes[ctx.dims.index(dim)]


def _padded_length(ctx, dim):
  tensor, axis = ctx.lengths[dim]
  if axis is None:  # the length itself (a scalar tensor)
    return tensor
  static = tensor.shape[axis]
  return static if static is not None else tf.shape(tensor)[axis]


def mask(dim="batch"):
  """Bool vector over the (padded) length of `dim`: True at the call's real positions."""
  ctx = _context(dim)
  with tf.name_scope(HELPER_SCOPE):
    return tf.range(_padded_length(ctx, dim)) < ctx.sizes[ctx.dims.index(dim)]


def _masked(values, dim, axis):
  values = tf.convert_to_tensor(values)
  rank = values.shape.rank
  axis = axis % rank
  shape = [1] * rank
  shape[axis] = -1
  valid = tf.reshape(mask(dim), shape)
  with tf.name_scope(HELPER_SCOPE):
    return tf.where(valid, values, tf.zeros_like(values)), valid


def inside():
  """Whether a padding context is active (inside a tf_ext.jit function or a Bucketing.padded
  block)."""
  return bool(getattr(_local, "stack", None))


# Ops whose output keeps every axis of their first input (ids cast, hashed or renamed).
_AXES_KEEPING_OPS = frozenset(
  {
    "Identity",
    "Cast",
    "AsString",
    "StringToHashBucket",
    "StringToHashBucketFast",
    "StringToHashBucketStrong",
  }
)


def _axes_through_strided_slice(op, axes):
  """{output axis: dim} of the padded `axes` of a StridedSlice's input that it keeps whole
  (x[:, i] and x[:, :3] keep axis 0); None where it cuts into one, uses an ellipsis or a new axis,
  or is not constant."""
  begin, end, strides = (tf.get_static_value(t) for t in op.inputs[1:4])
  if begin is None or end is None or strides is None:
    return None
  masks = {m: op.get_attr(m) for m in ("begin_mask", "end_mask", "shrink_axis_mask")}
  if op.get_attr("ellipsis_mask") or op.get_attr("new_axis_mask"):
    return None
  rank = op.inputs[0].shape.rank
  if rank is None:
    return None
  out, output_axis = {}, 0
  for axis in range(rank):
    sliced = axis < len(begin)
    if sliced and masks["shrink_axis_mask"] >> axis & 1:
      if axis in axes:
        return None
      continue
    whole = not sliced or (
      masks["begin_mask"] >> axis & 1 and masks["end_mask"] >> axis & 1 and strides[axis] == 1
    )
    if axis in axes:
      if not whole:
        return None
      out[output_axis] = axes[axis]
    output_axis += 1
  return out


def _padded_axes(ctx, tensor, depth=16):
  """{axis: dim} of `tensor`: a padded input of `ctx`, or a short chain of casts, string hashes
  and slices that keep those axes whole from one."""
  axes = ctx.padded_inputs.get(tensor.ref())
  if axes is not None or depth == 0:
    return axes or {}
  op = tensor.op
  if op.type in _AXES_KEEPING_OPS:
    return _padded_axes(ctx, op.inputs[0], depth - 1)
  if op.type == "StridedSlice":
    axes = _padded_axes(ctx, op.inputs[0], depth - 1)
    return (_axes_through_strided_slice(op, axes) or {}) if axes else {}
  return {}


def padded_extent(tensor):
  """{axis: (true size, padded length)} of the padded dimensions that `tensor` carries inside a
  tf_ext.jit function or a Bucketing.padded block (see _padded_axes); {} anywhere else. Lookups
  use it to look up the real ids of a padded dense id tensor only."""
  stack = getattr(_local, "stack", None)
  if not stack or not isinstance(tensor, tf.Tensor) or tf.executing_eagerly():
    return {}
  ctx = stack[-1]
  out = {}
  for axis, dim in _padded_axes(ctx, tensor).items():
    if dim in ctx.dims:
      with tf.name_scope(HELPER_SCOPE):  # a padded length the model may use
        length = tensor.shape[axis] if tensor.shape[axis] is not None else tf.shape(tensor)[axis]
      out[axis] = (ctx.sizes[ctx.dims.index(dim)], length)
  return out


def masked_sum(values, dim="batch", axis=0):
  """Sum of `values` over all its elements but those at padded positions of `dim` on `axis`.
  Outside a tf_ext.jit function (nothing is padded there): tf.reduce_sum(values)."""
  if not inside():
    return tf.reduce_sum(values)
  masked, _ = _masked(values, dim, axis)
  with tf.name_scope(HELPER_SCOPE):
    return tf.reduce_sum(masked)


def masked_mean(values, dim="batch", axis=0):
  """Mean of `values` over its real elements: what tf.reduce_mean gives on the unpadded tensor
  (`dim` on `axis`); e.g. a batch-mean loss from per-example losses. Outside a tf_ext.jit
  function (nothing is padded there): tf.reduce_mean(values)."""
  if not inside():
    return tf.reduce_mean(values)
  values = tf.convert_to_tensor(values)
  masked, _ = _masked(values, dim, axis)
  with tf.name_scope(HELPER_SCOPE):
    length = tf.cast(_padded_length(_context(dim), dim), values.dtype)
    per_position = tf.cast(tf.size(values), values.dtype) / length
    count = tf.cast(size(dim), values.dtype) * per_position
    return tf.reduce_sum(masked) / count


@contextlib.contextmanager
def active(context):
  """Makes `context` the padding context of this thread inside the `with` block."""
  stack = _local.__dict__.setdefault("stack", [])
  stack.append(context)
  try:
    yield context
  finally:
    stack.pop()
