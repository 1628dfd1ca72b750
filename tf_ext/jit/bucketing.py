"""tf_ext.jit.Bucketing: the compilation cache for TF1 Sessions and Estimator.

In a Session, XLA compiles its clusters (those of tf_ext.graph_optimizations' dense-part pass,
auto-jit, or a jit_scope) once per distinct input shape, and a stream of varying batch sizes
makes that one compile per batch size. A graph pass cannot pad inside the model on its own: a
padded row changes every batch reduction (the loss mean, batch statistics) and a rewrite cannot
know which reductions are over the batch. So the padding happens where the batch is made:

  bucketing = tf_ext.jit.Bucketing(name="ctr", plan_path=model_dir)
  def input_fn():
    return bucketing.pad(make_batches())        # dicts of features, or (features, labels)
  def model_fn(features, labels, mode):
    with bucketing.padded(features):            # tf_ext.jit.size / mask / masked_* see the rows
      logits = tower(features)
      loss = tf_ext.jit.masked_mean(per_example_loss(labels, logits))
      predictions = tf_ext.jit.unpad(logits)    # the real rows only

* `pad` pads every declared axis (`paddable`, as for tf_ext.jit.function; "batch" = axis 0 of
  every tensor) to its bucket with zeros; a SparseTensor is padded by its dense shape alone (its
  padded rows are empty: an embedding lookup gives them zero rows, and no table row is touched)
  and a RaggedTensor by empty rows. Dense ids are padded with zeros, a real key: inside
  `padded`, tf_ext.embedding_lookup looks up the real rows of a padded input (or of a cast, hash or
  slice of one) only. It adds the true and padded sizes to the features dict under SIZES_KEY.
* The buckets come from the same planner as tf_ext.jit.function (tf_ext/jit/planner.py): before
  the first plan, batches are padded to the largest size seen so far, rounded up to a power of
  two (so the observation phase makes a few shapes, not one per size); then the plan grows as the
  run proves long. At most `max_executables` distinct bucket shapes are ever emitted: TensorFlow
  cannot free an executable from a Session's XLA cache, so the bound holds by never making more
  shapes (later sizes go to an emitted bucket that holds them).
* No waiting on the compiler: a Bucketing turns on TensorFlow's asynchronous XLA compilation
  (TF_EXT_JIT_ASYNC), under which a cluster seeing a new bucket shape runs uncompiled while that
  shape compiles in the background. With at most max_executables (8) shapes, TensorFlow's limit
  of 10 compilations in flight and its megamorphic cut-off (after 10 compiles) are never reached.
  A Session of a padded graph waits in close() for the compilations in flight: closing it under
  them crashes TensorFlow 2.15.
* Compiled only where XLA is faster (TF_EXT_JIT_ADAPTIVE, the speed gate: kernels/jit/
  core/speed_gate.h): XLA's code is not faster on every CPU (oneDNN's kernels may win). A
  Bucketing turns on, process-wide, a pass that gates the lazily compiled CPU clusters of the
  graphs built afterwards: once executables are ready, 12 steps run them compiled and 12
  uncompiled, alternating, the steps' times per input element are compared, and the faster way
  runs (compiled: checked again every 1000 steps). Whole steps are timed, not the clusters: a
  cluster runs beside other work, and one faster alone can still make the step slower. A step
  that runs uncompiled does not even ask XLA for an executable (so new shapes compile nothing),
  and after an uncompiled verdict the batches pass unpadded (padding would only cost) and no
  check follows: the verdict is final for that graph; a later pad() (a new graph) pads again.
  Each verdict is a "speed check" event (with a "padding" event when padding stops or resumes)
  and an INFO log line; tf_ext.jit.speed_verdicts() lists them all.
* Every XLA compilation of the process is recorded by tf_ext's XLA activity listener:
  tf_ext.jit.compile_log().
* Warm restart: the plan (boundaries, histogram, bucket shapes in use) is written to `plan_path`
  whenever it changes, and read back at construction: a restarted job pads to the planned
  buckets from its first batch (each compiles, in the background, when it first occurs) instead
  of observing again. `plan_path` is a .json file (or an existing file), or a directory (made if
  missing; e.g. the Estimator's model_dir, next to the checkpoints) that gets
  tf_ext_jit_plan.<name>.json: the same rule as tf_ext.jit.function's.
* A size above TF_EXT_JIT_MAX_SIZE is not padded (one warning); the cluster compiles it as its
  own shape.
"""

