"""The one place where tf_ext's optimizer and tape wrappers combine.

tf_ext.DynamicEmbeddingOptimizer, tf_ext.lightcc's DistributedOptimizer / DistributedGradientTape
(and its Keras DistributedOptimizer), and tf_ext.mixed_precision.LossAwareOptimizer do not wrap one
another. Each adds a *stage* to a pipeline that the optimizer (or tape) object itself carries, and
the pipeline runs the stages in one fixed order, whatever order the user wrapped in:

  1. compute gradients: the wrapped optimizer's own compute_gradients, or the tape's gradient(),
     of the loss passed through every stage's `scale_loss` (AMP multiplies it by its loss scale);
  2. transform the gradients, stage by stage in KINDS order: "loss_scale" unscales them,
     "reduce" allreduces / compresses them over all ranks (LightCC);
  3. gate: when a stage's `should_apply` is False (AMP: non-finite gradients), steps 4-5 are
     skipped for this step; the step counter still advances;
  4. apply table gradients: the "tables" stage updates dynamic embedding rows and their slots;
  5. apply the remaining (dense) gradients with the wrapped optimizer's own apply_gradients.

Where the steps run (the conventions of the TensorFlow APIs and of Horovod):
  - tf.compat.v1.train optimizers: 1-2 in compute_gradients (so minimize() and code that calls
    compute_gradients and apply_gradients itself both reduce), 3-5 in apply_gradients;
  - Keras optimizers: 1 in compute_gradients (minimize, Model.fit), 2-5 in apply_gradients, so
    a custom loop's apply_gradients(zip(tape.gradient(...), ...)) is reduced too;
  - tf.GradientTape: 1-2 in gradient() (its target passes through `scale_loss`, recorded on the
    tape); 3-5 belong to the optimizer that gets the gradients.

Wrapping returns the same object with its class extended (a subclass of its own class, made once
per class), so isinstance checks, Keras compile, Estimator, MonitoredTrainingSession, slot names and
checkpoints see the optimizer the user made. A stage of a kind replaces the one already there, so
wrapping twice is harmless. The wrapped optimizer is found through any number of wrappers:
  - ours (they are the same object);
  - Horovod's own wrappers (what tf_ext.lightcc returns with every LIGHT_* setting off): the v1
    `_DistributedOptimizer` delegates to an inner optimizer, which gets the stages; the Keras one
    is a subclass made by Horovod, below which the pipeline is inserted, so Horovod's reduction
    (in compute_gradients) runs before the pipeline's apply steps;
  - Keras' LossScaleOptimizer and TF1's MixedPrecisionLossScaleOptimizer: their inner optimizer
    gets the stages.
"""

import threading

import tensorflow as tf
from tensorflow.python.framework import ops
from tensorflow.python.keras.optimizer_v2 import optimizer_v2 as tf_keras_optimizer_v2

# Stage kinds, in the order their transforms and their apply steps run.
KINDS = ("loss_scale", "reduce", "tables")

_STAGES_ATTRIBUTE = "_tf_ext_pipeline_stages"
# Keras configs list the saved stages under this key; "tables" is the default because files
# saved before the pipeline existed (registered as tf_ext>DynamicEmbedding<Name>) had only it.
_CONFIG_KEY = "tf_ext_stages"
_LEGACY_SAVED_KINDS = ("tables",)


class Stage:
  """What one wrapper contributes; subclasses override the steps they take part in."""

  kind = None  # one of KINDS
  # Whether Keras configs keep this stage (it is then re-created by the factory registered with
  # register_saved_stage, called with the keyword arguments saved_arguments() returned).
  saved = False

  def saved_arguments(self):
    """What a Keras config keeps of this stage: the factory's keyword arguments (JSON values)."""
    return {}

  def owns(self, variable):
    """Whether this stage applies `variable`'s gradients itself (the wrapped optimizer then makes
    no slots for it)."""
    del variable
    return False

  def added_to(self, target):
    """Called when the stage is added to `target` (an optimizer or a tape)."""
    del target

  def scale_loss(self, loss):
    """Step 1: the loss to differentiate."""
    return loss

  def transform(self, grads_and_vars):
    """Step 2: a list of (gradient, variable) pairs -> the transformed list."""
    return grads_and_vars

  def should_apply(self, grads_and_vars):
    """Step 3: a boolean scalar tensor, or None when this stage never skips a step."""
    del grads_and_vars
    return None

  def apply(self, optimizer, grads_and_vars, step):
    """Step 4: applies the pairs this stage owns; returns (update ops, the other pairs).

    `step` is the step counter's value before this step's update (an int64 tensor).
    """
    del optimizer, step
    return [], grads_and_vars


