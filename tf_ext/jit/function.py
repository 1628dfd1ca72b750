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
import functools
import logging
import math
import threading
import time
import weakref

import tensorflow as tf

from tf_ext.jit import buckets as bucket_lib
from tf_ext.jit import options as options_lib
from tf_ext.jit import planner as planner_lib
from tf_ext.jit import signatures as signatures_lib
from tf_ext.jit import size_dependence, speed_check
from tf_ext.jit.compile_queue import CompileQueue
from tf_ext.jit.executables import Executables

# The padding contract's helpers, as tf_ext.jit exports them (their home is tf_ext.padding).
from tf_ext.padding import mask, masked_mean, masked_sum, padded_extent, size  # noqa: F401

# A Function owns its parts: the call signatures and their traces (signatures.py), the probe
# that finds what can be padded (size_dependence.py), the bucket planner (planner.py), the
# executable cache and compilation (executables.py), the background compile queue
# (compile_queue.py) and the speed check (speed_check.py); its options are declared in
# options.py. This module decides, per call, which executable runs and what to compile next.

logger = logging.getLogger("tf_ext.jit")

# Sizes kept from the calls made while the probe runs (a paused or closed compiler never ends it).
_MAX_EARLY_SIZES = 4096


@options_lib.documented
class Function:
  """A function compiled with XLA per bucket of its padded dimensions; see the module doc.
  Made by tf_ext.jit.function, which takes the same arguments."""

  def __init__(self, fn, *, paddable=None, output_dims=None, name=None, **options):
    options_lib.check(options, "tf_ext.jit.Function")
    self._fn = fn
    functools.update_wrapper(self, fn)
    self.name = name or getattr(fn, "__name__", "function")
    self._signatures = signatures_lib.Signatures(fn, self.name, paddable)
    self._output_dims = output_dims
    self.max_executables = options_lib.value("max_executables", options.get("max_executables"))
    self._planner = planner_lib.Planner(
      lambda dims, boundaries, reason: self._event(
        "plan", dims=dims, boundaries=boundaries, reason=reason
      ),
      **options,
    )
    self.async_compile = options_lib.value("async_compile", options.get("async_compile"))
    self.adaptive = options_lib.value("adaptive", options.get("adaptive"))
    self._speed_checks = {}  # signature key -> SpeedCheck
    self._new_speed_check = speed_check.SpeedCheck  # its defaults; tests make shorter checks

    self._lock = threading.RLock()
    self._warm = {}  # dims -> bucket tuples to compile at the first call (from a saved plan)
    self._warned_oversize = False
    self.events = []  # dicts: plan / compile / evict / oversize / fallback, in order
    # Calls: compiled, larger_bucket, uncompiled (of which speed_check_uncompiled: a ready
    # executable was there, but the speed check chose to run uncompiled), oversize.
    self.stats = collections.Counter()
    self._compile_queue = CompileQueue(self._lock, f"tf_ext.jit:{self.name}", self.async_compile)
    self._executables = Executables(
      self.name, self.max_executables, self._lock, self._event, self._executable_ready
    )
    self._bound_methods = {}
    _LIVE.add(self)
    if options.get("plan_path") is not None:
      self.load_plan(options["plan_path"])

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
      return self._executables.listing()

  def plan(self):
    """{dims tuple: boundaries per dim} currently in force."""
    with self._lock:
      return dict(self._planner.plans)

  def wait_for_compiles(self, timeout=None):
    """Block until no compilation is queued or running (tests, benchmarks, before serving).
    Returns False on timeout. Calls themselves never need this."""
    return self._compile_queue.wait(timeout)

  def compiles_paused(self):
    """Within this block the background compiler starts no compilation (e.g. to keep its CPU
    for a latency-critical phase); calls go on as usual (uncompiled or in ready buckets)."""
    return self._compile_queue.paused()

  def replan(self):
    """Plan the buckets again from the histogram now (normally done on a schedule)."""
    with self._lock:
      self._planner.replan()

  def close(self):
    """Stops the background compiler (the running compilation finishes first)."""
    self._compile_queue.close()

  def save_plan(self, path):
    """Writes the bucket plan as JSON (atomically). `path`: a .json file (or an existing file),
    else a directory (made if missing) that gets `tf_ext_jit_plan.<name>.json`. Returns the
    file's path."""
    path = planner_lib.plan_file(path, self.name)
    with self._lock:
      data = self._planner.to_json(self.name, self._executables.buckets_in_use)
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
    signature, tensors = self._signatures.bind(args, kwargs)
    all_sizes = signature.sizes(tensors)
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
    executables = self._executables
    requests = []
    with self._lock:
      self._planner.observe(signature.dims, sizes)
      before = self._planner.plans.get(signature.dims)
      plan = self._planner.maybe_plan(
        signature.dims,
        sizes,
        compiler_busy=self._compile_queue.busy,
        may_grow=self._may_grow(signature),
      )
      if signature.dims and plan is not None and plan != before and executables.disabled is None:
        # (Without padded dimensions there is no plan: a shape compiles once it comes back.)
        requests += self._plan_requests(signature, tensors, plan, before)
      choice = None
      if plan is not None and executables.disabled is None:
        buckets = tuple(bucket_lib.bucket_of(n, b) for n, b in zip(sizes, plan))
        if None not in buckets:
          key, shapes = signature.bucket_key(tensors, buckets)
          exe = executables.get(key)
          if exe is not None and exe.state == "ready":
            executables.use(exe)
            choice = exe
          else:
            if exe is None and (signature.dims or executables.seen_again(key)):
              reason = "new bucket" if signature.dims else "shape seen again"
              requests.append((signature, key, buckets, shapes, reason))
            choice = executables.ready_larger(signature, tensors, sizes)
            if choice is not None:
              executables.use(choice)
    speed = None
    if self.adaptive:
      with self._lock:
        speed = self._speed_check(signature)
        if speed.xla_faster is False and not speed.checking:
          requests = []  # XLA's code is slower here: no new bucket until a check says otherwise
    if not self.async_compile and executables.disabled is None and plan is not None:
      for request in requests:  # compile in this call, like tf.function(jit_compile=True)
        self._enqueue(*request)
      requests = []
      if self._compile_queue.run_queued():
        with self._lock:
          choice = executables.ready_larger(signature, tensors, sizes)
    timed, ready = False, choice
    if choice is not None and speed is not None:
      with self._lock:
        timed = speed.checking and not self._compile_queue.busy  # a busy one skews the times
        if not speed.run_compiled(timed):
          choice = None
          self.stats["speed_check_uncompiled"] += 1
    start = time.perf_counter()
    if choice is None:
      self.stats["uncompiled"] += 1
      result = signature.run_plain(all_sizes, tensors)
    else:
      self.stats["compiled" if choice.buckets == buckets else "larger_bucket"] += 1
      result = choice.run(tensors, all_sizes)
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
      key, shapes = signature.bucket_key(tensors, combo)
      if key not in self._executables:
        out.append((signature, key, combo, shapes, reason, combo == top))
    return out

  def _options(self):
    """The arguments that make a Function like this one (for a method's bound Functions)."""
    return dict(
      paddable=self._signatures.paddable,
      output_dims=self._output_dims,
      max_executables=self.max_executables,
      **self._planner.options(),
      async_compile=self.async_compile,
      adaptive=self.adaptive,
      name=self.name,
    )

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
    return signature.run_plain(signature.sizes(tensors), tensors)

  # -- internals: plans -------------------------------------------------------------------------

  def _start_probe(self, signature, specs):
    """The probe traces the function again (for a Keras training step, as long as the first
    call's own trace): with background compilation it runs in the compiler's thread, so that the
    first call does not wait for it."""
    if self.async_compile and signature.declared_dims:
      self._compile_queue.push(functools.partial(self._finish_probe, signature, specs))
    else:
      self._finish_probe(signature, specs)

  def _finish_probe(self, signature, specs):
    """Probes the function, then observes the sizes of the calls made meanwhile, plans if that is
    due, and compiles a saved plan's buckets (a warm restart)."""
    try:
      size_dependence.probe(
        signature,
        specs,
        largest_max_size=self._planner.largest_max_size(),
        output_dims=self._output_dims,
        record_event=self._event,
      )
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
          self._executables.seen_again(signature.bucket_key(specs, (), exact)[0])
          continue
        sizes = tuple(all_sizes[signature.declared_dims.index(d)] for d in signature.dims)
        if not self._too_large(signature.dims, sizes):
          self._planner.observe(signature.dims, sizes)
          observed = sizes
      if observed is not None:
        plan = self._planner.maybe_plan(signature.dims, observed, may_grow=False)
        if plan is not None and self._executables.disabled is None:
          requests = self._plan_requests(signature, specs, plan, None)
    self._after_first_call(signature, specs)
    for request in requests:
      self._enqueue(*request)

  def _after_first_call(self, signature, tensors):
    """Warm restart: compile the saved plan's bucket shapes now that the function has run once
    (its variables exist)."""
    warm = self._warm.pop(signature.dims, None)
    if not warm or self._executables.disabled is not None:
      return
    for buckets in warm[: self.max_executables]:
      key, shapes = signature.bucket_key(tensors, tuple(buckets))
      if key not in self._executables:
        self._enqueue(signature, key, tuple(buckets), shapes, "warm restart")

  # -- internals: the compiler and the event log -----------------------------------------------

  def _event(self, event, **fields):
    record = dict(event=event, time=time.time(), **fields)
    self.events.append(record)
    if event == "plan":
      bounds = ", ".join(f"{d}: {list(b)}" for d, b in zip(fields["dims"], fields["boundaries"]))
      logger.info("tf_ext.jit: %s: bucket plan %s (%s)", self.name, bounds, fields["reason"])

  def _enqueue(self, signature, key, buckets, shapes, reason, first=False):
    """Queues a compilation (`first`: ahead of the others, e.g. the bucket holding every size);
    drops the least recently used executables beyond max_executables."""
    with self._lock:
      if key in self._executables or self._compile_queue.closed:
        return
      exe = self._executables.add(signature, key, buckets, shapes, reason)
      self._compile_queue.push(functools.partial(self._executables.compile, exe), first)

  def _executable_ready(self, signature):
    """A new executable of `signature` is ready: its buckets changed, so its speed check starts
    again. The caller holds the lock."""
    speed = self._speed_checks.get(signature.key)
    if speed is not None:
      speed.executables_changed()


_LIVE = weakref.WeakSet()


@atexit.register
def _close_all():
  for fn in list(_LIVE):
    fn.close()


@options_lib.documented
def function(fn=None, *, paddable=None, output_dims=None, name=None, **options):
  """A drop-in for tf.function(jit_compile=True): buckets, background compilation, a bounded
  cache, a saved plan. Use as `function(fn, ...)`, `@function` or `@function(...)`. Keyword
  arguments: paddable (the padded axes of the arguments), output_dims (the padded axes of each
  output, where shape inference cannot tell), name (in logs and the plan's file name; default:
  fn's name), and the options of tf_ext/jit/options.py (listed below in help(), and in the API
  reference), which come from their TF_EXT_JIT_* settings where not given."""
  options_lib.check(options, "tf_ext.jit.function")
  arguments = dict(paddable=paddable, output_dims=output_dims, name=name, **options)
  if fn is None:
    return lambda f: Function(f, **arguments)
  return Function(fn, **arguments)
