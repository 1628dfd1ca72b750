"""tf_ext.jit.compile: Keras `model.fit` / `evaluate` / `predict` through the adaptive XLA cache.

`tf_ext.jit.compile(model, optimizer=..., loss=..., metrics=..., min_observations=...)` calls
`model.compile(...)` with the Keras arguments (or, given none, uses the model as compiled) and
makes the model's train, test and predict functions `tf_ext.jit.Function`s: the batch dimension
of every input, target and sample weight is padded to a few planned buckets, each bucket is
compiled with XLA in the background, and the last partial batch or a stream of varying batch
sizes no longer costs one XLA compilation per shape. `tf_ext.jit.functions(model)` returns the
Functions (their `stats`, `events`, `compiles`, `plan()`, `save_plan()`).

How padded rows are kept out (results equal the unpadded computation, within float rounding):

* Each step runs Keras' own pieces: `model(x, training=...)`, `model.compute_loss` (the compiled
  loss), `optimizer.minimize` and `model.compute_metrics`, on the padded batch.
* The padding mask (`tf_ext.jit.mask("batch")`) becomes the Keras mask of the predictions
  (combined with a mask they already carry). Keras then gives padded rows zero weight in every
  compiled loss and metric, and a SUM_OVER_BATCH_SIZE loss divides by the true rows only (Keras
  rescales the weights of masked losses by total/valid), so the loss, its gradients and the
  metrics are the unpadded ones. The loss trackers ("loss", per-output losses) count each batch
  with its true size, as Keras does unpadded.
* Keras' loss reduction reads the batch size (`tf.size`), which the size-dependence check of
  tf_ext.jit.function would flag, so the loss computation is exempt from that check (it is
  masked as above); the forward pass is not: a model whose outputs depend on the batch size
  (batch normalization in training, a mean over the batch, an activity regularizer) is detected
  and its step not padded (one warning; each batch size then compiles once it comes back).
  Custom loss or metric objects must honour `sample_weight` / Keras masks, as Keras' own do.
* A model with its own `train_step`, `test_step` or `compute_loss` / `compute_metrics` (which
  may ignore the mask) gets that step compiled without padding, with one warning.
* Random layers (Dropout) draw their numbers over the padded batch: results are equal in
  distribution, not bit for bit, to an unpadded run.

Not XLA-compiled (Keras' own function, one warning): models with tf_ext dynamic embedding
tables (their ops have no XLA kernels), models whose step XLA cannot compile (the error is
caught at the first compiled call, which then reruns uncompiled), `run_eagerly=True`, inputs
that are SparseTensor / RaggedTensor. Multi-replica distribution strategies are rejected.
"""

import functools
import logging
import threading
import types

import tensorflow as tf

from tf_ext.dynamic_embedding.keras.lifecycle_callbacks import model_tables
from tf_ext.jit import options as options_lib
from tf_ext.jit.function import Function
from tf_ext.padding import HELPER_SCOPE, mask, size

logger = logging.getLogger("tf_ext.jit")

_KINDS = ("train", "test", "predict")
_STATE = "_tf_ext_jit_keras"
# Errors that mean "XLA cannot compile this step" (raised before the step runs anything).
_XLA_ERRORS = (
  tf.errors.InvalidArgumentError,
  tf.errors.UnimplementedError,
  tf.errors.NotFoundError,
  tf.errors.InternalError,
)


class _State:
  def __init__(self, paddable, options):
    self.paddable = paddable
    self.options = options
    self.functions = {}  # kind -> Function (the latest made)
    self.fallback = None  # why the model runs on Keras' own functions, once decided
    self.checked = False  # whether the built model was checked for tables
    self.plain = {}  # kind -> tf.function of the step, for inputs tf_ext.jit cannot take
    self.warned = set()