import contextlib
import logging
import math
import threading
import time

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from tf_ext import padding
from tf_ext.jit import buckets as bucket_lib
from tf_ext.jit import options as options_lib
from tf_ext.jit import paddable as paddable_lib
from tf_ext.jit import planner as planner_lib
from tf_ext.jit import session_guard, size_dependence, xla_compiles

logger = logging.getLogger("tf_ext.jit")

# The graph collection of unpad()'s results.
_UNPADDED = "tf_ext_jit_unpadded"

SIZES_KEY = "tf_ext_jit_sizes"
"""The features key under which Bucketing.pad adds each batch's sizes: an int32 [2, dims] tensor,
the true sizes then the padded ones."""


@options_lib.documented
class Bucketing:
  """Pads the batches of a tf.data pipeline to planned buckets for TF1 Sessions and Estimator;
  see the module doc. `paddable`: as for tf_ext.jit.function; `name`: in logs and the plan's file
  name."""

  def __init__(self, paddable="batch", *, name="input", **options):
    options_lib.check(options, "tf_ext.jit.Bucketing")
    if not isinstance(name, str) or not name:
      raise ValueError(f"tf_ext.jit.Bucketing: name must be a non-empty string, got {name!r}")
    self.name = name
    self._paddable = (
      paddable_lib.Axes({0: paddable})
      if isinstance(paddable, str)
      else paddable_lib.normalize_spec(paddable)
    )
    if self._paddable is None:
      raise ValueError("tf_ext.jit.Bucketing: paddable names no dimension")
    self.max_executables = options_lib.value("max_executables", options.get("max_executables"))
    self.async_compile = options_lib.value("async_compile", options.get("async_compile"))
    self.adaptive = options_lib.value("adaptive", options.get("adaptive"))
    self._planner = planner_lib.Planner(self._on_plan, **options)
    self._lock = threading.Lock()
    self._dims = None  # dimension names in SIZES_KEY order (known once pad() saw the element)
    self._emitted = {}  # bucket tuple -> batches padded to it (insertion order = first use)
    self._observing_top = None  # the padded sizes of the observation phase
    self._warned_oversize = False
    self._loaded = {}  # from a saved plan: dims -> bucket tuples in use (checked by pad())
    self._events = []  # dicts: plan / bucket / oversize / over_bound / speed check / padding
    # elements: the product of a batch's true sizes, summed; padding: what padding added to it.
    self.stats = {"batches": 0, "elements": 0, "padding": 0, "oversize": 0}
    self._plan_file = None
    if options.get("plan_path") is not None:
      self._plan_file = planner_lib.plan_file(options["plan_path"], name)
      self._load_plan()
    if self.async_compile:
      xla_compiles.set_async_compilation(True)
      session_guard.install_close_guard()
    self._verdicts_seen = 0  # the speed gate's verdicts already turned into events
    self._unpadded = False  # the speed gate chose uncompiled: batches pass unpadded
    if self.adaptive:  # the verdicts are process-wide: those of earlier graphs are not ours
      self._verdicts_seen = xla_compiles.speed_verdict_count()
    xla_compiles.set_speed_gate(self.adaptive)  # process-wide, like the asynchronous compilation

  # -- public -----------------------------------------------------------------------------------

  @property
  def events(self):
    """What happened, in order: dicts with "event" (plan, bucket, oversize, over_bound, speed
    check, padding) and "time"."""
    with self._lock:
      if self.adaptive:
        self._note_speed_verdicts()
      return list(self._events)

  def plan(self):
    """{dims tuple: boundaries per dim} in force."""
    with self._lock:
      return dict(self._planner.plans)

  def buckets(self):
    """{bucket sizes tuple: batches padded to it}, in the order of first use."""
    with self._lock:
      return dict(self._emitted)

  def save_plan(self):
    """Writes the plan to plan_path now (it is also written whenever it changes)."""
    if self._plan_file is None:
      raise ValueError(f"tf_ext.jit.Bucketing {self.name!r} has no plan_path")
    with self._lock:
      self._write_plan()
    return self._plan_file

  def pad(self, dataset):
    """`dataset` with every batch padded to its bucket and SIZES_KEY added to its features."""
    if not isinstance(dataset, tf.data.Dataset):
      raise TypeError(f"tf_ext.jit.Bucketing.pad: expected a tf.data.Dataset, got {dataset!r}")
    element_spec = dataset.element_spec
    _features_of(element_spec)  # checks the structure
    leaf_axes = self._leaf_axes(element_spec)
    dims = []
    for axes in leaf_axes:
      dims += [d for d in axes.values() if d not in dims]
    if not dims:
      raise ValueError(f"tf_ext.jit.Bucketing {self.name!r}: paddable matches no tensor")
    with self._lock:
      if self._dims is not None and tuple(dims) != self._dims:
        raise ValueError(
          f"tf_ext.jit.Bucketing {self.name!r}: this dataset pads {tuple(dims)}, an earlier one "
          f"{self._dims}; use one Bucketing per kind of input"
        )
      self._dims = tuple(dims)
      # A new pipeline is likely a new graph, whose gate asks XLA until its own check: pad.
      self._unpadded = False
      in_use = self._loaded.pop(self._dims, None)
      if in_use is not None:  # a restart: the shapes of the saved plan are the ones compiled
        for bucket in in_use[::-1][: self.max_executables]:
          self._emitted.setdefault(tuple(bucket), 0)
      elif self._loaded:
        logger.warning(
          "tf_ext.jit.Bucketing %s: the saved plan is for dimensions %s, this dataset pads %s: "
          "planning afresh",
          self.name,
          list(self._loaded),
          self._dims,
        )
        self._planner.plans.clear()
        self._planner.joint.clear()
        self._loaded = {}

    if self.async_compile:
      session_guard.guard_sessions_of(tf.compat.v1.get_default_graph())

    @tf.autograph.experimental.do_not_convert
    def pad_element(*components):
      element = components[0] if len(components) == 1 else components
      return self._pad_element(element, leaf_axes)

    return dataset.map(pad_element)

  @contextlib.contextmanager
  def padded(self, features, check=True):
    """Within this block (e.g. a model_fn's body), tf_ext.jit.size / mask / masked_sum /
    masked_mean and unpad see the true sizes of the batch in `features` (a dict from pad()).
    With `check`, the block's ops are scanned on exit for results that padded rows would change
    (a mean or a batch normalization over the batch, a batch size used as a value), and such a
    model fails with a ValueError naming them, instead of training on wrong numbers."""
    if not isinstance(features, dict) or SIZES_KEY not in features:
      raise ValueError(
        f"tf_ext.jit.Bucketing.padded: features have no {SIZES_KEY!r}: pass the features dict of "
        "a dataset made by Bucketing.pad"
      )
    if self._dims is None:
      raise ValueError(f"tf_ext.jit.Bucketing {self.name!r}: pad() has not made a dataset yet")
    sizes = features[SIZES_KEY]
    lengths = {dim: (sizes[1, i], None) for i, dim in enumerate(self._dims)}
    # A tensor carrying the dimension gives its padded length statically where it can.
    plain = {k: v for k, v in features.items() if k != SIZES_KEY}
    spec = self._paddable
    if isinstance(spec, (list, tuple)):  # (features, labels, ...): the features' part
      spec = spec[0]
    leaf_axes = paddable_lib.leaf_axes(plain, spec)
    padded_inputs = {}  # the dense tensors: lookups of padded ids look up the real ones only
    for leaf, axes in zip(tf.nest.flatten(plain), leaf_axes):
      if not isinstance(leaf, tf.Tensor) or not axes:
        continue
      axes = {axis % leaf.shape.rank: dim for axis, dim in axes.items()}
      padded_inputs[leaf.ref()] = axes
      for axis, dim in axes.items():
        if lengths.get(dim, (0, 0))[1] is None:
          lengths[dim] = (leaf, axis)
    graph = tf.compat.v1.get_default_graph()
    if self.async_compile:
      session_guard.guard_sessions_of(graph)
    first_op = len(graph.get_operations())
    with padding.active(padding.Context(self._dims, sizes[0], lengths, padded_inputs)):
      yield
    if check:
      unpadded = {t.name for t in graph.get_collection(_UNPADDED)}
      found = size_dependence.batch_size_dependent_ops(graph.get_operations()[first_op:], unpadded)
      if found:
        raise ValueError(
          f"tf_ext.jit.Bucketing {self.name!r}: padded rows would change these results: "
          + "; ".join(found[:5])
          + ". Reduce over the batch with tf_ext.jit.masked_mean / masked_sum (a Keras loss: "
          "reduction NONE, then masked_mean), use tf_ext.jit.size() for the batch size, or do not "
          "pad this model (padded(..., check=False) skips this check)"
        )

  # -- internals --------------------------------------------------------------------------------

  def _leaf_axes(self, structure):
    out = []
    leaves = tf.nest.flatten(structure)
    for leaf, axes in zip(leaves, paddable_lib.leaf_axes(structure, self._paddable)):
      rank = leaf.shape.rank
      if not axes or rank == 0:
        out.append({})
        continue
      if rank is None:
        raise ValueError(
          f"tf_ext.jit.Bucketing {self.name!r}: a padded input has unknown rank: {leaf}"
        )
      for axis in axes:
        if not -rank <= axis < rank:
          raise ValueError(
            f"tf_ext.jit.Bucketing {self.name!r}: axis {axis} of an input of rank {rank} "
            "does not exist"
          )
      out.append({a % rank: d for a, d in axes.items()})
    return out

  def _pad_element(self, element, leaf_axes):
    leaves = tf.nest.flatten(element)
    found = []  # (dim index, size) per padded axis, to check and to plan
    for leaf, axes in zip(leaves, leaf_axes):
      for axis, dim in axes.items():
        found.append((self._dims.index(dim), _length(leaf, axis)))
    dim_of_axis = np.array([d for d, _ in found], np.int32)
    lengths = tf.cast(tf.stack([n for _, n in found]), tf.int32)
    bucket = tf.numpy_function(
      lambda n: self._bucket_for(dim_of_axis, n), [lengths], tf.int32, stateful=True
    )
    bucket.set_shape([2, len(self._dims)])
    padded = []
    for leaf, axes in zip(leaves, leaf_axes):
      for axis, dim in axes.items():
        leaf = _pad_axis(leaf, axis, bucket[1, self._dims.index(dim)])
      padded.append(leaf)
    element = tf.nest.pack_sequence_as(element, padded)
    features = dict(_features_of(element))
    if SIZES_KEY in features:
      raise ValueError(f"tf_ext.jit.Bucketing: the features already have a {SIZES_KEY!r}")
    features[SIZES_KEY] = bucket
    if isinstance(element, dict):
      return features
    return (features,) + tuple(element[1:])

  def _bucket_for(self, dim_of_axis, lengths):
    """numpy: the [true sizes, padded sizes] of one batch; plans as a side effect."""
    sizes = [None] * len(self._dims)
    for d, n in zip(dim_of_axis, lengths):
      if sizes[d] is None:
        sizes[d] = int(n)
      elif sizes[d] != int(n):
        raise ValueError(
          f"tf_ext.jit.Bucketing {self.name!r}: dimension {self._dims[d]!r} has sizes "
          f"{sizes[d]} and {int(n)} in one batch"
        )
    sizes = tuple(sizes)
    with self._lock:
      padded = self._choose(sizes)
      self.stats["batches"] += 1
      self.stats["elements"] += int(np.prod(sizes))
      self.stats["padding"] += int(np.prod(padded) - np.prod(sizes))
      if self.adaptive and xla_compiles.speed_verdict_count() > self._verdicts_seen:
        self._note_speed_verdicts()
    return np.array([sizes, padded], np.int32)

  def _note_speed_verdicts(self):
    """The speed gate's new verdicts (they come from the Session's steps) as events and logs."""
    for verdict in xla_compiles.speed_verdicts(self._verdicts_seen):
      self._verdicts_seen = verdict["sequence"]
      self._event("speed check", **{k: v for k, v in verdict.items() if k != "sequence"})
      if self._unpadded == verdict["run_compiled"]:
        self._unpadded = not verdict["run_compiled"]
        self._event("padding", on=not self._unpadded)
      logger.info(
        "tf_ext.jit.Bucketing %s: speed check of XLA clusters %s: steps took %.3g ns per input "
        "element compiled, %.3g uncompiled: they run %s",
        self.name,
        verdict["clusters"],
        verdict["compiled_ns_per_element"],
        verdict["uncompiled_ns_per_element"],
        "compiled" if verdict["run_compiled"] else "uncompiled (batches now pass unpadded)",
      )

  def _choose(self, sizes):
    dims = self._dims
    too_large = [(d, n) for d, n in zip(dims, sizes) if n > self._planner.max_size_of(d)]
    if too_large:
      self.stats["oversize"] += 1
      if not self._warned_oversize:
        self._warned_oversize = True
        what = ", ".join(f"{d}={n} > {self._planner.max_size_of(d)}" for d, n in too_large)
        logger.warning(
          "tf_ext.jit.Bucketing %s: %s: not padded (TF_EXT_JIT_MAX_SIZE); such batches compile "
          "as shapes of their own (warned once)",
          self.name,
          what,
        )
        self._event("oversize", sizes=sizes)
      return sizes
    self._planner.observe(dims, sizes)
    if self._unpadded:
      return sizes
    before = self._planner.plans.get(dims)
    plan = self._planner.maybe_plan(dims, sizes)
    if plan is None:  # observing: the largest size so far, up to a power of two
      top = self._observing_top or (0,) * len(dims)
      top = tuple(
        t if n <= t else min(2 ** math.ceil(math.log2(n)), self._planner.max_size_of(d))
        for d, n, t in zip(dims, sizes, top)
      )
      self._observing_top = top
      return self._use(top)
    want = tuple(bucket_lib.bucket_of(n, b) for n, b in zip(sizes, plan))
    if plan != before and self._plan_file is not None:
      self._write_plan()
    if want not in self._emitted:  # a made shape at most 1/8 larger costs no compilation
      near = [b for b in self._emitted if all(w <= x <= w * 1.125 for w, x in zip(want, b))]
      if near:
        want = min(near, key=lambda b: np.prod(b))
    if want in self._emitted or len(self._emitted) < self.max_executables:
      return self._use(want)
    # The bound: an emitted bucket that holds the sizes, the smallest; else a new shape anyway.
    holding = [b for b in self._emitted if all(x >= n for x, n in zip(b, sizes))]
    if holding:
      return self._use(min(holding, key=lambda b: np.prod(b)))
    self._event("over_bound", bucket=want, max_executables=self.max_executables)
    logger.warning(
      "tf_ext.jit.Bucketing %s: %s fits no bucket made so far and %d is the limit "
      "(TF_EXT_JIT_MAX_EXECUTABLES): one more shape",
      self.name,
      paddable_lib.describe(self._dims, sizes),
      self.max_executables,
    )
    return self._use(want)

  def _use(self, bucket):
    if bucket not in self._emitted:
      self._emitted[bucket] = 0
      self._event("bucket", bucket=bucket, shapes=len(self._emitted))
      logger.info(
        "tf_ext.jit.Bucketing %s: new bucket shape %s (%d so far)",
        self.name,
        paddable_lib.describe(self._dims, bucket),
        len(self._emitted),
      )
      if self._plan_file is not None:
        self._write_plan()
    self._emitted[bucket] += 1
    return bucket

  def _on_plan(self, dims, boundaries, reason):
    self._event("plan", dims=dims, boundaries=boundaries, reason=reason)
    bounds = ", ".join(f"{d}: {list(b)}" for d, b in zip(dims, boundaries))
    logger.info("tf_ext.jit.Bucketing %s: bucket plan %s (%s)", self.name, bounds, reason)

  def _event(self, event, **fields):
    self._events.append(dict(event=event, time=time.time(), **fields))

  def _write_plan(self):
    data = self._planner.to_json(self.name, lambda dims: list(self._emitted)[::-1])
    planner_lib.write_json_atomically(self._plan_file, data)

  def _load_plan(self):
    data = planner_lib.read_json(self._plan_file)
    if data is None:
      logger.info("tf_ext.jit.Bucketing %s: no saved plan at %s", self.name, self._plan_file)
      return
    self._loaded = self._planner.load_json(data, self._plan_file)


