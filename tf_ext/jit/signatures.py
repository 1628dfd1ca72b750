"""The traced signatures of a tf_ext.jit function: a call signature, its executables and its
probe."""

import collections
import inspect
import threading

import numpy as np
import tensorflow as tf

from tf_ext import padding


def _is_tensor(value):
  return isinstance(value, (tf.Tensor, np.ndarray)) and not isinstance(value, tf.Variable)


def _static_key(value):
  try:
    hash(value)
    return ("value", type(value).__name__, value)
  except TypeError:
    return ("id", id(value))


class _Signature:
  def __init__(self, owner, key, names, structure, static, tensor_positions, leaf_axes):
    self.owner = owner
    self.key = key
    self.names = names
    self.structure = structure  # the arguments dict with leaves (for pack_sequence_as)
    self.static = static  # position -> value
    self.tensor_positions = tensor_positions
    self.leaf_axes = leaf_axes  # per tensor: {axis: dim}
    dims = []
    for axes in leaf_axes:
      for dim in axes.values():
        if dim not in dims:
          dims.append(dim)
    self.declared_dims = tuple(dims)
    self.dims = tuple(dims)  # the padded ones (detection may drop some)
    self.output_dims = None  # per flat output: {axis: dim} (set by the probe)
    self.probe_state = "new"  # -> "probing" (at the first call) -> "probed"
    self.early_sizes = []  # the declared sizes of the calls made while probing
    self.plain = tf.function(self.body, reduce_retracing=True)
    self._plain_traces = {}  # family_key -> the uncompiled trace
    self._jit_traces = {}  # family_key -> (compiled, body)
    self._jit_trace_lock = threading.Lock()

  def effective_axes(self, index):
    return {a: d for a, d in self.leaf_axes[index].items() if d in self.dims}

  def family_key(self, shapes, dtypes):
    """The shapes with every declared axis unknown, and the dtype names: one uncompiled trace
    and one jit trace serve each such family."""
    key = []
    for index, (shape, dtype) in enumerate(zip(shapes, dtypes)):
      axes = self.leaf_axes[index]
      key.append((tuple(None if a in axes else n for a, n in enumerate(shape)), dtype))
    return tuple(key)

  def specs(self, family):
    """The input signature of a family's traces: the sizes vector, then one spec per tensor."""
    sizes = tf.TensorSpec([len(self.declared_dims)], tf.int32)
    return [sizes] + [tf.TensorSpec(shape, tf.as_dtype(dtype)) for shape, dtype in family]

  def plain_trace(self, tensors):
    """The uncompiled trace of the tensors' family (traced at its first use)."""
    family = self.family_key([t.shape for t in tensors], [t.dtype.name for t in tensors])
    concrete = self._plain_traces.get(family)
    if concrete is None:
      concrete = self._plain_traces[family] = self.plain.get_concrete_function(*self.specs(family))
    return concrete

  def run_plain(self, sizes, tensors):
    """Runs the call uncompiled, through its family's trace called flat: tf.function's own
    dispatch (binding the arguments, looking up the trace) costs about 170 us more per call."""
    concrete = self.plain_trace(tensors)
    return concrete._call_flat([tf.constant(sizes, tf.int32), *tensors], concrete.captured_inputs)

  def jit_trace(self, shapes, dtypes, wrap=True):
    """(compiled, body): the tf.function(jit_compile=True) trace that runs the bucket shapes
    `shapes`, one per family of shapes (the declared axes left unknown), which XLA compiles once
    per concrete shape; `body` is the graph that shows what it does with its captured inputs.
    With `wrap`, `compiled` only calls the uncompiled calls' trace of that family (`body`):
    milliseconds, where tracing the function again costs a third of a compilation's time (a
    Keras training step). Without it (after a wrapper failed to compile: a trace made outside
    XLA may hold what a trace for XLA leaves out, such as Keras' metric asserts), the function is
    traced for XLA itself, and that trace then serves the family."""
    key = self.family_key(shapes, dtypes)
    specs = self.specs(key)
    with self._jit_trace_lock:
      traces = self._jit_traces.get(key)
      if traces is not None and (wrap or traces[0] is traces[1]):
        return traces
      if wrap:
        body = self.plain.get_concrete_function(*specs)

        def compiled_body(sizes, *tensors):
          return body(sizes, *tensors)  # XLA compiles the called function's graph

        compiled = tf.function(compiled_body, jit_compile=True, input_signature=specs)
        traces = (compiled.get_concrete_function(), body)
      else:
        compiled = tf.function(self.body, jit_compile=True, input_signature=specs)
        traces = (compiled.get_concrete_function(),) * 2
      self._jit_traces[key] = traces
    return traces

  def lengths_in(self, tensors):
    out = {}
    for index, tensor in enumerate(tensors):
      for axis, dim in self.leaf_axes[index].items():
        out.setdefault(dim, (tensor, axis))
    return out

  def body(self, sizes, *tensors):
    leaves = [None] * (len(self.static) + len(tensors))
    for position, value in self.static.items():
      leaves[position] = value
    for position, tensor in zip(self.tensor_positions, tensors):
      leaves[position] = tensor
    arguments = tf.nest.pack_sequence_as(self.structure, leaves)
    bound = inspect.BoundArguments(self.owner._signature, collections.OrderedDict(arguments))
    padded_inputs = {  # dense ids among them: lookups look up the real ones only
      t.ref(): {axis % t.shape.rank: dim for axis, dim in self.leaf_axes[i].items()}
      for i, t in enumerate(tensors)
      if self.leaf_axes[i] and t.shape.rank
    }
    context = padding.Context(self.declared_dims, sizes, self.lengths_in(tensors), padded_inputs)
    with padding.active(context):
      return self.owner._fn(*bound.args, **bound.kwargs)


class _Executable:
  def __init__(self, signature, key, buckets, shapes, reason):
    self.signature = signature
    self.key = key
    self.buckets = buckets  # tuple aligned with signature.dims
    self.shapes = shapes  # padded shape of each tensor
    self.reason = reason
    self.concrete = None
    self.state = "queued"  # queued -> ready | failed; evicted at any time
    self.seconds = None


class _Probe:
  """A queued probe of a signature's first call (its input specs)."""

  def __init__(self, signature, specs):
    self.signature = signature
    self.specs = specs