@options_lib.documented
def compile(model, paddable="batch", **kwargs):  # noqa: A001 (tf_ext.jit.compile by design)
  """Runs `model`'s fit / evaluate / predict (and *_on_batch) through tf_ext.jit Functions.

  Args:
    model: a tf.keras.Model (Keras 2).
    paddable: the name of the padded batch dimension (axis 0 of every input, target and sample
      weight), or None to pad nothing (each batch shape its own executable, compiled once it
      comes back).
    **kwargs: the tf_ext.jit options (listed below; plan_path: a directory, each Function reads
      `tf_ext_jit_plan.<model name>.<train|test|predict>.json` there); every other keyword goes
      to `model.compile(...)`. Without Keras arguments the model must be compiled already.

  Returns the model. Calling `model.compile(...)` again later keeps the jit functions (they are
  made again for the new configuration)."""
  if not isinstance(model, tf.keras.Model):
    raise TypeError(f"tf_ext.jit.compile: model must be a tf.keras.Model, got {type(model)!r}")
  if paddable is not None and (not isinstance(paddable, str) or not paddable):
    raise ValueError(
      "tf_ext.jit.compile: paddable must be a dimension name (e.g. 'batch': axis 0 of every "
      f"input, target and sample weight) or None, got {paddable!r}"
    )
  for key in ("output_dims", "name"):
    if key in kwargs:
      raise ValueError(
        f"tf_ext.jit.compile: {key} is not an option for Keras models (outputs are sliced back "
        "by shape inference; the functions are named after the model)"
      )
  options = {k: kwargs.pop(k) for k in list(kwargs) if k in options_lib.NAMES}
  if kwargs.get("jit_compile"):
    raise ValueError(
      "tf_ext.jit.compile: jit_compile=True would compile each batch shape with Keras' own XLA "
      "path; leave it out (tf_ext.jit compiles the steps)"
    )
  if kwargs.get("run_eagerly"):
    raise ValueError("tf_ext.jit.compile: run_eagerly=True runs nothing compiled; leave it out")
  strategy = model.distribute_strategy
  if strategy.num_replicas_in_sync != 1:
    raise ValueError(
      "tf_ext.jit.compile: the model's distribution strategy has "
      f"{strategy.num_replicas_in_sync} replicas; only single-replica models are supported"
    )
  # Check the options now (a bad value raises here, naming its TF_EXT_JIT_* setting).
  Function(lambda x: x, **options).close()
  if kwargs:
    model.compile(**kwargs)
  elif not getattr(model, "_is_compiled", False):
    raise ValueError(
      "tf_ext.jit.compile: the model is not compiled: pass model.compile's arguments (optimizer, "
      "loss, metrics, ...) or call model.compile(...) first"
    )
  if getattr(model, "jit_compile", False):
    raise ValueError(
      "tf_ext.jit.compile: the model was compiled with jit_compile=True; compile it without "
      "(tf_ext.jit compiles the steps)"
    )
  state = _State(paddable, options)
  object.__setattr__(model, _STATE, state)
  for kind in _KINDS:
    maker = types.MethodType(functools.partial(_make_function, kind=kind), model)
    object.__setattr__(model, f"make_{kind}_function", maker)
  model.train_function = model.test_function = model.predict_function = None
  return model


def functions(model):
  """{"train" | "test" | "predict": tf_ext.jit.Function} made so far for a model given to
  tf_ext.jit.compile (each is made at the first fit / evaluate / predict)."""
  state = getattr(model, _STATE, None)
  if state is None:
    raise ValueError("tf_ext.jit.functions: the model was not given to tf_ext.jit.compile")
  return dict(state.functions)


# ---------------------------------------------------------------------------------------------


def _keras_function(model, kind, force=True):
  """Keras' own function for `kind` (what the model runs without tf_ext.jit)."""
  return getattr(tf.keras.Model, f"make_{kind}_function")(model, force=force)


def _overridden(model, kind):
  names = {"train": ("train_step", "compute_loss", "compute_metrics")}
  names["test"] = ("test_step", "compute_loss", "compute_metrics")
  names["predict"] = ("predict_step",)
  return [n for n in names[kind] if getattr(type(model), n) is not getattr(tf.keras.Model, n, None)]


def _warn_once(state, key, message, *args):
  if key not in state.warned:
    state.warned.add(key)
    logger.warning(message, *args)


