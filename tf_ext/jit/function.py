"""tf_ext.jit.function: tf.function(jit_compile=True) with shape buckets, background compilation,
a bounded executable cache and a bucket plan that survives restarts.

The padding contract (what makes padded results equal unpadded ones)
--------------------------------------------------------------------
* Only declared dimensions are padded. `paddable` names, per argument, the axes that may be
  padded and the dimension each one is: `paddable={"x": {0: "batch", 1: "seq"}, "y": "batch"}`
  ("batch" alone means {0: "batch"}; a nested dict follows a nested argument, e.g. a dict of
  features; `paddable="batch"` makes axis 0 of every tensor argument "batch"). Every axis
  carrying one dimension has the same size in a call. Nothing else is ever padded; without
  `paddable` nothing is, and each distinct shape is its own executable (compiled in the
  background once the shape comes back, so that one-off shapes cost no compilation, and kept in
  the bounded cache).
* Padding appends zeros. The function sees padded tensors, and must not let padded positions
  reach a result that is not sliced away: per-row results are sliced back (below); whatever
  reduces over a padded axis (a batch-mean loss, a metric, attention over a sequence) uses the
  helpers `size(dim)` (the true size, a scalar int32 tensor), `mask(dim)` (bool, True on real
  positions), `masked_sum` / `masked_mean`; they work the same uncompiled and unpadded, so the
  function has one code path. Gradients of a masked loss are then exactly the unpadded ones.
  Padded ids are zeros, a real key: tf_ext.embedding_lookup of a padded input (or of a cast,
  string hash or whole-axis slice of one, padded_extent) looks up its real positions only.
* Outputs: an output axis is sliced back to the true size where shape inference shows that it is
  a padded dimension (the function is traced once with each padded dimension given a distinct
  probe size). `output_dims` overrides this: one entry per flattened output, None or
  {axis: dim}. If an output axis has no static size in that trace, the function is not padded.
* Detected batch-size dependence: the probe trace is scanned for a padded dimension's size
  flowing into a computed value (`x / tf.shape(x)[0]`, `tf.size` in Keras' batch-mean losses;
  into shapes only, as in reshapes, `tf.range` or `tf.sequence_mask(lengths, tf.shape(x)[1])`, it
  is fine), for `Mean` over a padded axis and for batch normalization in training mode over it;
  such a dimension is not padded for that function (a warning names it and the op). Ops of the
  helpers above and gradients are not flagged. The scan cannot see everything (e.g. a plain
  `tf.reduce_sum` over padded rows that are not zero after a nonlinearity): declare a dimension
  paddable only if the function masks it.
* The probe trace runs in the compiler's thread (with TF_EXT_JIT_ASYNC; else in the first call),
  so that the first call costs one trace, not two: until it is done, calls run uncompiled, and
  their sizes are observed once it is. Its warnings and "not padded" events come from there.

Compilation
-----------
A call never waits for the compiler. The compiled calls share one tf.function(jit_compile=True)
that calls the uncompiled calls' trace (declared axes unknown; wrapping it costs milliseconds,
tracing the function again would cost a third of a compilation; where XLA cannot compile that
trace, e.g. for Keras' metric asserts, which a trace made for XLA leaves out, the function is
traced for XLA once), which XLA compiles once per bucket shape; a background thread forces each
bucket's compilation by running it once on zeros, with every variable the function writes replaced
by a zero-filled shadow copy (so the warm-up changes no state; the XLA cache key holds only dtypes
and shapes, so the real call then finds the executable; the shadows cost one zero copy of each
written variable). Until its bucket is ready a call runs in the smallest ready larger bucket, else
uncompiled (a plain tf.function traced once with the declared axes unknown) on its unpadded shape.
Both ways call their trace flat (the inputs already in the trace's order): tf.function's own
dispatch would add 60-170 us to every call.
A function that writes a resource other than a variable (e.g. a hash table) cannot be warmed up
safely: its executables compile at their first real call, which then waits (logged).

Bucket plans (tf_ext.jit.buckets): the first TF_EXT_JIT_MIN_OBSERVATIONS calls run uncompiled and
fill a histogram of the padded dimensions' sizes. The first plan is one bucket shape, the largest
sizes seen rounded up (500 -> 512): after one compilation every call runs compiled. Each time the
number of calls seen doubles and the compiler is idle, the plan grows by the one boundary that
cuts the padded work most, if it cuts at least TF_EXT_JIT_MIN_GAIN of the unpadded work per
extra bucket shape, up to TF_EXT_JIT_MAX_BUCKETS shapes; the boundaries already compiled stay.
So the number of executables grows with the run's proven length (a compilation pays off over
the calls still to come). If the histogram moves so that the optimal plan with as many shapes
(exact dynamic programming) cuts the padded work by TF_EXT_JIT_REPLAN_GAIN, that plan replaces it
(boundaries within 1/8 of a compiled one keep the compiled one). With the speed check on (below),
a plan grows or is replaced only after a check has timed the compiled calls. A size above the
largest boundary (up to TF_EXT_JIT_MAX_SIZE) extends the plan at once, or, with the speed check
on, once a check has said XLA is faster (such calls run uncompiled until then, for at most
TF_EXT_JIT_MIN_OBSERVATIONS of them: a check needs calls that fit the plan); a size above
TF_EXT_JIT_MAX_SIZE runs uncompiled, with one warning per function. `fn.replan()` makes the
optimal plan now.

At most TF_EXT_JIT_MAX_EXECUTABLES executables are kept (least recently used dropped); every
plan, compile and eviction is logged on the "tf_ext.jit" logger and kept in `fn.events`; a
compile event carries XLA's own compile time (`xla_seconds`), as TensorFlow's XLA activity
listener reports it (tf_ext.jit.compile_log() lists every compilation of the process).
TensorFlow 2.15 has no API to free an executable from its own XLA cache: dropping ours drops
our reference and stops its use, not the XLA executable inside TensorFlow.

Compiled only where XLA is faster (TF_EXT_JIT_ADAPTIVE, tf_ext/jit/speed_check.py): XLA's code
is not always faster than TensorFlow's kernels. A few calls after each executable becomes ready,
a function times 12 calls compiled and 12 uncompiled, interleaved, while the compiler is idle,
fits each way's time as a fixed cost per call plus a cost per element, and compares the two
over the same calls. It runs the faster way (padding counted against the compiled calls); if
XLA would be slower even with no padding, no new bucket is compiled. Each verdict is a "speed
check" event; the check repeats every 1000 calls.

Warm restart: `fn.save_plan(path)` writes the plan (boundaries, the size histogram, the bucket
shapes in use) as JSON, e.g. next to a checkpoint; `function(..., plan_path=path)` reads it back
and, at the first call, compiles those bucket shapes in the background. TensorFlow's persistent
XLA cache (--tf_xla_persistent_cache_directory) breaks jit_compile on CPU in 2.15.1, so the
executables themselves are not persisted: a restart recompiles them, but the right ones, at once.
"""

