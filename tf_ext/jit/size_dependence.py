"""Batch-size dependence detection: which padded dimensions a function may not be padded on.

A tf_ext.jit function is traced once with each padded dimension at a distinct probe size (a prime
no real size equals, `probe_sizes`); `probe` scans that trace for a probe size reaching a value
the function computes (`depends_on_size`; `reaches_values` follows integer shape arithmetic) and
reads which output axes carry a padded dimension (`output_axes`), then drops the dimensions found
from the signature's padded ones, with a warning and a "not padded" event each. What it can and
cannot see is part of the padding contract (tf_ext/jit/function.py's module doc).

A TF1 graph padded by tf_ext.jit.Bucketing has no probe sizes, but its batch axis has no static
size: `batch_size_dependent_ops` scans a model_fn's ops for what padded rows would change.
"""

import logging

import numpy as np
import tensorflow as tf

from tf_ext import padding

logger = logging.getLogger("tf_ext.jit")

# Inputs that take a shape, a length or an axis: a padded size arriving there builds tensors of
# the padded shape, which is how padding works (op type -> input indices; None: all inputs).
_SHAPE_INPUTS = {
  "Reshape": (1,),
  "BroadcastTo": (1,),
  "Fill": (0,),
  "Tile": (1,),
  "Range": None,
  "ExpandDims": (1,),
  "Slice": (1, 2),
  "StridedSlice": (1, 2, 3),
  "Pad": (1,),
  "PadV2": (1,),
  "Transpose": (1,),
  "OneHot": (1,),
  "Sum": (1,),
  "Mean": (1,),
  "Max": (1,),
  "Min": (1,),
  # num_segments: the number of output rows (padded rows get no segment, hence zeros).
  "UnsortedSegmentSum": (2,),
  "UnsortedSegmentMax": (2,),
  "UnsortedSegmentMin": (2,),
  "UnsortedSegmentProd": (2,),
  "SparseSegmentSumWithNumSegments": (3,),
  "SparseSegmentMeanWithNumSegments": (3,),
  "SparseSegmentSqrtNWithNumSegments": (3,),
  "TfExtEmbeddingField": (5,),
  "TfExtEmbeddingRowsGradient": (4,),
  "RandomUniform": (0,),
  "RandomStandardNormal": (0,),
  "StatelessRandomUniformV2": (0,),
  "StatelessRandomNormalV2": (0,),
}
_INTEGER_TYPES = (tf.int32, tf.int64)


def reaches_values(const):
  """Whether a constant holding a padded size flows (through integer shape arithmetic) into a
  value the function computes (e.g. x / batch_size), rather than only into shapes (reshape,
  range, sequence masks): the former depends on the size, the latter is what padding expects."""
  seen, frontier = set(), [const]
  while frontier:
    op = frontier.pop()
    if op.name in seen:
      continue
    seen.add(op.name)
    for output in op.outputs:
      for consumer in output.consumers():
        if padding.HELPER_SCOPE in consumer.name or consumer.name.startswith("gradient_tape/"):
          continue
        positions = [i for i, t in enumerate(consumer.inputs) if t is output]
        allowed = _SHAPE_INPUTS.get(consumer.type, ())
        if allowed is None or all(i in allowed for i in positions):
          continue  # used as a shape
        if consumer.outputs and all(t.dtype in _INTEGER_TYPES for t in consumer.outputs):
          frontier.append(consumer)  # integer (shape) arithmetic: follow it
        else:
          return True
  return False


def probe_sizes(above, count):
  """`count` distinct primes above `above` (every maximum size): no real padded size equals one,
  and their products stay small enough for int32 shape arithmetic."""
  out, n = [], above + 101
  while len(out) < count:
    n += 1
    if all(n % p for p in range(2, int(n**0.5) + 1)):
      out.append(n)
  return out


def depends_on_size(op, dim_of_probe):
  """The padded dimensions whose size `op` makes a computed value of: a constant holding a probe
  size that reaches values, a Mean over a padded axis, batch normalization in training over one
  (`dim_of_probe`: probe size -> dimension)."""
  found = set()

  def has_probe(shape):
    return [dim_of_probe[n] for n in (shape.as_list() if shape.rank else []) if n in dim_of_probe]

  if op.type == "Const":
    value = op.get_attr("value")
    if len(value.tensor_shape.dim) <= 1 and value.dtype in (3, 9):  # int32, int64
      array = tf.make_ndarray(value).reshape(-1)
      hits = [dim_of_probe[int(v)] for v in array[:64] if int(v) in dim_of_probe]
      if hits and reaches_values(op):
        found.update(hits)
  elif op.type == "Mean" and op.inputs:
    before, after = has_probe(op.inputs[0].shape), has_probe(op.outputs[0].shape)
    found.update(d for d in before if before.count(d) > after.count(d))
  elif op.type.startswith("FusedBatchNorm") and op.get_attr("is_training"):
    # Statistics over every axis but the channels' (Keras' LayerNormalization puts the rows
    # on the channel axis: per-row statistics, which padding does not change).
    shape = op.inputs[0].shape
    if shape.rank:
      channel = 1 if op.get_attr("data_format") in (b"NCHW", "NCHW") else shape.rank - 1
      dims = shape.as_list()
      found.update(
        dim_of_probe[n] for i, n in enumerate(dims) if i != channel and n in dim_of_probe
      )
  return found