def _make_function(model, force=False, *, kind):
  attribute = f"{kind}_function"
  if getattr(model, attribute) is not None and not force:
    return getattr(model, attribute)
  state = getattr(model, _STATE)
  if model.run_eagerly:
    _warn_once(state, "eager", "tf_ext.jit: %s runs eagerly (run_eagerly=True): no XLA", model.name)
    return _keras_function(model, kind)
  if getattr(model, "jit_compile", False):
    raise ValueError(
      f"tf_ext.jit: {model.name} was compiled again with jit_compile=True; compile it without"
    )
  custom = _overridden(model, kind)
  padded = state.paddable is not None and not custom
  if custom and state.paddable is not None:
    _warn_once(
      state,
      ("custom", kind),
      "tf_ext.jit: %s overrides %s: its %s step is compiled without padding (tf_ext.jit "
      "cannot tell that it masks padded rows)",
      model.name,
      ", ".join(custom),
      kind,
    )
  step = _step(model, kind, custom=bool(custom), padded=padded)
  jit_fn = Function(
    step,
    paddable=state.paddable if padded else None,
    name=f"{model.name}.{kind}",
    **state.options,
  )
  previous = state.functions.get(kind)
  if previous is not None:  # made again (model.compile again, or force=True)
    previous.close()
  state.functions[kind] = jit_fn
  keras_fn = None

  def keras_function():
    nonlocal keras_fn
    if keras_fn is None:
      keras_fn = _keras_function(model, kind)  # (it sets model.<kind>_function: put ours back)
      object.__setattr__(model, attribute, run)
    return keras_fn

  def run(iterator):
    if state.fallback is not None:
      return keras_function()(iterator)
    if not model.built:  # its first step builds it (and its tables, if any): run it in Keras
      return keras_function()(iterator)
    if not state.checked:
      state.checked = True
      if model_tables(model, eager=False):
        state.fallback = "it uses tf_ext dynamic embedding tables, whose ops XLA cannot compile"
        logger.warning(
          "tf_ext.jit: %s: %s; running Keras' own functions (not XLA-compiled)",
          model.name,
          state.fallback,
        )
    if state.fallback is not None:
      return keras_function()(iterator)
    steps = getattr(model, "_steps_per_execution", None)
    steps = 1 if steps is None else max(1, int(steps.numpy().item()))
    outputs = []
    for i in range(steps):
      try:
        data = next(iterator)
      except (StopIteration, tf.errors.OutOfRangeError):
        if i == 0:
          raise
        break
      outputs.append(_run_step(model, kind, state, jit_fn, data))
      counter = getattr(model, f"_{kind}_counter", None)
      if counter is not None:
        counter.assign_add(1)
    if kind != "predict" or len(outputs) == 1:
      return outputs[-1]
    return tf.nest.map_structure(lambda *parts: tf.concat(parts, 0), *outputs)

  object.__setattr__(model, attribute, run)
  return run


def _run_step(model, kind, state, jit_fn, data):
  x, y, sample_weight = tf.keras.utils.unpack_x_y_sample_weight(data)
  leaves = tf.nest.flatten((x, y, sample_weight))
  if any(isinstance(v, tf.__internal__.CompositeTensor) for v in leaves):
    _warn_once(
      state,
      ("composite", kind),
      "tf_ext.jit: %s: SparseTensor / RaggedTensor inputs: its %s steps run uncompiled",
      model.name,
      kind,
    )
    return _plain_step(model, kind)(x, y, sample_weight)
  try:
    return jit_fn(x, y, sample_weight)
  except _XLA_ERRORS as error:
    if "XLA" not in str(error) and "compil" not in str(error):
      raise
    state.fallback = f"XLA cannot compile its steps ({type(error).__name__}: {error})"
    logger.warning(
      "tf_ext.jit: %s: %s; running Keras' own functions",
      model.name,
      state.fallback.splitlines()[0][:500],
    )
    for fn in state.functions.values():
      fn.close()
    return _plain_step(model, kind)(x, y, sample_weight)


def _plain_step(model, kind):
  """One step as a tf.function (no XLA), shared by the fallbacks of one model and kind."""
  cache = getattr(model, _STATE).plain
  if kind not in cache:
    cache[kind] = tf.function(_step(model, kind, custom=True, padded=False), reduce_retracing=True)
  return cache[kind]


