"""Batch-size dependence detection: whether a padded dimension's size reaches a value that a
traced function computes."""

import tensorflow as tf

from tf_ext import padding

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


def _reaches_values(const):
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


def _probe_sizes(owner, count):
  """Distinct primes above every maximum size: no real padded size equals one, and their
  products stay small enough for int32 shape arithmetic."""
  top = owner._planner.largest_max_size()
  out, n = [], top + 101
  while len(out) < count:
    n += 1
    if all(n % p for p in range(2, int(n**0.5) + 1)):
      out.append(n)
  return out