def unpad(values, dim="batch", axis=0):
  """`values` without the padded positions of `dim` on `axis` (e.g. predictions of the real
  rows). Inside Bucketing.padded or a tf_ext.jit function; elsewhere `values` itself. The slice
  is kept out of XLA clusters: its size is the true one, which would make a compile per size."""
  if not padding.inside():
    return values
  values = tf.convert_to_tensor(values)
  rank = values.shape.rank
  axis = axis % rank
  begin = [0] * rank
  size = [-1] * rank
  size[axis] = padding.size(dim)
  no_xla = {"_XlaCompile": attr_value_pb2.AttrValue(b=False)}
  with tf.compat.v1.get_default_graph()._attr_scope(no_xla):
    with tf.name_scope(padding.HELPER_SCOPE):
      real = tf.slice(values, tf.stack(begin), tf.stack(size))
  if not tf.executing_eagerly():  # what is computed from it has no padded rows to check
    tf.compat.v1.add_to_collection(_UNPADDED, real)
  return real


def _features_of(element):
  if isinstance(element, dict):
    return element
  if isinstance(element, tuple) and element and isinstance(element[0], dict):
    return element[0]
  raise TypeError(
    "tf_ext.jit.Bucketing.pad: dataset elements must be a dict of features or a tuple "
    f"(features dict, labels, ...); got {element!r}"
  )