_saved_stage_factories = {}


def register_saved_stage(kind, factory):
  """Lets Keras configs that list `kind` re-create its stage with factory()."""
  _saved_stage_factories[kind] = factory


def stages(obj):
  """The stages of `obj` (an optimizer or a tape, or a wrapper of one), in KINDS order."""
  return _ordered_stages(_pipeline_target(obj))


def _ordered_stages(target):
  by_kind = getattr(target, _STAGES_ATTRIBUTE, {})
  return [by_kind[kind] for kind in KINDS if kind in by_kind]


def _scales_loss(stages_):
  """Whether any of `stages_` changes the loss (so the loss must pass through them)."""
  return any(type(s).scale_loss is not Stage.scale_loss for s in stages_)


def find_stage(obj, kind):
  """The stage of `kind` on `obj`, or None."""
  return next((s for s in stages(obj) if s.kind == kind), None)


def wrapped_optimizer(optimizer):
  """The optimizer whose apply_gradients does the work, through any number of wrappers."""
  inner = _inner_of_foreign_wrapper(optimizer)
  return optimizer if inner is None else wrapped_optimizer(inner)


def add_stage(obj, stage):
  """Adds `stage` to the pipeline of `obj` (an optimizer, a known wrapper of one, or a
  tf.GradientTape), replacing a stage of the same kind; returns `obj` itself."""
  if stage.kind not in KINDS:
    raise ValueError(f"unknown stage kind {stage.kind!r}; known: {KINDS}")
  target = _pipeline_target(obj)
  if isinstance(target, tf.GradientTape):
    if stage.kind == "tables":
      raise TypeError(
        "a tape computes gradients; table gradients are applied by an optimizer "
        "wrapped with tf_ext.DynamicEmbeddingOptimizer"
      )
    _extend_class(target, _tape_pipeline_class)
  else:
    _extend_class(target, _optimizer_pipeline_class)
  by_kind = dict(getattr(target, _STAGES_ATTRIBUTE, {}))
  by_kind[stage.kind] = stage
  setattr(target, _STAGES_ATTRIBUTE, by_kind)
  stage.added_to(target)
  return obj


# ---- wrappers of other libraries ---------------------------------------------------------------


def _inner_of_foreign_wrapper(optimizer):
  """The optimizer a delegating wrapper (Horovod's v1 optimizer, a loss-scale optimizer) passes
  the work to, or None."""
  cls = type(optimizer)
  if cls.__module__.startswith("horovod.") and cls.__name__ == "_DistributedOptimizer":
    return optimizer._optimizer
  if isinstance(optimizer, tf.keras.mixed_precision.LossScaleOptimizer):
    return optimizer.inner_optimizer
  v1_loss_scale = tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer
  if isinstance(optimizer, v1_loss_scale):
    return optimizer._optimizer
  return None


def _is_horovod_made_class(cls):
  """Horovod's Keras DistributedOptimizer and its DistributedGradientTape are classes made per
  optimizer or tape, whose methods call super(self.__class__, self): they cannot be subclassed,
  so the pipeline goes below them."""
  own = vars(cls)
  return own.get("__module__", "").startswith("horovod.") and (
    "_allreduce" in own or "register_local_source" in own
  )


def _below_horovod(base, make_class):
  """Horovod's class `base`, rebuilt on top of the pipeline class of the class it extends."""
  below = _pipeline_class(base.__base__, make_class)
  return type(base.__name__, (below,), dict(vars(base)))


def _pipeline_target(obj):
  """The object that carries the pipeline: `obj`, or what a delegating wrapper delegates to."""
  if isinstance(obj, tf.GradientTape):
    return obj
  inner = _inner_of_foreign_wrapper(obj)
  return obj if inner is None else _pipeline_target(inner)