def _step(model, kind, custom, padded):
  """The step that tf_ext.jit traces: Keras' own step (custom), or Keras' pieces with the
  padding mask on the predictions (padded)."""
  if custom:
    method = getattr(model, f"{kind}_step")
    return lambda x, y=None, sample_weight=None: method(_pack(x, y, sample_weight))
  dim = getattr(model, _STATE).paddable

  def forward(x, training):
    y_pred = model(x, training=training)
    return _with_row_mask(y_pred, dim) if padded else y_pred

  def loss(x, y, y_pred, sample_weight):
    # Exempt from the size-dependence check: Keras' reductions read the batch size, and the
    # mask above makes them exact.
    rows = _TrueRows(model, dim if padded else None, y_pred)
    with tf.name_scope(HELPER_SCOPE), rows:
      return model.compute_loss(x, y, y_pred, sample_weight)

  if kind == "train":

    def train_step(x, y=None, sample_weight=None):
      with tf.GradientTape() as tape:
        y_pred = forward(x, True)
        value = loss(x, y, y_pred, sample_weight)
      model._validate_target_and_loss(y, value)
      model.optimizer.minimize(value, model.trainable_variables, tape=tape)
      return model.compute_metrics(x, y, y_pred, sample_weight)

    return train_step
  if kind == "test":

    def test_step(x, y=None, sample_weight=None):
      y_pred = forward(x, False)
      loss(x, y, y_pred, sample_weight)
      return model.compute_metrics(x, y, y_pred, sample_weight)

    return test_step

  def predict_step(x, y=None, sample_weight=None):
    del y, sample_weight
    return model(x, training=False)

  return predict_step


def _pack(x, y, sample_weight):
  if y is None and sample_weight is None:
    return (x,)
  if sample_weight is None:
    return (x, y)
  return (x, y, sample_weight)


def _with_row_mask(y_pred, dim):
  """y_pred with the padding mask as its Keras mask (AND the mask it has): Keras' compiled
  losses and metrics then give padded rows zero weight."""
  rows = mask(dim)

  def attach(value):
    if not isinstance(value, tf.Tensor) or not value.shape.rank:
      return value
    existing = getattr(value, "_keras_mask", None)
    value = tf.identity(value)  # a tensor of our own to carry the mask
    valid = rows
    if existing is not None:
      shape = tf.concat([[-1], tf.ones([existing.shape.rank - 1], tf.int32)], 0)
      valid = tf.logical_and(tf.cast(existing, tf.bool), tf.reshape(rows, shape))
    value._keras_mask = valid
    return value

  return tf.nest.map_structure(attach, y_pred)


class _TrueRows:
  """Within a padded step's loss: the loss trackers (Mean metrics that the compiled loss updates
  with `sample_weight=batch size`) count the true rows, not the padded batch."""

  def __init__(self, model, dim, y_pred):
    self.model, self.dim, self.y_pred = model, dim, y_pred

  def __enter__(self):
    if self.dim is None:
      return self
    container = getattr(self.model, "compiled_loss", None)
    if container is not None:
      if not getattr(container, "_built", True):
        container.build(self.y_pred)  # its loss trackers exist from here on
      for metric in container.metrics:
        _count_true_rows(metric)
    self._previous = getattr(_local, "rows", None)
    _local.rows = size(self.dim)
    return self

  def __exit__(self, *exc):
    if self.dim is not None:
      _local.rows = self._previous
    return False


_local = threading.local()


def _count_true_rows(metric):
  if getattr(metric, "_tf_ext_jit_true_rows", False):
    return
  update_state = metric.update_state

  def update_state_with_true_rows(values, sample_weight=None, **kwargs):
    rows = getattr(_local, "rows", None)
    if rows is not None and sample_weight is not None:
      sample_weight = rows  # the batch's true size, where Keras passes tf.shape(y_true)[0]
    return update_state(values, sample_weight=sample_weight, **kwargs)

  object.__setattr__(metric, "update_state", update_state_with_true_rows)
  object.__setattr__(metric, "_tf_ext_jit_true_rows", True)
