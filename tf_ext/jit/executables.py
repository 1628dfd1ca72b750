"""The executables of a tf_ext.jit function: one per bucket shape of a signature.

`Executables` is a function's bounded cache of them (least recently used dropped beyond
max_executables, each drop logged and an "evict" event) and compiles one when the compile queue
runs its job: XLA compiles the family's jit trace at a warm-up run on zeros, with every variable
the function writes replaced by a zero-filled shadow copy, so that the warm-up changes no state
(the XLA cache key holds only dtypes and shapes: the real call then finds the executable). A
function that writes a resource other than a variable cannot be warmed up safely: its executable
compiles at its first real call. A compilation that fails turns compilation off for good
(`disabled`): the function runs uncompiled from then on.
"""

import collections
import logging
import math
import time

import numpy as np
import tensorflow as tf

from tf_ext.jit import paddable as paddable_lib
from tf_ext.jit import xla_compiles

logger = logging.getLogger("tf_ext.jit")

# Ops that only read a resource variable: others (assignments, optimizer updates, loops) write.
_READ_ONLY_RESOURCE_OPS = frozenset(
  {"ReadVariableOp", "ResourceGather", "ResourceGatherNd", "VariableShape", "VarIsInitializedOp"}
)
# Executable keys remembered for "compile a shape once it comes back" (no padded dimensions).
_MAX_SEEN_SHAPES = 4096


class Executable:
  """A bucket shape of a signature and, once compiled, the trace that runs it."""

  def __init__(self, signature, key, buckets, shapes, reason):
    self.signature = signature
    self.key = key
    self.buckets = buckets  # tuple aligned with signature.dims
    self.shapes = shapes  # padded shape of each tensor
    self.reason = reason
    self.concrete = None
    self.state = "queued"  # queued -> ready | failed; evicted at any time
    self.seconds = None

  def run(self, tensors, sizes):
    """Runs a call (`sizes`: its declared dimensions' sizes) padded to this bucket, and slices
    the padded output axes back to the true sizes."""
    signature = self.signature
    bucket_of_dim = dict(zip(signature.dims, self.buckets))
    padded = []
    for index, tensor in enumerate(tensors):
      axes = signature.effective_axes(index)
      if axes:
        paddings = np.zeros([len(tensor.shape), 2], np.int32)
        for axis, dim in axes.items():
          paddings[axis, 1] = bucket_of_dim[dim] - int(tensor.shape[axis])
        if paddings.any():
          # The raw op with a NumPy paddings array: tf.pad's Python wrapper costs 4x as much,
          # on every call.
          tensor = tf.raw_ops.Pad(input=tensor, paddings=paddings)
      padded.append(tensor)
    # Called flat, as the warm-up did: the structured call binds its arguments again (60 us).
    result = self.concrete._call_flat(
      [tf.constant(sizes, tf.int32), *padded], self.concrete.captured_inputs
    )
    if not signature.dims:
      return result
    true_size = dict(zip(signature.declared_dims, sizes))
    flat = tf.nest.flatten(result)
    out = []
    for value, axes in zip(flat, signature.output_dims):
      if axes and isinstance(value, tf.Tensor):
        begin = np.zeros(len(value.shape), np.int32)
        extent = np.full(len(value.shape), -1, np.int32)
        for axis, dim in axes.items():
          extent[axis] = true_size[dim]
        value = tf.raw_ops.Slice(input=value, begin=begin, size=extent)
      out.append(value)
    return tf.nest.pack_sequence_as(result, out)