import atexit
import collections
import contextlib
import functools
import inspect
import logging
import math
import threading
import time
import weakref

import numpy as np
import tensorflow as tf

from tf_ext import padding
from tf_ext.jit import buckets as bucket_lib
from tf_ext.jit import planner as planner_lib
from tf_ext.jit import speed_check, xla_compiles
from tf_ext.jit.paddable import _Axes, _describe, _leaf_axes, _normalize_spec  # noqa: F401
from tf_ext.jit.signatures import _Executable, _is_tensor, _Probe, _Signature, _static_key
from tf_ext.jit.size_dependence import _probe_sizes, _reaches_values  # noqa: F401

# The padding contract's helpers, as tf_ext.jit exports them (their home is tf_ext.padding).
from tf_ext.padding import mask, masked_mean, masked_sum, padded_extent, size  # noqa: F401

logger = logging.getLogger("tf_ext.jit")

# Ops that only read a resource variable: others (assignments, optimizer updates, loops) write.
_READ_ONLY_RESOURCE_OPS = frozenset(
  {"ReadVariableOp", "ResourceGather", "ResourceGatherNd", "VariableShape", "VarIsInitializedOp"}
)
# Sizes kept from the calls made while the probe runs (a paused or closed compiler never ends it).
_MAX_EARLY_SIZES = 4096


# ---------------------------------------------------------------------------------------------