# ---- the pipeline classes ----------------------------------------------------------------------

# Keras 2's legacy optimizers, and TensorFlow's own older copy of them (tensorflow.python.keras,
# which TFRA's programs use): the same code, two class hierarchies.
KERAS_LEGACY_OPTIMIZERS = (tf.keras.optimizers.legacy.Optimizer, tf_keras_optimizer_v2.OptimizerV2)

_class_lock = threading.RLock()  # reentrant: a class for Horovod's needs one for its base
_classes = {}  # a class -> its pipeline class


def _pipeline_class(cls, make_class):
  with _class_lock:
    extended = _classes.get(cls)
    if extended is None:
      extended = _classes[cls] = make_class(cls)
    return extended


def _extend_class(target, make_class):
  if not issubclass(type(target), (_OptimizerPipeline, _TapePipeline)):
    target.__class__ = _pipeline_class(type(target), make_class)


def _optimizer_pipeline_class(base):
  if _is_horovod_made_class(base):
    return _below_horovod(base, _optimizer_pipeline_class)
  if issubclass(base, tf.compat.v1.train.Optimizer):
    mixin = _V1Pipeline
  elif issubclass(base, KERAS_LEGACY_OPTIMIZERS):
    mixin = _KerasLegacyPipeline
  elif issubclass(base, tf.keras.optimizers.Optimizer):
    mixin = _KerasPipeline
  else:
    raise TypeError(
      f"{type(base).__name__} {base.__name__} is not an optimizer tf_ext can extend: use a "
      "tf.compat.v1.train.Optimizer or a tf.keras optimizer (or a wrapper of one)"
    )
  cls = type(base.__name__, (mixin, base), {"__module__": base.__module__})
  if issubclass(base, (tf.keras.optimizers.Optimizer, tf.keras.optimizers.legacy.Optimizer)):
    _register_keras_class(cls, base)  # TensorFlow's own copy of Keras 2 registers no classes
  return cls


def _register_keras_class(cls, base):
  """Keras saves an optimizer under its class's registered name: tf_ext>Pipeline[Legacy]<Name>;
  tf_ext>DynamicEmbedding[Legacy]<Name> (the name of tf_ext 0.1) loads into the same class."""
  legacy = "Legacy" if issubclass(base, tf.keras.optimizers.legacy.Optimizer) else ""
  tf.keras.utils.register_keras_serializable("tf_ext", f"Pipeline{legacy}{base.__name__}")(cls)
  tf.keras.utils.get_custom_objects()[f"tf_ext>DynamicEmbedding{legacy}{base.__name__}"] = cls


