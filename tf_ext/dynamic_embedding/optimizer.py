"""DynamicEmbeddingOptimizer: lets a TF1 or Keras optimizer train dynamic embedding tables.

Gradients of table lookups reach the table's gradient anchor variable as IndexedSlices keyed
by the looked-up ids. The wrapper adds the "tables" stage to the optimizer's pipeline
(tf_ext/optimizer_pipeline.py), which splits them off in `apply_gradients`: duplicate ids are
summed and one fused op updates each row and its co-located slots in place (creating rows
that are new). Every other variable goes to the wrapped optimizer unchanged.

Adam on table rows is "lazy" (only rows in the batch move) and bias-corrects with each row's
own update count, which equals the global step for a row seen in every batch.
"""

import collections

import tensorflow as tf

from tf_ext import _ops_loader, optimizer_pipeline
from tf_ext.dynamic_embedding import variable as variable_lib

# learning_rate is a callable so that validating an optimizer creates no tensors or variables.
_Hyper = collections.namedtuple(
  "_Hyper",
  [
    "kind",
    "learning_rate",
    "beta1",
    "beta2",
    "epsilon",
    "epsilon_inside_sqrt",
    "initial_accumulator_value",
  ],
  defaults=(0.0, 0.0, 0.0, False, 0.0),
)


def _unsupported(optimizer, why):
  return tf.errors.InvalidArgumentError(
    None, None, f"tf_ext.DynamicEmbeddingOptimizer: {type(optimizer).__name__} {why}"
  )


def _keras_current_lr(optimizer):
  schedule = getattr(optimizer, "_learning_rate", None)
  if isinstance(schedule, tf.keras.optimizers.schedules.LearningRateSchedule):
    return schedule(optimizer.iterations)
  return optimizer.learning_rate


def _reject(optimizer, **unsupported):
  for what, value in unsupported.items():
    if value:
      raise _unsupported(optimizer, f"with {what} is not supported for table rows yet")


def _hyperparameters(optimizer):
  """What the table update needs from the wrapped optimizer; raises for what it cannot do."""
  v1, keras, legacy = tf.compat.v1.train, tf.keras.optimizers, tf.keras.optimizers.legacy
  if isinstance(optimizer, v1.Optimizer):
    value = optimizer._call_if_callable
    if isinstance(optimizer, v1.GradientDescentOptimizer):
      return _Hyper("sgd", lambda: value(optimizer._learning_rate))
    if isinstance(optimizer, v1.AdagradOptimizer):
      return _Hyper(
        "adagrad",
        lambda: value(optimizer._learning_rate),
        initial_accumulator_value=optimizer._initial_accumulator_value,
      )
    if isinstance(optimizer, v1.AdamOptimizer):
      return _Hyper(
        "adam",
        lambda: value(optimizer._lr),
        beta1=value(optimizer._beta1),
        beta2=value(optimizer._beta2),
        epsilon=value(optimizer._epsilon),
      )
  elif isinstance(optimizer, keras.Optimizer):
    _reject(
      optimizer,
      clipnorm=optimizer.clipnorm,
      clipvalue=optimizer.clipvalue,
      global_clipnorm=optimizer.global_clipnorm,
      weight_decay=optimizer.weight_decay,
    )

    def lr():
      return _keras_current_lr(optimizer)

    if isinstance(optimizer, keras.SGD):
      _reject(optimizer, momentum=optimizer.momentum or optimizer.nesterov)
      return _Hyper("sgd", lr)
    if isinstance(optimizer, keras.Adagrad):
      return _Hyper(
        "adagrad",
        lr,
        epsilon=optimizer.epsilon,
        epsilon_inside_sqrt=True,
        initial_accumulator_value=optimizer.initial_accumulator_value,
      )
    if isinstance(optimizer, keras.Adam):
      _reject(optimizer, amsgrad=optimizer.amsgrad)
      return _Hyper(
        "adam", lr, beta1=optimizer.beta_1, beta2=optimizer.beta_2, epsilon=optimizer.epsilon
      )
  elif isinstance(optimizer, legacy.Optimizer):
    _reject(
      optimizer,
      clipnorm=optimizer.clipnorm,
      clipvalue=optimizer.clipvalue,
      global_clipnorm=optimizer.global_clipnorm,
    )

    def lr():
      return optimizer._decayed_lr(tf.float32)

    if isinstance(optimizer, legacy.SGD):
      _reject(optimizer, momentum=optimizer._momentum or optimizer.nesterov)
      return _Hyper("sgd", lr)
    if isinstance(optimizer, legacy.Adagrad):
      return _Hyper(
        "adagrad",
        lr,
        epsilon=optimizer.epsilon,
        initial_accumulator_value=optimizer._initial_accumulator_value,
      )
    if isinstance(optimizer, legacy.Adam):
      _reject(optimizer, amsgrad=optimizer.amsgrad)
      return _Hyper(
        "adam",
        lr,
        beta1=optimizer._get_hyper("beta_1"),
        beta2=optimizer._get_hyper("beta_2"),
        epsilon=optimizer.epsilon,
      )
  raise _unsupported(
    optimizer,
    "is not supported; use GradientDescent/SGD, Adagrad or Adam "
    "(tf.compat.v1.train or tf.keras.optimizers)",
  )