def _length(leaf, axis):
  if isinstance(leaf, tf.SparseTensor):
    return leaf.dense_shape[axis]
  if isinstance(leaf, tf.RaggedTensor):
    if axis != 0:
      raise ValueError("tf_ext.jit.Bucketing: a RaggedTensor can be padded on axis 0 only")
    return leaf.nrows()
  return tf.shape(leaf, out_type=tf.int64)[axis]


def _pad_axis(leaf, axis, target):
  target = tf.cast(target, tf.int64)
  static = leaf.shape.as_list()
  static[axis] = None  # the padded length varies; the other dimensions stay known
  if isinstance(leaf, tf.SparseTensor):  # padded rows are empty: only the dense shape grows
    shape = tf.tensor_scatter_nd_update(leaf.dense_shape, [[axis]], [target])
    padded = tf.SparseTensor(leaf.indices, leaf.values, shape)
  elif isinstance(leaf, tf.RaggedTensor):  # empty rows appended
    splits = leaf.row_splits
    extra = tf.cast(target, splits.dtype) - leaf.nrows(out_type=splits.dtype)
    splits = tf.concat([splits, tf.fill([extra], splits[-1])], 0)
    return tf.RaggedTensor.from_row_splits(leaf.values, splits, validate=False)
  else:
    extra = target - tf.shape(leaf, out_type=tf.int64)[axis]
    padded = tf.pad(leaf, tf.scatter_nd([[axis, 1]], [extra], [len(static), 2]))
  padded.set_shape(static)
  return padded