class Executables:
  """A function's executables, least recently used first (see the module doc).

  `lock`: the function's lock, which guards the cache: callers hold it to use or change the
  cache, and `compile` (the compile queue's job) takes it itself; `record_event(event, **fields)`:
  the function's event log; `on_ready(signature)`: told (under the lock) when one of the
  signature's executables becomes ready.
  """

  def __init__(self, function_name, max_executables, lock, record_event, on_ready):
    self.function_name = function_name
    self.max_executables = max_executables
    self.disabled = None  # why compilation is off for good (e.g. XLA cannot compile it)
    self._lock = lock
    self._record_event = record_event
    self._on_ready = on_ready
    self._cache = collections.OrderedDict()  # executable key -> Executable, LRU first
    self._seen = {}  # keys of exact shapes seen once (see seen_again)
    self._shadows = {}  # id(variable) -> (variable, shadow)

  # -- the cache --------------------------------------------------------------------------------

  def __contains__(self, key):
    return key in self._cache

  def get(self, key):
    return self._cache.get(key)

  def use(self, exe):
    """Marks `exe` the most recently used."""
    self._cache.move_to_end(exe.key)

  def listing(self):
    """(dims, buckets, state) of each executable, least recently used first."""
    return [(e.signature.dims, e.buckets, e.state) for e in self._cache.values()]

  def buckets_in_use(self, dims):
    """The bucket tuples of the padded dimensions `dims`, most recently used first."""
    return [e.buckets for e in self._cache.values() if e.signature.dims == dims][::-1]

  def seen_again(self, key):
    """Without padded dimensions every shape is its own executable: compile one only when it
    comes back, so that a stream of one-off shapes does not keep the compiler busy."""
    seen = self._seen
    if key in seen:
      return True
    seen[key] = True
    if len(seen) > _MAX_SEEN_SHAPES:
      seen.pop(next(iter(seen)))
    return False

  def ready_larger(self, signature, tensors, sizes):
    """The ready executable of the smallest bucket that holds a call of `signature` with these
    tensors (`sizes`: of its padded dimensions), or None."""
    family = signature.padded_family([tensor.shape for tensor in tensors])
    best, best_volume = None, None
    for exe in self._cache.values():
      if exe.state != "ready" or exe.signature is not signature:
        continue
      if any(b < n for b, n in zip(exe.buckets, sizes)):
        continue
      if signature.padded_family(exe.shapes) != family:
        continue
      volume = math.prod(exe.buckets)
      if best is None or volume < best_volume:
        best, best_volume = exe, volume
    return best

  def add(self, signature, key, buckets, shapes, reason):
    """A new Executable, queued for compilation (the caller queues its job), as the most
    recently used; drops the least recently used beyond max_executables."""
    exe = Executable(signature, key, buckets, shapes, reason)
    self._cache[key] = exe
    while len(self._cache) > self.max_executables:
      old_key, old = next(iter(self._cache.items()))
      del self._cache[old_key]
      previous = old.state
      old.state = "evicted"
      old.concrete = None
      self._record_event("evict", dims=old.signature.dims, buckets=old.buckets, state=previous)
      logger.info(
        "tf_ext.jit: %s: dropped the least recently used executable %s (%s)",
        self.function_name,
        paddable_lib.describe(old.signature.dims, old.buckets),
        previous,
      )
    return exe

  # -- compilation ------------------------------------------------------------------------------

  def compile(self, exe):
    """Compiles `exe` (unless it was dropped meanwhile): logged, and a "compile" event with XLA's
    own compile time; a failure disables compilation ("compile failed")."""
    try:
      if exe.state == "evicted" or self.disabled is not None:
        return
      start = time.perf_counter()
      signature = exe.signature
      warm_sizes = {}
      for index, shape in enumerate(exe.shapes):
        for axis, dim in signature.leaf_axes[index].items():
          warm_sizes[dim] = shape[axis]
      zeros = [tf.constant([warm_sizes[d] for d in signature.declared_dims], tf.int32)]
      zeros += [tf.zeros(s, tf.as_dtype(d)) for s, d in zip(exe.shapes, exe.key[2])]
      logged = xla_compiles.compile_count()
      concrete, captures = self._warm_up(exe, zeros)
      note = ""
      if captures is None:
        note = "compiles at first use: it writes a resource that is not a variable"
      exe.seconds = time.perf_counter() - start
      # XLA's own account (its activity listener): the compile time within exe.seconds.
      name = concrete.name.decode() if isinstance(concrete.name, bytes) else concrete.name
      xla = [e for e in xla_compiles.compile_log(logged) if name in e["cluster"]]
      xla_seconds = sum(e["compile_time_us"] for e in xla) / 1e6 if xla else None
      if xla_seconds is not None:
        note = f"XLA compiled for {xla_seconds:.2f} s" + (f"; {note}" if note else "")
      elif captures is not None:  # an evicted bucket back: the shared trace's XLA cache has it
        xla_seconds = 0.0
        note = "XLA's cache still held it"
      exe.concrete = concrete
      with self._lock:
        if exe.state != "evicted":
          exe.state = "ready"
          self._on_ready(signature)
        count = sum(1 for e in self._cache.values() if e.state == "ready")
        self._record_event(
          "compile",
          dims=signature.dims,
          buckets=exe.buckets,
          reason=exe.reason,
          seconds=exe.seconds,
          xla_seconds=xla_seconds,
        )
      logger.info(
        "tf_ext.jit: %s: compiled %s (%s) in %.2f s; %d/%d executables ready%s",
        self.function_name,
        paddable_lib.describe(signature.dims, exe.buckets) if signature.dims else str(exe.shapes),
        exe.reason,
        exe.seconds,
        count,
        self.max_executables,
        f"; {note}" if note else "",
      )
    except Exception as error:  # XLA cannot compile it: run uncompiled from now on
      exe.state = "failed"
      with self._lock:
        self.disabled = f"{type(error).__name__}: {error}"
        self._record_event("compile failed", dims=exe.signature.dims, buckets=exe.buckets)
      logger.warning(
        "tf_ext.jit: %s: XLA compilation failed, running uncompiled from now on: %s",
        self.function_name,
        self.disabled.splitlines()[0][:500],
      )

  def _warm_up(self, exe, zeros):
    """Compiles exe's bucket by running the family's jit trace once on `zeros`, with the variables
    it writes shadowed; returns (the trace, its shadowed captures), the captures None where it
    cannot be warmed up safely (it then compiles at its first real call). A wrapper of the
    uncompiled trace that cannot be warmed up, or that XLA cannot compile, gives way to a trace
    made for XLA."""
    signature = exe.signature
    concrete, body = signature.jit_trace(exe.shapes, exe.key[2])
    captures = self._shadow_captures(concrete, body)
    if concrete is not body:
      try:
        if captures is not None:
          concrete._call_flat(zeros, captures)
          return concrete, captures
      except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError) as error:
        logger.info(
          "tf_ext.jit: %s: XLA cannot compile the uncompiled calls' trace (%s); tracing the "
          "function for XLA",
          self.function_name,
          str(error).splitlines()[0][:200],
        )
      concrete, body = signature.jit_trace(exe.shapes, exe.key[2], wrap=False)
      captures = self._shadow_captures(concrete, body)
    if captures is not None:
      concrete._call_flat(zeros, captures)
    return concrete, captures

  def _shadow_captures(self, concrete, body):
    """The captured inputs of `concrete` with each variable that `body` (the trace it calls, and
    whose graph shows how each capture is used) writes replaced by its zero shadow; None if a
    written resource is not a variable."""
    variables = {id(variable.handle): variable for variable in body.variables}
    shadow_of = {}
    for capture, placeholder in zip(body.captured_inputs, body.graph.internal_captures):
      if capture.dtype != tf.resource:
        continue
      if all(c.type in _READ_ONLY_RESOURCE_OPS for c in placeholder.consumers()):
        continue
      variable = variables.get(id(capture))
      if variable is None:
        return None
      entry = self._shadows.get(id(variable))
      if entry is None:
        with tf.init_scope():
          shadow = tf.Variable(tf.zeros_like(variable), trainable=False, name="tf_ext_jit_shadow")
        entry = self._shadows[id(variable)] = (variable, shadow)
      shadow_of[id(capture)] = entry[1].handle
    return [shadow_of.get(id(capture), capture) for capture in concrete.captured_inputs]