class _OptimizerPipeline:
  """Steps shared by every optimizer pipeline class."""

  def _pipeline_stages(self):
    return _ordered_stages(self)

  def _pipeline_dense_variables(self, variables):
    """`variables` less those a stage applies itself."""
    stages_ = self._pipeline_stages()
    return [v for v in variables if not any(s.owns(v) for s in stages_)]

  def _pipeline_scale_loss(self, loss):
    stages_ = self._pipeline_stages()
    if not _scales_loss(stages_):
      return loss
    if callable(loss):
      unscaled = loss
      return lambda: self._pipeline_scale_value(unscaled())
    return self._pipeline_scale_value(loss)

  def _pipeline_scale_recorded_loss(self, loss, tape):
    """The scaled loss, recorded on `tape` (Keras passes the tape that computed a tensor loss)."""
    if tape is None or callable(loss) or not self._pipeline_stages():
      return self._pipeline_scale_loss(loss)
    with tape:
      return self._pipeline_scale_loss(loss)

  def _pipeline_scale_value(self, loss):
    for stage in self._pipeline_stages():
      loss = stage.scale_loss(loss)
    return loss

  def _pipeline_transform(self, grads_and_vars):
    grads_and_vars = list(grads_and_vars)
    for stage in self._pipeline_stages():
      grads_and_vars = list(stage.transform(grads_and_vars))
    return grads_and_vars

  def _pipeline_apply(self, grads_and_vars, apply_dense, recorded_step, advanced_step):
    """Steps 3-5. apply_dense(pairs) runs the wrapped optimizer's apply_gradients; the updates
    record `recorded_step` (read before it advances); `advanced_step` is the counter the wrapped
    optimizer advances (None: none), advanced here too when no dense gradient is left."""
    grads_and_vars = list(grads_and_vars)
    stages_ = self._pipeline_stages()
    if not stages_:
      return apply_dense(grads_and_vars)
    step = tf.identity(recorded_step) if recorded_step is not None else tf.constant(0, tf.int64)
    self._pipeline_counts_steps = recorded_step is not None
    gates = [g for g in (s.should_apply(grads_and_vars) for s in stages_) if g is not None]

    def apply_all():
      updates, remaining = [], grads_and_vars
      with tf.control_dependencies([step]):
        for stage in stages_:
          stage_updates, remaining = stage.apply(self, remaining, step)
          updates += stage_updates
      if not updates:
        return apply_dense(remaining)
      with tf.control_dependencies(updates):
        # Dense variables without a gradient (a var_list of every trainable variable) are left
        # to the wrapped optimizer only beside one with a gradient: alone it would refuse them.
        if any(g is not None for g, _ in remaining):
          return self._pipeline_result(updates, apply_dense(remaining), advanced_step)
        advance = _advance(advanced_step)
      return self._pipeline_result(updates + [advance], None, advanced_step)

    if not gates:
      return apply_all()
    # Variables cannot be created inside a tf.cond branch: make the optimizer's now.
    self._pipeline_prepare(
      self._pipeline_dense_variables([v for g, v in grads_and_vars if g is not None])
    )
    should_apply = tf.reduce_all(tf.stack(gates))

    def branch(fn):
      def run():
        # Outside tf.function only what the branch's output depends on runs: depend on all of
        # it (an update that returned a variable is read, which waits for the update).
        ops = [
          x if isinstance(x, (tf.Tensor, tf.Operation)) else tf.convert_to_tensor(x)
          for x in tf.nest.flatten(fn())
          if x is not None
        ]
        with tf.control_dependencies(ops):
          return tf.identity(should_apply)

      return run

    done = tf.cond(should_apply, branch(apply_all), branch(lambda: _advance(advanced_step)))
    return self._pipeline_result([done], None, advanced_step)

  def _pipeline_result(self, updates, result, advanced_step):
    """What apply_gradients returns, as the wrapped optimizer's would: `result` is what its
    apply_gradients returned, None when it did not run."""
    raise NotImplementedError

  def _pipeline_prepare(self, variables):
    """Creates the wrapped optimizer's variables (slots) for `variables`."""
    raise NotImplementedError


def counts_steps(optimizer):
  """Whether the step that `optimizer`'s (a pipeline's) stages got in apply counts its steps:
  False for a TF1 optimizer applied without a global step (the stages then get 0)."""
  return getattr(optimizer, "_pipeline_counts_steps", True)


def _advance(step_variable):
  if step_variable is None:
    return tf.no_op()
  return step_variable.assign_add(tf.ones([], step_variable.dtype))


class _V1Pipeline(_OptimizerPipeline):
  def compute_gradients(self, loss, *args, **kwargs):
    grads_and_vars = super().compute_gradients(self._pipeline_scale_loss(loss), *args, **kwargs)
    return self._pipeline_transform(grads_and_vars)

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    def apply_dense(pairs):
      return super(_V1Pipeline, self).apply_gradients(pairs, global_step=global_step, name=name)

    # Rows record the graph's global step even when the caller passes none; only a global_step
    # passed in is advanced, as the wrapped optimizer does.
    recorded = global_step
    if recorded is None and self._pipeline_stages():
      recorded = tf.compat.v1.train.get_global_step()
    return self._pipeline_apply(grads_and_vars, apply_dense, recorded, global_step)

  def _pipeline_result(self, updates, result, advanced_step):
    del advanced_step
    return tf.group(updates + ([] if result is None else [result]))

  def _pipeline_prepare(self, variables):
    with tf.init_scope():
      self._create_slots(variables)


