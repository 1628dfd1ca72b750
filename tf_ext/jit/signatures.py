"""The traced signatures of a tf_ext.jit function.

A call's signature is the structure of its arguments, their static (non-tensor) values, the
tensors' dtypes and ranks, and which tensor axes are which padded dimension (from `paddable`).
`Signatures` makes each at its first call; a `Signature` holds its body (the function inside a
padding context), its uncompiled traces and its jit traces, one per family of shapes (the declared
axes unknown), and the keys and padded shapes of its bucket executables.
"""

import collections
import inspect
import threading

import numpy as np
import tensorflow as tf

from tf_ext import padding
from tf_ext.jit import paddable as paddable_lib


def _is_tensor(value):
  return isinstance(value, (tf.Tensor, np.ndarray)) and not isinstance(value, tf.Variable)


def _static_key(value):
  try:
    hash(value)
    return ("value", type(value).__name__, value)
  except TypeError:
    return ("id", id(value))


class Signature:
  """One call signature (see the module doc). `owner`: the Signatures that made it (the function,
  its Python signature, its name)."""

  def __init__(self, owner, key, names, structure, static, tensor_positions, leaf_axes):
    self.owner = owner
    self.function_name = owner.function_name
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
    bound = inspect.BoundArguments(self.owner.python_signature, collections.OrderedDict(arguments))
    padded_inputs = {  # dense ids among them: lookups look up the real ones only
      t.ref(): {axis % t.shape.rank: dim for axis, dim in self.leaf_axes[i].items()}
      for i, t in enumerate(tensors)
      if self.leaf_axes[i] and t.shape.rank
    }
    context = padding.Context(self.declared_dims, sizes, self.lengths_in(tensors), padded_inputs)
    with padding.active(context):
      return self.owner.fn(*bound.args, **bound.kwargs)

  def sizes(self, tensors):
    """The sizes of the declared dimensions (all, padded or not), in declared order."""
    found = {}
    for index, tensor in enumerate(tensors):
      for axis, dim in self.leaf_axes[index].items():
        n = int(tensor.shape[axis])
        if found.setdefault(dim, n) != n:
          raise ValueError(
            f"tf_ext.jit: {self.function_name}: dimension {dim!r} has sizes {found[dim]} and "
            f"{n} in one call (every axis declared as one dimension must have the same size)"
          )
    return tuple(found[dim] for dim in self.declared_dims)

  def bucket_key(self, tensors, buckets, exact_sizes=None):
    """(cache key, padded shapes) of the tensors in `buckets`; `exact_sizes` ({dim: size}) sets
    the declared axes that are not padded (default: as the tensors have them)."""
    bucket_of_dim = dict(zip(self.dims, buckets))
    shapes = []
    for index, tensor in enumerate(tensors):
      shape = list(tensor.shape)
      for axis, dim in self.leaf_axes[index].items():
        if dim in bucket_of_dim:
          shape[axis] = bucket_of_dim[dim]
        elif exact_sizes is not None:
          shape[axis] = exact_sizes[dim]
      shapes.append(tuple(shape))
    dtypes = tuple(t.dtype.name for t in tensors)
    return (self.key, tuple(shapes), dtypes), tuple(shapes)

  def padded_family(self, shapes):
    """The shapes with every padded axis -1: an executable of a larger bucket of the same family
    can run a call."""
    out = []
    for index, shape in enumerate(shapes):
      shape = list(shape)
      for axis in self.effective_axes(index):
        shape[axis] = -1
      out.append(tuple(shape))
    return tuple(out)


class Signatures:
  """The call signatures of one function, each made at its first call. `paddable`: the user's
  declaration (a dimension name for axis 0 of every tensor, or {argument name: axes})."""

  def __init__(self, fn, function_name, paddable):
    self.fn = fn
    self.python_signature = inspect.signature(fn)
    self.function_name = function_name
    if isinstance(paddable, str):
      self.paddable = paddable  # axis 0 of every tensor
    else:
      self.paddable = paddable_lib.normalize_spec(paddable)
      if self.paddable is not None and not isinstance(self.paddable, dict):
        raise ValueError("paddable: expected a dimension name or {argument name: axes}")
      for key in self.paddable or {}:
        if key not in self.python_signature.parameters:
          raise ValueError(f"paddable: {function_name} has no argument {key!r}")
    self._by_key = {}

  def bind(self, args, kwargs):
    """(the Signature of a call with `args` and `kwargs`, its tensor arguments)."""
    arguments = dict(self.python_signature.bind(*args, **kwargs).arguments)
    leaves = tf.nest.flatten(arguments)
    signature = self._signature_for(arguments, leaves)
    return signature, [tf.convert_to_tensor(leaves[p]) for p in signature.tensor_positions]

  def _signature_for(self, arguments, leaves):
    parts = []
    for leaf in leaves:
      if _is_tensor(leaf):
        dtype = leaf.dtype if isinstance(leaf, tf.Tensor) else tf.as_dtype(leaf.dtype)
        parts.append(("tensor", dtype.name, len(leaf.shape)))
      else:
        parts.append(_static_key(leaf))
    if len(leaves) == len(arguments) and all(
      arguments[name] is leaf for name, leaf in zip(sorted(arguments), leaves)
    ):  # every argument a leaf (tf.nest sorts a dict's keys): the names say the structure
      key = (tuple(arguments), tuple(parts))
    else:
      key = (repr(tf.nest.map_structure(lambda _: 0, arguments)), tuple(parts))
    signature = self._by_key.get(key)
    if signature is not None:
      return signature
    structure = tf.nest.map_structure(lambda _: 0, arguments)
    positions = [i for i, leaf in enumerate(leaves) if _is_tensor(leaf)]
    static = {i: leaf for i, leaf in enumerate(leaves) if not _is_tensor(leaf)}
    leaf_axes = []
    if isinstance(self.paddable, str):
      leaf_axes = [{0: self.paddable} if len(leaves[p].shape) >= 1 else {} for p in positions]
    else:
      spec = {name: (self.paddable or {}).get(name) for name in arguments}
      per_leaf = paddable_lib.leaf_axes(arguments, spec)
      for p in positions:
        axes = per_leaf[p] or {}
        rank = len(leaves[p].shape)
        for axis in axes:
          if not -rank <= axis < rank:
            raise ValueError(
              f"paddable: axis {axis} of {self.function_name}'s argument (rank {rank}) does not "
              "exist"
            )
        leaf_axes.append({a % rank: d for a, d in axes.items()})
    signature = Signature(self, key, list(arguments), structure, static, positions, leaf_axes)
    self._by_key[key] = signature
    return signature