def table_of(variable):
  """The DynamicEmbeddingVariable whose gradient anchor `variable` is, or None."""
  ref = getattr(variable, variable_lib.TABLE_OF_ANCHOR, None)
  return ref() if ref is not None else None


def apply_table_gradient(table, gradient, hyper, step):
  """One optimizer step on `table`'s rows named by the IndexedSlices `gradient`."""
  if not isinstance(gradient, tf.IndexedSlices):
    raise variable_lib.invalid_argument(
      table.name,
      f"expected an IndexedSlices gradient keyed by ids, got {type(gradient).__name__}; "
      "was the lookup's gradient densified (e.g. by tf.convert_to_tensor or clipping)?",
    )
  with tf.name_scope(f"{table.name}_apply_gradient"), table.colocated():
    unique_keys, positions = tf.unique(gradient.indices)
    summed = tf.math.unsorted_segment_sum(gradient.values, positions, tf.size(unique_keys))

    def as_float(x):
      return tf.cast(x, tf.float32)

    return _ops_loader.load().tf_ext_table_apply_gradient(
      table.resource_handle,
      unique_keys,
      summed,
      as_float(hyper.learning_rate()),
      as_float(hyper.beta1),
      as_float(hyper.beta2),
      as_float(hyper.epsilon),
      tf.cast(step, tf.int64),
      dim=table.dim,
      optimizer=hyper.kind,
      epsilon_inside_sqrt=hyper.epsilon_inside_sqrt,
      initial_accumulator_value=float(hyper.initial_accumulator_value),
    )


def _split(grads_and_vars):
  tables, dense = [], []
  for grad, var in grads_and_vars:
    table = table_of(var)
    if table is None:
      dense.append((grad, var))
    elif grad is not None:
      tables.append((table, grad))
  return tables, dense


class TablesStage(optimizer_pipeline.Stage):
  """The pipeline's "tables" step: table gradients update rows and their slots in place; the
  other (dense) pairs go on to the wrapped optimizer."""

  kind = "tables"
  saved = True

  def owns(self, variable):
    return table_of(variable) is not None

  def apply(self, optimizer, grads_and_vars, step):
    tables, dense = _split(grads_and_vars)
    if not tables:
      return [], dense
    hyper = _hyperparameters(optimizer)
    return [apply_table_gradient(t, g, hyper, step) for t, g in tables], dense


optimizer_pipeline.register_saved_stage(TablesStage.kind, TablesStage)


def DynamicEmbeddingOptimizer(optimizer):  # noqa: N802 (a wrapper, named like a class)
  """Wraps `optimizer` so that it also trains dynamic embedding tables.

  Supported: tf.compat.v1.train.{GradientDescent,Adagrad,Adam}Optimizer and
  tf.keras.optimizers.{SGD,Adagrad,Adam} (also the .legacy ones), or any wrapper of one that
  tf_ext.optimizer_pipeline recognises (tf_ext.lightcc's and Horovod's DistributedOptimizer, Keras'
  LossScaleOptimizer), in any order. The optimizer object itself is returned, with its class
  extended, so Keras `compile`, Estimator and MonitoredTrainingSession accept it, its config stays
  the same, and a saved Keras model reloads with the wrapper.
  """
  # Fail now, not at the first step, for unsupported optimizers.
  _hyperparameters(optimizer_pipeline.wrapped_optimizer(optimizer))
  return optimizer_pipeline.add_stage(optimizer, TablesStage())


class _TrainsTables(type):
  def __instancecheck__(cls, obj):
    return optimizer_pipeline.find_stage(obj, TablesStage.kind) is not None


class _DynamicEmbeddingMixin(metaclass=_TrainsTables):
  """`isinstance(optimizer, _DynamicEmbeddingMixin)`: whether `optimizer` (or the optimizer it
  wraps) trains tables. tf_ext 0.1's wrapper class had this name; the check keeps working."""