class _KerasPipelineBase(_OptimizerPipeline):
  def apply_gradients(self, grads_and_vars, *args, **kwargs):
    grads_and_vars = self._pipeline_transform(grads_and_vars)

    def apply_dense(pairs):
      return super(_KerasPipelineBase, self).apply_gradients(pairs, *args, **kwargs)

    return self._pipeline_apply(grads_and_vars, apply_dense, self.iterations, self.iterations)

  def _pipeline_result(self, updates, result, advanced_step):
    if result is not None:
      return result
    if not tf.executing_eagerly() and not ops.inside_function():
      # A TF1 session runs only what it fetches: the step's last update, which waits for the
      # others (the counter variable itself would read without running them).
      return updates[-1]
    return advanced_step

  def get_config(self):
    config = super().get_config()
    # A stage without arguments is saved as its kind (what tf_ext 0.2 wrote), else as
    # {"kind": ..., "arguments": {...}}.
    config[_CONFIG_KEY] = [
      {"kind": s.kind, "arguments": s.saved_arguments()} if s.saved_arguments() else s.kind
      for s in self._pipeline_stages()
      if s.saved
    ]
    return config

  @classmethod
  def from_config(cls, config, **kwargs):
    config = dict(config)
    kinds = config.pop(_CONFIG_KEY, _LEGACY_SAVED_KINDS)
    optimizer = super().from_config(config, **kwargs)
    for entry in kinds:
      kind, arguments = (
        (entry, {}) if isinstance(entry, str) else (entry["kind"], entry["arguments"])
      )
      if kind not in _saved_stage_factories:
        raise ValueError(f"the saved optimizer has a tf_ext stage {kind!r} this tf_ext lacks")
      add_stage(optimizer, _saved_stage_factories[kind](**arguments))
    return optimizer


class _KerasPipeline(_KerasPipelineBase):
  def compute_gradients(self, loss, var_list, tape=None):
    loss = self._pipeline_scale_recorded_loss(loss, tape)
    return super().compute_gradients(loss, var_list, tape)

  def build(self, var_list):
    # Keras builds optimizers from all trainable variables (e.g. when loading a model): no slots
    # for the variables a stage applies, as in training.
    super().build(self._pipeline_dense_variables(var_list))

  def _pipeline_prepare(self, variables):
    self.build(variables)


class _KerasLegacyPipeline(_KerasPipelineBase):
  def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
    loss = self._pipeline_scale_recorded_loss(loss, tape)
    return super()._compute_gradients(loss, var_list, grad_loss=grad_loss, tape=tape)

  def _create_all_weights(self, var_list):
    # See _KerasPipeline.build.
    return super()._create_all_weights(self._pipeline_dense_variables(var_list))

  def _pipeline_prepare(self, variables):
    with tf.init_scope():
      self._create_all_weights(variables)


class _TapePipeline:
  def gradient(
    self,
    target,
    sources,
    output_gradients=None,
    unconnected_gradients=tf.UnconnectedGradients.NONE,
  ):
    stages_ = _ordered_stages(self)
    if _scales_loss(stages_):
      with self:  # the scaled loss is recorded on this tape, as the loss was
        for stage in stages_:
          target = tf.nest.map_structure(stage.scale_loss, target)
    grads = super().gradient(target, sources, output_gradients, unconnected_gradients)
    pairs = list(zip(tf.nest.flatten(grads), tf.nest.flatten(sources)))
    for stage in stages_:
      pairs = list(stage.transform(pairs))
    return tf.nest.pack_sequence_as(grads, [g for g, _ in pairs])


def _tape_pipeline_class(base):
  if _is_horovod_made_class(base):
    return _below_horovod(base, _tape_pipeline_class)
  return type(base.__name__, (_TapePipeline, base), {"__module__": base.__module__})


# Keras optimizers saved with a pipeline load in a fresh process once tf_ext is imported.
for _module in (tf.keras.optimizers, tf.keras.optimizers.legacy):
  for _name in ("SGD", "Adagrad", "Adam", "RMSprop", "Adadelta", "Adamax", "Nadam", "Ftrl"):
    if hasattr(_module, _name):
      _pipeline_class(getattr(_module, _name), _optimizer_pipeline_class)