class Function:
  """A function compiled with XLA per bucket of its padded dimensions; see the module doc."""

  def __init__(
    self,
    fn,
    *,
    paddable=None,
    output_dims=None,
    max_executables=None,
    max_buckets=None,
    max_size=None,
    min_observations=None,
    min_gain=None,
    replan_gain=None,
    async_compile=None,
    adaptive=None,
    plan_path=None,
    name=None,
  ):
    self._fn = fn
    functools.update_wrapper(self, fn)
    self._signature = inspect.signature(fn)
    self.name = name or getattr(fn, "__name__", "function")
    if isinstance(paddable, str):
      self._paddable = paddable  # axis 0 of every tensor
    else:
      self._paddable = _normalize_spec(paddable)
      if self._paddable is not None and not isinstance(self._paddable, dict):
        raise ValueError("paddable: expected a dimension name or {argument name: axes}")
      for key in self._paddable or {}:
        if key not in self._signature.parameters:
          raise ValueError(f"paddable: {self.name} has no argument {key!r}")
    self._output_dims = output_dims
    self.max_executables = planner_lib.option("TF_EXT_JIT_MAX_EXECUTABLES", max_executables)
    self._planner = planner_lib.Planner(
      lambda dims, boundaries, reason: self._event(
        "plan", dims=dims, boundaries=boundaries, reason=reason
      ),
      max_buckets=max_buckets,
      max_size=max_size,
      min_observations=min_observations,
      min_gain=min_gain,
      replan_gain=replan_gain,
    )
    self.async_compile = planner_lib.option("TF_EXT_JIT_ASYNC", async_compile)
    self.adaptive = planner_lib.option("TF_EXT_JIT_ADAPTIVE", adaptive)
    self._speed_checks = {}  # signature key -> SpeedCheck
    self._new_speed_check = speed_check.SpeedCheck  # its defaults; tests make shorter checks

    self._signatures = {}
    self._cache = collections.OrderedDict()  # executable key -> _Executable, LRU first
    self._lock = threading.RLock()
    self._warm = {}  # dims -> bucket tuples to compile at the first call (from a saved plan)
    self._warned_oversize = False
    self._disabled = None  # reason compilation is off for good (e.g. XLA cannot compile it)
    self.events = []  # dicts: plan / compile / evict / oversize / fallback, in order
    # Calls: compiled, larger_bucket, uncompiled (of which speed_check_uncompiled: a ready
    # executable was there, but the speed check chose to run uncompiled), oversize.
    self.stats = collections.Counter()
    self._queue = collections.deque()
    self._pending = 0
    self._cond = threading.Condition(self._lock)
    self._resume = threading.Event()
    self._resume.set()
    self._closed = False
    self._thread = None
    self._shadows = {}  # id(variable) -> (variable, shadow)
    self._bound_methods = {}
    self._exact_seen = {}
    _LIVE.add(self)
    if plan_path is not None:
      self.load_plan(plan_path)

  # -- public -----------------------------------------------------------------------------------

  @property
  def max_buckets(self):
    return self._planner.max_buckets

  @property
  def compiles(self):
    """Compilations finished so far (each logged with its reason and duration)."""
    return sum(1 for e in self.events if e["event"] == "compile")

  def executables(self):
    """The cached executables, least recently used first: (dims, buckets, state)."""
    with self._lock:
      return [(e.signature.dims, e.buckets, e.state) for e in self._cache.values()]

  def plan(self):
    """{dims tuple: boundaries per dim} currently in force."""
    with self._lock:
      return dict(self._planner.plans)

  def wait_for_compiles(self, timeout=None):
    """Block until no compilation is queued or running (tests, benchmarks, before serving).
    Returns False on timeout. Calls themselves never need this."""
    deadline = None if timeout is None else time.monotonic() + timeout
    with self._cond:
      while self._pending:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
          return False
        self._cond.wait(left)
    return True

  @contextlib.contextmanager
  def compiles_paused(self):
    """Within this block the background compiler starts no compilation (e.g. to keep its CPU
    for a latency-critical phase); calls go on as usual (uncompiled or in ready buckets)."""
    self._resume.clear()
    try:
      yield
    finally:
      self._resume.set()

  def replan(self):
    """Plan the buckets again from the histogram now (normally done on a schedule)."""
    with self._lock:
      self._planner.replan()

  def close(self):
    """Stops the background compiler (the running compilation finishes first)."""
    with self._cond:
      self._closed = True
      self._queue.clear()
      self._pending = 0
      self._cond.notify_all()
    self._resume.set()
    if self._thread is not None:
      self._thread.join()

  def save_plan(self, path):
    """Writes the bucket plan as JSON (atomically). `path`: a .json file (or an existing file),
    else a directory (made if missing) that gets `tf_ext_jit_plan.<name>.json`. Returns the
    file's path."""
    path = planner_lib.plan_file(path, self.name)
    with self._lock:
      data = self._planner.to_json(
        self.name,
        lambda dims: [e.buckets for e in self._cache.values() if e.signature.dims == dims][::-1],
      )
    planner_lib.write_json_atomically(path, data)
    logger.info("tf_ext.jit: %s: saved its bucket plan to %s", self.name, path)
    return path

  def load_plan(self, path):
    """Reads a plan written by save_plan; its bucket shapes are compiled at the first call.
    A missing file is not an error (a first run): returns False."""
    path = planner_lib.plan_file(path, self.name)
    data = planner_lib.read_json(path)
    if data is None:
      logger.info("tf_ext.jit: %s: no saved plan at %s (first run)", self.name, path)
      return False
    with self._lock:
      self._warm.update(self._planner.load_json(data, path))
    return True

  def __get__(self, instance, owner):
    if instance is None:
      return self
    bound = self._bound_methods.get(id(instance))
    if bound is None:
      bound = Function(functools.partial(self._fn, instance), **self._options())
      self._bound_methods[id(instance)] = bound
    return bound

  # -- calls ------------------------------------------------------------------------------------

  def __call__(self, *args, **kwargs):
    bound = self._signature.bind(*args, **kwargs)
    arguments = dict(bound.arguments)
    leaves = tf.nest.flatten(arguments)
    signature = self._signature_for(arguments, leaves)
    tensors = [tf.convert_to_tensor(leaves[p]) for p in signature.tensor_positions]
    all_sizes = self._sizes(signature, tensors)
    if signature.probe_state != "probed":
      # Until the probe has said what can be padded, calls run uncompiled (one trace for every
      # size of the declared dimensions) and their sizes wait to be observed.
      too_large = self._too_large(signature.declared_dims, all_sizes)
      if too_large and signature.probe_state == "probing":
        return self._run_oversize(signature, tensors, too_large)
      with self._lock:
        probing = signature.probe_state != "probed"
        if probing:
          start_probe = signature.probe_state == "new"
          signature.probe_state = "probing"
          if len(signature.early_sizes) < _MAX_EARLY_SIZES:
            signature.early_sizes.append(all_sizes)
      if probing:
        result = signature.run_plain(all_sizes, tensors)
        self.stats["uncompiled"] += 1
        if start_probe:
          self._start_probe(signature, [tf.TensorSpec(t.shape, t.dtype) for t in tensors])
        return result

    sizes = tuple(all_sizes[signature.declared_dims.index(d)] for d in signature.dims)
    too_large = self._too_large(signature.dims, sizes)
    if too_large:
      return self._run_oversize(signature, tensors, too_large)
    requests = []
    with self._lock:
      self._planner.observe(signature.dims, sizes)
      before = self._planner.plans.get(signature.dims)
      plan = self._planner.maybe_plan(
        signature.dims, sizes, compiler_busy=self._pending > 0, may_grow=self._may_grow(signature)
      )
      if signature.dims and plan is not None and plan != before and self._disabled is None:
        # (Without padded dimensions there is no plan: a shape compiles once it comes back.)
        requests += self._plan_requests(signature, tensors, plan, before)
      choice = None
      if plan is not None and self._disabled is None:
        buckets = tuple(bucket_lib.bucket_of(n, b) for n, b in zip(sizes, plan))
        if None not in buckets:
          key, shapes = self._key(signature, tensors, buckets)
          exe = self._cache.get(key)
          if exe is not None and exe.state == "ready":
            self._cache.move_to_end(key)
            choice = exe
          else:
            if exe is None and (signature.dims or self._seen_again(key)):
              reason = "new bucket" if signature.dims else "shape seen again"
              requests.append((signature, key, buckets, shapes, reason))
            choice = self._ready_larger(signature, tensors, sizes)
            if choice is not None:
              self._cache.move_to_end(choice.key)
    speed = None
    if self.adaptive:
      with self._lock:
        speed = self._speed_check(signature)
        if speed.xla_faster is False and not speed.checking:
          requests = []  # XLA's code is slower here: no new bucket until a check says otherwise
    if not self.async_compile and self._disabled is None and plan is not None:
      for request in requests:  # compile in this call, like tf.function(jit_compile=True)
        self._enqueue(*request)
      requests = []
      if self._queue:
        choice = self._sync_ready(signature, tensors, sizes)
    timed, ready = False, choice
    if choice is not None and speed is not None:
      with self._lock:
        timed = speed.checking and self._pending == 0  # a busy compiler would skew the times
        if not speed.run_compiled(timed):
          choice = None
          self.stats["speed_check_uncompiled"] += 1
    start = time.perf_counter()
    if choice is None:
      self.stats["uncompiled"] += 1
      result = signature.run_plain(all_sizes, tensors)
    else:
      self.stats["compiled" if choice.buckets == buckets else "larger_bucket"] += 1
      result = self._run(choice, signature, tensors, all_sizes)
    if timed:  # `ready`'s buckets: what this call was (or would have been) padded to
      seconds = time.perf_counter() - start
      padded = math.prod(ready.buckets)
      self._record_speed(speed, signature, seconds, choice is not None, math.prod(sizes), padded)
    for request in requests:
      self._enqueue(*request)
    return result

  def _record_speed(self, speed, signature, seconds, compiled, elements, padded_elements):
    """Times a call for the speed check."""
    with self._lock:
      if not speed.record(compiled, seconds, elements, padded_elements):
        return
      us = {kind: value * 1e6 for kind, value in speed.last.items()}
      self._event(
        "speed check",
        dims=signature.dims,
        compiled_faster=speed.compiled_faster,
        xla_faster=speed.xla_faster,
        compiled_us_per_element=us["compiled"],
        compiled_us_per_padded_element=us["padded"],
        compiled_us_per_element_unpadded=us["unpadded"],
        uncompiled_us_per_element=us["uncompiled"],
      )
    logger.info(
      "tf_ext.jit: %s: per element, compiled calls take %.3g us (%.3g per padded element; %.3g "
      "unpadded), uncompiled %.3g: running %s%s",
      self.name,
      us["compiled"],
      us["padded"],
      us["unpadded"],
      us["uncompiled"],
      "compiled" if speed.compiled_faster else "uncompiled",
      "" if speed.xla_faster else "; XLA is slower here, so no new bucket is compiled",
    )

  def _too_large(self, dims, sizes):
    """(dim, size) of the sizes above their dimension's TF_EXT_JIT_MAX_SIZE."""
    return [(dim, n) for dim, n in zip(dims, sizes) if n > self._planner.max_size_of(dim)]

  def _speed_check(self, signature):
    """The signature's SpeedCheck (made at its first use). The caller holds the lock."""
    speed = self._speed_checks.get(signature.key)
    if speed is None:
      speed = self._speed_checks[signature.key] = self._new_speed_check()
    return speed

  def _may_grow(self, signature):
    """With the speed check on, a plan grows (or is replaced) only once a check has timed the
    compiled calls: more buckets only cut padding, which is worth compiling for only where XLA
    is faster (a verdict saying it is not stops new buckets altogether)."""
    if not self.adaptive:
      return True
    speed = self._speed_checks.get(signature.key)
    return speed is not None and speed.last is not None and speed.xla_faster is not False

  def _plan_requests(self, signature, tensors, plan, before):
    """A new plan's bucket shapes to compile: first the one holding every size (so that every
    call has a ready bucket after one compilation), then the others the histogram uses, most
    used first; at most max_executables."""
    joint = self._planner.joint.get(signature.dims, {})
    uses = collections.Counter()
    for sizes, count in joint.items():
      combo = tuple(bucket_lib.bucket_of(n, b) for n, b in zip(sizes, plan))
      if None not in combo:
        uses[combo] += count
    top = tuple(b[-1] for b in plan)
    order = [top] + [c for c, _ in uses.most_common() if c != top]
    reason = "first plan" if before is None else "new plan"
    out = []
    for combo in order[: self.max_executables]:
      key, shapes = self._key(signature, tensors, combo)
      if key not in self._cache:
        out.append((signature, key, combo, shapes, reason, combo == top))
    return out

  # -- internals: signatures, sizes, keys -------------------------------------------------------

  def _options(self):
    return dict(
      paddable=self._paddable,
      output_dims=self._output_dims,
      max_executables=self.max_executables,
      **self._planner.options(),
      async_compile=self.async_compile,
      adaptive=self.adaptive,
      name=self.name,
    )

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
    signature = self._signatures.get(key)
    if signature is not None:
      return signature
    structure = tf.nest.map_structure(lambda _: 0, arguments)
    positions = [i for i, leaf in enumerate(leaves) if _is_tensor(leaf)]
    static = {i: leaf for i, leaf in enumerate(leaves) if not _is_tensor(leaf)}
    leaf_axes = []
    if isinstance(self._paddable, str):
      leaf_axes = [{0: self._paddable} if len(leaves[p].shape) >= 1 else {} for p in positions]
    else:
      spec = {name: (self._paddable or {}).get(name) for name in arguments}
      per_leaf = _leaf_axes(arguments, spec)
      for p in positions:
        axes = per_leaf[p] or {}
        rank = len(leaves[p].shape)
        for axis in axes:
          if not -rank <= axis < rank:
            raise ValueError(
              f"paddable: axis {axis} of {self.name}'s argument (rank {rank}) does not exist"
            )
        leaf_axes.append({a % rank: d for a, d in axes.items()})
    signature = _Signature(self, key, list(arguments), structure, static, positions, leaf_axes)
    self._signatures[key] = signature
    return signature

  def _sizes(self, signature, tensors):
    """The sizes of the declared dimensions (all, padded or not), in declared order."""
    found = {}
    for index, tensor in enumerate(tensors):
      for axis, dim in signature.leaf_axes[index].items():
        n = int(tensor.shape[axis])
        if found.setdefault(dim, n) != n:
          raise ValueError(
            f"tf_ext.jit: {self.name}: dimension {dim!r} has sizes {found[dim]} and {n} in one "
            "call (every axis declared as one dimension must have the same size)"
          )
    return tuple(found[dim] for dim in signature.declared_dims)

  def _key(self, signature, tensors, buckets, exact_sizes=None):
    """(cache key, padded shapes) of the tensors in `buckets`; `exact_sizes` ({dim: size}) sets
    the declared axes that are not padded (default: as the tensors have them)."""
    bucket_of_dim = dict(zip(signature.dims, buckets))
    shapes = []
    for index, tensor in enumerate(tensors):
      shape = list(tensor.shape)
      for axis, dim in signature.leaf_axes[index].items():
        if dim in bucket_of_dim:
          shape[axis] = bucket_of_dim[dim]
        elif exact_sizes is not None:
          shape[axis] = exact_sizes[dim]
      shapes.append(tuple(shape))
    dtypes = tuple(t.dtype.name for t in tensors)
    return (signature.key, tuple(shapes), dtypes), tuple(shapes)

  def _seen_again(self, key):
    """Without padded dimensions every shape is its own executable: compile one only when it
    comes back, so that a stream of one-off shapes does not keep the compiler busy."""
    seen = self._exact_seen
    if key in seen:
      return True
    seen[key] = True
    if len(seen) > 4096:
      seen.pop(next(iter(seen)))
    return False

  def _family(self, signature, tensors):
    shapes = []
    for index, tensor in enumerate(tensors):
      shape = list(tensor.shape)
      for axis in signature.effective_axes(index):
        shape[axis] = -1
      shapes.append(tuple(shape))
    return tuple(shapes)

  def _ready_larger(self, signature, tensors, sizes):
    family = self._family(signature, tensors)
    best, best_volume = None, None
    for exe in self._cache.values():
      if exe.state != "ready" or exe.signature is not signature:
        continue
      if any(b < n for b, n in zip(exe.buckets, sizes)):
        continue
      if self._family_of_shapes(signature, exe.shapes) != family:
        continue
      volume = math.prod(exe.buckets)
      if best is None or volume < best_volume:
        best, best_volume = exe, volume
    return best

  def _family_of_shapes(self, signature, shapes):
    out = []
    for index, shape in enumerate(shapes):
      shape = list(shape)
      for axis in signature.effective_axes(index):
        shape[axis] = -1
      out.append(tuple(shape))
    return tuple(out)

  # -- internals: running -----------------------------------------------------------------------

  def _run(self, exe, signature, tensors, sizes):
    bucket_of_dim = dict(zip(signature.dims, exe.buckets))
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
    result = exe.concrete._call_flat(
      [tf.constant(sizes, tf.int32), *padded], exe.concrete.captured_inputs
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

  def _run_oversize(self, signature, tensors, too_large):
    self.stats["oversize"] += 1
    if not self._warned_oversize:
      self._warned_oversize = True
      what = ", ".join(f"{dim}={n} > {self._planner.max_size_of(dim)}" for dim, n in too_large)
      logger.warning(
        "tf_ext.jit: %s: %s exceeds TF_EXT_JIT_MAX_SIZE: such calls run uncompiled (warned once)",
        self.name,
        what,
      )
      self._event("oversize", dims=signature.dims, sizes=tuple(n for _, n in too_large))
    return signature.run_plain(self._sizes(signature, tensors), tensors)

  # -- internals: probing the traced function ---------------------------------------------------

  def _probe(self, signature, inputs):
    """Output dims by shape inference, and padded dims the function depends on by size."""
    if not signature.dims:
      signature.output_dims = None
      return
    probe_of = dict(zip(signature.dims, _probe_sizes(self, len(signature.dims))))
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
        self.name,
        signature.dims,
        type(error).__name__,
        str(error).splitlines()[0][:300] if str(error) else "",
      )
      self._event("not padded", dims=signature.dims, reason="probe trace failed")
      signature.dims, signature.output_dims = (), None
      return
    dim_of_probe = {v: d for d, v in probe_of.items()}
    flagged = {}
    for op in concrete.graph.get_operations():
      if padding.HELPER_SCOPE in op.name or op.name.startswith("gradient_tape/"):
        continue
      for dim in self._depends_on_size(op, dim_of_probe):
        flagged.setdefault(dim, f"{op.type} op {op.name!r}")
    unknown = False
    output_dims = []
    for value in tf.nest.flatten(concrete.structured_outputs):
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
      output_dims.append(axes)
    if self._output_dims is not None:
      output_dims = [dict(a or {}) for a in self._output_dims]
      unknown = False
    drop = set(flagged)
    if unknown:
      drop = set(signature.dims)
      logger.warning(
        "tf_ext.jit: %s: an output's shape is unknown when traced with padded dimensions %s; "
        "not padding (pass output_dims to say which output axes to slice)",
        self.name,
        signature.dims,
      )
    for dim, where in flagged.items():
      logger.warning(
        "tf_ext.jit: %s: its result depends on the size of %r (%s): not padding %r; use "
        "tf_ext.jit.size/mask/masked_mean to make it paddable",
        self.name,
        dim,
        where,
        dim,
      )
    if drop:
      self._event("not padded", dims=tuple(sorted(drop)), reason=dict(flagged) or "unknown")
      signature.dims = tuple(d for d in signature.dims if d not in drop)
      output_dims = [{a: d for a, d in axes.items() if d not in drop} for axes in output_dims]
    signature.output_dims = output_dims

  @staticmethod
  def _depends_on_size(op, dim_of_probe):
    found = set()

    def has_probe(shape):
      return [dim_of_probe[n] for n in (shape.as_list() if shape.rank else []) if n in dim_of_probe]

    if op.type == "Const":
      value = op.get_attr("value")
      if len(value.tensor_shape.dim) <= 1 and value.dtype in (3, 9):  # int32, int64
        array = tf.make_ndarray(value).reshape(-1)
        hits = [dim_of_probe[int(v)] for v in array[:64] if int(v) in dim_of_probe]
        if hits and _reaches_values(op):
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

  # -- internals: plans -------------------------------------------------------------------------

  def _start_probe(self, signature, specs):
    """The probe traces the function again (for a Keras training step, as long as the first
    call's own trace): with background compilation it runs in the compiler's thread, so that the
    first call does not wait for it."""
    if self.async_compile and signature.declared_dims:
      self._push(_Probe(signature, specs))
    else:
      self._finish_probe(signature, specs)

  def _finish_probe(self, signature, specs):
    """Probes the function, then observes the sizes of the calls made meanwhile, plans if that is
    due, and compiles a saved plan's buckets (a warm restart)."""
    try:
      self._probe(signature, specs)
    except Exception as error:  # not a failed trace (the probe handles those): a bug
      logger.warning(
        "tf_ext.jit: %s: probing its padded dimensions failed (%s: %s); not padding",
        self.name,
        type(error).__name__,
        error,
      )
      signature.dims, signature.output_dims = (), None
    requests = []
    with self._lock:
      early, signature.early_sizes = signature.early_sizes, []
      signature.probe_state = "probed"
      if self.adaptive:
        self._speed_check(signature)
      observed = None
      for all_sizes in early:
        if not signature.dims:  # each exact shape its own executable: these were seen
          exact = dict(zip(signature.declared_dims, all_sizes))
          self._seen_again(self._key(signature, specs, (), exact)[0])
          continue
        sizes = tuple(all_sizes[signature.declared_dims.index(d)] for d in signature.dims)
        if not self._too_large(signature.dims, sizes):
          self._planner.observe(signature.dims, sizes)
          observed = sizes
      if observed is not None:
        plan = self._planner.maybe_plan(signature.dims, observed, may_grow=False)
        if plan is not None and self._disabled is None:
          requests = self._plan_requests(signature, specs, plan, None)
    self._after_first_call(signature, specs)
    for request in requests:
      self._enqueue(*request)

  def _after_first_call(self, signature, tensors):
    """Warm restart: compile the saved plan's bucket shapes now that the function has run once
    (its variables exist)."""
    warm = self._warm.pop(signature.dims, None)
    if not warm or self._disabled is not None:
      return
    for buckets in warm[: self.max_executables]:
      key, shapes = self._key(signature, tensors, tuple(buckets))
      if key not in self._cache:
        self._enqueue(signature, key, tuple(buckets), shapes, "warm restart")

  # -- internals: the compiler ------------------------------------------------------------------

  def _event(self, event, **fields):
    record = dict(event=event, time=time.time(), **fields)
    self.events.append(record)
    if event == "plan":
      bounds = ", ".join(f"{d}: {list(b)}" for d, b in zip(fields["dims"], fields["boundaries"]))
      logger.info("tf_ext.jit: %s: bucket plan %s (%s)", self.name, bounds, fields["reason"])

  def _enqueue(self, signature, key, buckets, shapes, reason, first=False):
    """Queues a compilation (`first`: ahead of the others, e.g. the bucket holding every size);
    drops the least recently used executables beyond max_executables."""
    with self._cond:
      if key in self._cache or self._closed:
        return
      exe = _Executable(signature, key, buckets, shapes, reason)
      self._cache[key] = exe
      while len(self._cache) > self.max_executables:
        old_key, old = next(iter(self._cache.items()))
        del self._cache[old_key]
        previous = old.state
        old.state = "evicted"
        old.concrete = None
        self._event("evict", dims=old.signature.dims, buckets=old.buckets, state=previous)
        logger.info(
          "tf_ext.jit: %s: dropped the least recently used executable %s (%s)",
          self.name,
          _describe(old.signature.dims, old.buckets),
          previous,
        )
      self._push(exe, first)

  def _push(self, job, first=False):
    """Queues a job for the compiler (an _Executable to compile, or a _Probe)."""
    with self._cond:
      if self._closed:
        return
      if first:
        self._queue.appendleft(job)
      else:
        self._queue.append(job)
      self._pending += 1
      if self.async_compile and self._thread is None:
        self._thread = threading.Thread(
          target=self._worker, name=f"tf_ext.jit:{self.name}", daemon=True
        )
        self._thread.start()
      self._cond.notify_all()

  def _sync_ready(self, signature, tensors, sizes):
    while True:
      with self._cond:
        if not self._queue:
          break
        exe = self._queue.popleft()
      self._compile(exe)
    with self._lock:
      return self._ready_larger(signature, tensors, sizes)

  def _worker(self):
    while True:
      with self._cond:
        while not self._queue and not self._closed:
          self._cond.wait()
        if self._closed:
          return
      self._resume.wait()
      with self._cond:
        if self._closed or not self._queue:
          continue
        job = self._queue.popleft()
      if isinstance(job, _Probe):
        try:
          self._finish_probe(job.signature, job.specs)
        finally:
          with self._cond:
            self._pending = max(0, self._pending - 1)
            self._cond.notify_all()
      else:
        self._compile(job)

  def _compile(self, exe):
    try:
      if exe.state == "evicted" or self._disabled is not None:
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
          speed = self._speed_checks.get(signature.key)
          if speed is not None:
            speed.executables_changed()
        count = sum(1 for e in self._cache.values() if e.state == "ready")
        self._event(
          "compile",
          dims=signature.dims,
          buckets=exe.buckets,
          reason=exe.reason,
          seconds=exe.seconds,
          xla_seconds=xla_seconds,
        )
      logger.info(
        "tf_ext.jit: %s: compiled %s (%s) in %.2f s; %d/%d executables ready%s",
        self.name,
        _describe(signature.dims, exe.buckets) if signature.dims else str(exe.shapes),
        exe.reason,
        exe.seconds,
        count,
        self.max_executables,
        f"; {note}" if note else "",
      )
    except Exception as error:  # XLA cannot compile it: run uncompiled from now on
      exe.state = "failed"
      with self._lock:
        self._disabled = f"{type(error).__name__}: {error}"
        self._event("compile failed", dims=exe.signature.dims, buckets=exe.buckets)
      logger.warning(
        "tf_ext.jit: %s: XLA compilation failed, running uncompiled from now on: %s",
        self.name,
        self._disabled.splitlines()[0][:500],
      )
    finally:
      with self._cond:
        self._pending = max(0, self._pending - 1)
        self._cond.notify_all()

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
          self.name,
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


_LIVE = weakref.WeakSet()


@atexit.register
def _close_all():
  for fn in list(_LIVE):
    fn.close()


def function(fn=None, **options):
  """A drop-in for tf.function(jit_compile=True): buckets, background compilation, a bounded
  cache, a saved plan. Use as `function(fn, ...)`, `@function` or `@function(...)`; keyword
  arguments: paddable, output_dims, max_executables, max_buckets, max_size, min_observations,
  min_gain, replan_gain, async_compile, plan_path, name (see tf_ext.jit.function's module doc;
  those without a value come from the TF_EXT_JIT_* settings)."""
  unknown = set(options) - set(inspect.signature(Function).parameters)
  if unknown:
    raise TypeError(f"tf_ext.jit.function: unknown arguments {sorted(unknown)}")
  if fn is None:
    return lambda f: Function(f, **options)
  return Function(fn, **options)
