"""DynamicEmbeddingOptimizer: lets a TF1 or Keras optimizer train dynamic embedding tables.

Gradients of table lookups reach the table's gradient anchor variable as IndexedSlices keyed
by the looked-up ids. The wrapper splits them off in `apply_gradients`: duplicate ids are
summed and one fused op updates each row and its co-located slots in place (creating rows
that are new). Every other variable goes to the wrapped optimizer unchanged.

Adam on table rows is "lazy" (only rows in the batch move) and bias-corrects with each row's
own update count, which equals the global step for a row seen in every batch.
"""

import collections

import tensorflow as tf

from tf_ext import _ops_loader
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
    lr = lambda: _keras_current_lr(optimizer)
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
    lr = lambda: optimizer._decayed_lr(tf.float32)
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
    as_float = lambda x: tf.cast(x, tf.float32)
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


class _DynamicEmbeddingMixin:
  """Placed before the wrapped optimizer's class; only apply_gradients changes."""

  def apply_gradients(self, grads_and_vars, *args, **kwargs):
    tables, dense = _split(list(grads_and_vars))
    if not tables:
      return super().apply_gradients(dense, *args, **kwargs)
    is_v1 = isinstance(self, tf.compat.v1.train.Optimizer)
    if is_v1:
      global_step = kwargs.get("global_step", args[0] if args else None)
      step = global_step if global_step is not None else tf.compat.v1.train.get_global_step()
    else:
      global_step = step = self.iterations
    # Read the step before the wrapped optimizer increments it: the rows record this step.
    step_value = tf.identity(step) if step is not None else tf.constant(0, tf.int64)
    hyper = _hyperparameters(self)
    with tf.control_dependencies([step_value]):
      updates = [apply_table_gradient(t, g, hyper, step_value) for t, g in tables]
    if dense:
      with tf.control_dependencies(updates):
        result = super().apply_gradients(dense, *args, **kwargs)
      return tf.group(updates + [result]) if is_v1 else result
    # Only tables: advance the step as the wrapped optimizer would have.
    with tf.control_dependencies(updates):
      if global_step is None:
        return tf.group(updates)
      increment = global_step.assign_add(tf.ones([], global_step.dtype))
    return tf.group(updates + [increment]) if is_v1 else global_step


_wrapped_classes = {}


def _wrapped_class(base):
  """The class that extends `base` with table updates, one per base class.

  Keras optimizer classes are registered as "tf_ext>DynamicEmbedding[Legacy]<Name>", so a model
  saved with a wrapped optimizer loads back (in a process that imports tf_ext) with the wrapper.
  """
  cls = _wrapped_classes.get(base)
  if cls is None:
    cls = type(base.__name__, (_DynamicEmbeddingMixin, base), {"__module__": base.__module__})
    keras_kinds = {
      tf.keras.optimizers.Optimizer: "",
      tf.keras.optimizers.legacy.Optimizer: "Legacy",
    }
    for keras_base, prefix in keras_kinds.items():
      if issubclass(base, keras_base):
        tf.keras.utils.register_keras_serializable(
          "tf_ext", f"DynamicEmbedding{prefix}{base.__name__}"
        )(cls)
        break
    _wrapped_classes[base] = cls
  return cls


for _base in (
  tf.keras.optimizers.SGD,
  tf.keras.optimizers.Adagrad,
  tf.keras.optimizers.Adam,
  tf.keras.optimizers.legacy.SGD,
  tf.keras.optimizers.legacy.Adagrad,
  tf.keras.optimizers.legacy.Adam,
):
  _wrapped_class(_base)


def DynamicEmbeddingOptimizer(optimizer):  # pylint: disable=invalid-name
  """Wraps `optimizer` so that it also trains dynamic embedding tables.

  Supported: tf.compat.v1.train.{GradientDescent,Adagrad,Adam}Optimizer and
  tf.keras.optimizers.{SGD,Adagrad,Adam} (also the .legacy ones). The optimizer object itself is
  returned, with its class extended, so Keras `compile`, Estimator and MonitoredTrainingSession
  accept it, its config stays the same, and a saved Keras model reloads with the wrapper.
  """
  if isinstance(optimizer, _DynamicEmbeddingMixin):
    return optimizer
  _hyperparameters(optimizer)  # fail now, not at the first step, for unsupported optimizers
  optimizer.__class__ = _wrapped_class(type(optimizer))
  return optimizer