def size_dependent_dims(graph, dim_of_probe):
  """{dimension: "<op type> op '<name>'"} of the first op of `graph` found depending on each
  padded dimension's size; the padding helpers' ops and gradients are not scanned."""
  flagged = {}
  for op in graph.get_operations():
    if padding.HELPER_SCOPE in op.name or op.name.startswith("gradient_tape/"):
      continue
    for dim in depends_on_size(op, dim_of_probe):
      flagged.setdefault(dim, f"{op.type} op {op.name!r}")
  return flagged


def output_axes(outputs, dim_of_probe):
  """({axis: dimension} per flattened output, whether an output's shape is unknown): the axes
  that have a probe size are that dimension's."""
  unknown = False
  axes_per_output = []
  for value in tf.nest.flatten(outputs):
    axes = {}
    if isinstance(value, tf.Tensor):
      if value.shape.rank is None:
        unknown = True
      else:
        for axis, n in enumerate(value.shape):
          if n is None:
            unknown = True
          elif n in dim_of_probe:
            axes[axis] = dim_of_probe[n]
    axes_per_output.append(axes)
  return axes_per_output, unknown


def probe(signature, inputs, *, largest_max_size, output_dims, record_event):
  """Sets signature.output_dims (the output axes to slice back) by shape inference, and drops
  from signature.dims the padded dimensions the function depends on by size. `inputs`: the first
  call's input specs; `output_dims`: the user's, overriding shape inference; `record_event`: the
  function's event log."""
  if not signature.dims:
    signature.output_dims = None
    return
  probe_of = dict(zip(signature.dims, probe_sizes(largest_max_size, len(signature.dims))))
  specs = []
  for index, spec in enumerate(inputs):
    shape = list(spec.shape)
    for axis, dim in signature.effective_axes(index).items():
      shape[axis] = probe_of[dim]
    specs.append(tf.TensorSpec(shape, spec.dtype))
  sizes_spec = tf.TensorSpec([len(signature.declared_dims)], tf.int32)
  try:
    concrete = tf.function(signature.body).get_concrete_function(sizes_spec, *specs)
  except Exception as error:  # e.g. it needs its exact static shapes
    logger.warning(
      "tf_ext.jit: %s: cannot trace it with padded dimensions %s (%s: %s); not padding",
      signature.function_name,
      signature.dims,
      type(error).__name__,
      str(error).splitlines()[0][:300] if str(error) else "",
    )
    record_event("not padded", dims=signature.dims, reason="probe trace failed")
    signature.dims, signature.output_dims = (), None
    return
  dim_of_probe = {v: d for d, v in probe_of.items()}
  flagged = size_dependent_dims(concrete.graph, dim_of_probe)
  axes_per_output, unknown = output_axes(concrete.structured_outputs, dim_of_probe)
  if output_dims is not None:
    axes_per_output = [dict(a or {}) for a in output_dims]
    unknown = False
  drop = set(flagged)
  if unknown:
    drop = set(signature.dims)
    logger.warning(
      "tf_ext.jit: %s: an output's shape is unknown when traced with padded dimensions %s; "
      "not padding (pass output_dims to say which output axes to slice)",
      signature.function_name,
      signature.dims,
    )
  for dim, where in flagged.items():
    logger.warning(
      "tf_ext.jit: %s: its result depends on the size of %r (%s): not padding %r; use "
      "tf_ext.jit.size/mask/masked_mean to make it paddable",
      signature.function_name,
      dim,
      where,
      dim,
    )
  if drop:
    record_event("not padded", dims=tuple(sorted(drop)), reason=dict(flagged) or "unknown")
    signature.dims = tuple(d for d in signature.dims if d not in drop)
    axes_per_output = [{a: d for a, d in axes.items() if d not in drop} for axes in axes_per_output]
  signature.output_dims = axes_per_output


def batch_size_dependent_ops(ops, unpadded):
  """Ops whose results padded rows of a batch (axis 0, unknown size in the graph) would change:
  a Mean over axis 0, a batch normalization in training, a Shape / Size whose value reaches
  computed values (x / tf.shape(x)[0], Keras' SUM_OVER_BATCH_SIZE); gradients are not scanned.
  `unpadded`: names of tensors that hold the real rows only (tf_ext.jit.unpad's results); what
  is computed from them is not scanned either."""
  found = []
  unpadded = set(unpadded)
  for op in ops:  # creation order: inputs before their consumers
    scopes = op.name.split("/")
    helper = any(part.startswith(padding.HELPER_SCOPE) for part in scopes)
    if _is_gradient(scopes) or helper or not op.inputs:
      continue
    if op.inputs[0].name in unpadded:  # computed from unpad(): the real rows only
      unpadded.update(t.name for t in op.outputs)
      continue
    shape = op.inputs[0].shape
    if shape.rank is None or shape.rank == 0 or shape[0] is not None:
      continue  # not a batch of unknown size
    if op.type == "Mean":
      axes = tf.get_static_value(op.inputs[1])
      axes = range(shape.rank) if axes is None else np.reshape(axes, -1) % shape.rank
      if 0 in axes:
        found.append(f"{op.name} (a mean over the batch)")
    elif op.type.startswith("FusedBatchNorm") and op.get_attr("is_training"):
      found.append(f"{op.name} (batch normalization in training)")
    elif op.type in ("Shape", "Size") and reaches_values(op):
      found.append(f"{op.name} (the batch size used as a value)")
  return found


def _is_gradient(scopes):
  """tf.gradients' ops: under a "gradients" (or "gradients_1", ...) scope at any depth."""
  return any(s == "gradients" or s.startswith("gradients_") for s in scopes[:-1])
