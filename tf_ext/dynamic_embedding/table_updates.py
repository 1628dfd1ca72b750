"""The optimizer step on a table's rows: what it needs from the wrapped TF1, Keras or legacy Keras
optimizer (its update kind and hyperparameters, `hyperparameters_of`), and the fused op that
applies it (`apply_table_gradient`). optimizer.py says what each optimizer's update computes."""

import collections

import tensorflow as tf
from tensorflow.python.keras.optimizer_v2 import adadelta as tf_keras_adadelta
from tensorflow.python.keras.optimizer_v2 import adagrad as tf_keras_adagrad
from tensorflow.python.keras.optimizer_v2 import adam as tf_keras_adam
from tensorflow.python.keras.optimizer_v2 import adamax as tf_keras_adamax
from tensorflow.python.keras.optimizer_v2 import ftrl as tf_keras_ftrl
from tensorflow.python.keras.optimizer_v2 import gradient_descent as tf_keras_sgd
from tensorflow.python.keras.optimizer_v2 import nadam as tf_keras_nadam
from tensorflow.python.keras.optimizer_v2 import rmsprop as tf_keras_rmsprop

from tf_ext import _ops_loader, optimizer_pipeline
from tf_ext.dynamic_embedding import variable as variable_lib

# learning_rate is a callable so that validating an optimizer creates no tensors or variables
# (legacy Keras' beta1 and beta2 too: its first _get_hyper creates its hyperparameter variables,
# eager ones when wrapped eagerly, which a TF1 graph built later cannot read); hyperparameters
# too: learning_rate's value -> the op's `hyperparameters` list (by kind: momentum
# [momentum]; ftrl [l1, l2 + beta / (2 * learning_rate), l2_shrinkage, learning_rate_power]; the
# RMSprop kinds [rho] or [rho, momentum]; adadelta [rho]; proximal ones [l1, l2]; adagrad_da [l1,
# l2, global step]; nadam [schedule decay]: ops/dynamic_embedding_optimizer_ops.cc).
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
    "use_nesterov",
    "hyperparameters",
    # How Adam's, AMSGrad's, Adamax's and Nadam's bias corrections compute beta^t: as the
    # optimizer's API does in float32 ("tf1": running products, "keras_legacy" and "keras": pow),
    # so that rows match its dense results to float rounding; the op's default is "exact".
    "bias_correction",
    # The t of those bias corrections: "row", each row's update number; "optimizer", the
    # optimizer's step + 1 for every row (DynamicEmbeddingOptimizer's bias_correction_step).
    "bias_correction_step",
  ],
  defaults=(0.0, 0.0, 0.0, False, 0.0, False, lambda lr: [], "exact", "row"),
)

# The kinds whose updates bias-correct (and Nadam's momentum schedule) by a step t.
STEP_CORRECTED_KINDS = ("adam", "amsgrad", "adamax", "nadam")
BIAS_CORRECTION_STEPS = ("auto", "optimizer", "row")


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


def _as_float(x):
  return tf.cast(x, tf.float32)


def _called(x):
  return x() if callable(x) else x


def _ftrl(lr, l1, l2, l2_shrinkage, lr_power, beta, initial_accumulator_value, adjust_l2):
  """FTRL's _Hyper. The float hyperparameters are callables; adjust_l2(l2, beta, lr) is the L2
  strength the optimizer passes to TensorFlow's sparse update (each computes l2 + beta / (2 * lr)
  its own way, also when beta is 0)."""

  def hyperparameters(lr_value):
    l2_value = adjust_l2(_as_float(l2()), _as_float(beta()), lr_value)
    return [_as_float(l1()), l2_value, _as_float(l2_shrinkage()), _as_float(lr_power())]

  return _Hyper(
    "ftrl",
    lr,
    initial_accumulator_value=initial_accumulator_value,
    hyperparameters=hyperparameters,
  )


def _rmsprop(lr, rho, momentum, epsilon, centered, has_momentum, epsilon_inside_sqrt, ms_init=0.0):
  """RMSprop's _Hyper: TensorFlow's (Sparse)ApplyRMSProp kernels with momentum; without, Keras'
  own update (no momentum slot). rho and momentum are callables."""
  kind = "centered_rmsprop" if centered else "rmsprop"
  if has_momentum:
    return _Hyper(
      kind + "_momentum",
      lr,
      epsilon=epsilon,
      initial_accumulator_value=ms_init,
      hyperparameters=lambda lr: [_as_float(rho()), _as_float(momentum())],
    )
  return _Hyper(
    kind,
    lr,
    epsilon=epsilon,
    epsilon_inside_sqrt=epsilon_inside_sqrt,
    initial_accumulator_value=ms_init,
    hyperparameters=lambda lr: [_as_float(rho())],
  )


def _once(make):
  """make(), called at most once: the updates of all tables in a step then share one tensor,
  which the graph pass that fuses them compares (kernels/graph/embedding_fusion_pass.cc)."""
  made = []

  def get():
    if not made:
      made.append(make())
    return made[0]

  return get


def hyperparameters_of(optimizer):
  """What the table update needs from the wrapped optimizer; raises for what it cannot do."""
  v1, keras, legacy = tf.compat.v1.train, tf.keras.optimizers, tf.keras.optimizers.legacy
  if isinstance(optimizer, v1.Optimizer):
    value = _called
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
        bias_correction="tf1",
      )
    if isinstance(optimizer, v1.MomentumOptimizer):
      return _Hyper(
        "momentum",
        lambda: value(optimizer._learning_rate),
        use_nesterov=optimizer._use_nesterov,
        hyperparameters=lambda lr: [_as_float(value(optimizer._momentum))],
      )
    if isinstance(optimizer, v1.FtrlOptimizer):
      return _ftrl(
        lambda: value(optimizer._learning_rate),
        l1=lambda: optimizer._l1_regularization_strength,
        l2=lambda: optimizer._l2_regularization_strength,
        l2_shrinkage=lambda: optimizer._l2_shrinkage_regularization_strength,
        lr_power=lambda: optimizer._learning_rate_power,
        beta=lambda: optimizer._beta,
        initial_accumulator_value=optimizer._initial_accumulator_value,
        adjust_l2=lambda l2, beta, lr: l2 + beta / (2.0 * tf.maximum(lr, 1e-36)),
      )
    if isinstance(optimizer, v1.RMSPropOptimizer):
      # Its rms slot starts at 1. A momentum of 0 leaves its momentum slot 0: no slot here.
      momentum = optimizer._momentum
      return _rmsprop(
        lambda: value(optimizer._learning_rate),
        rho=lambda: value(optimizer._decay),
        momentum=lambda: value(momentum),
        epsilon=value(optimizer._epsilon),
        centered=optimizer._centered,
        has_momentum=not (isinstance(momentum, (int, float)) and momentum == 0),
        epsilon_inside_sqrt=True,
        ms_init=1.0,
      )
    if isinstance(optimizer, v1.AdadeltaOptimizer):
      return _Hyper(
        "adadelta",
        lambda: value(optimizer._lr),
        epsilon=value(optimizer._epsilon),
        hyperparameters=lambda lr: [_as_float(value(optimizer._rho))],
      )
    if isinstance(optimizer, (v1.ProximalGradientDescentOptimizer, v1.ProximalAdagradOptimizer)):
      adagrad = isinstance(optimizer, v1.ProximalAdagradOptimizer)
      return _Hyper(
        "proximal_adagrad" if adagrad else "proximal_sgd",
        lambda: value(optimizer._learning_rate),
        initial_accumulator_value=optimizer._initial_accumulator_value if adagrad else 0.0,
        hyperparameters=lambda lr: [
          _as_float(optimizer._l1_regularization_strength),
          _as_float(optimizer._l2_regularization_strength),
        ],
      )
    if isinstance(optimizer, v1.AdagradDAOptimizer):
      # TensorFlow's step: its global_step + 1, read before this step advances it (the pipeline
      # applies tables first).
      global_step = _once(lambda: _as_float(tf.identity(optimizer._global_step) + 1))
      return _Hyper(
        "adagrad_da",
        lambda: value(optimizer._learning_rate),
        initial_accumulator_value=optimizer._initial_gradient_squared_accumulator_value,
        hyperparameters=lambda lr: [
          _as_float(optimizer._l1_regularization_strength),
          _as_float(optimizer._l2_regularization_strength),
          global_step(),
        ],
      )
  elif isinstance(optimizer, keras.Optimizer):
    _reject(optimizer, weight_decay=optimizer.weight_decay)

    def lr():
      return _keras_current_lr(optimizer)

    if isinstance(optimizer, keras.SGD):
      if isinstance(optimizer.momentum, (int, float)) and optimizer.momentum == 0:
        return _Hyper("sgd", lr)
      return _Hyper(
        "keras_momentum",
        lr,
        use_nesterov=bool(optimizer.nesterov),
        hyperparameters=lambda lr: [_as_float(optimizer.momentum)],
      )
    if isinstance(optimizer, keras.Adagrad):
      return _Hyper(
        "adagrad",
        lr,
        epsilon=optimizer.epsilon,
        epsilon_inside_sqrt=True,
        initial_accumulator_value=optimizer.initial_accumulator_value,
      )
    if isinstance(optimizer, keras.Adam):
      return _Hyper(
        "amsgrad" if optimizer.amsgrad else "adam",
        lr,
        beta1=optimizer.beta_1,
        beta2=optimizer.beta_2,
        epsilon=optimizer.epsilon,
        bias_correction="keras",
      )
    if isinstance(optimizer, keras.Ftrl):
      return _ftrl(
        lr,
        l1=lambda: optimizer.l1_regularization_strength,
        l2=lambda: optimizer.l2_regularization_strength,
        l2_shrinkage=lambda: optimizer.l2_shrinkage_regularization_strength,
        lr_power=lambda: optimizer.learning_rate_power,
        beta=lambda: optimizer.beta,
        initial_accumulator_value=optimizer.initial_accumulator_value,
        adjust_l2=lambda l2, beta, lr: l2 + beta / (2.0 * lr),
      )
    if isinstance(optimizer, keras.RMSprop):
      return _rmsprop(
        lr,
        rho=lambda: optimizer.rho,
        momentum=lambda: optimizer.momentum,
        epsilon=optimizer.epsilon,
        centered=optimizer.centered,
        has_momentum=optimizer.momentum > 0,  # as its build() decides
        epsilon_inside_sqrt=True,
      )
    if isinstance(optimizer, keras.Adadelta):
      return _Hyper(
        "adadelta",
        lr,
        epsilon=optimizer.epsilon,
        hyperparameters=lambda lr: [_as_float(optimizer.rho)],
      )
    if isinstance(optimizer, keras.Adamax):
      return _Hyper(
        "adamax",
        lr,
        beta1=optimizer.beta_1,
        beta2=optimizer.beta_2,
        epsilon=optimizer.epsilon,
        bias_correction="keras",
      )
    if isinstance(optimizer, keras.Nadam):
      return _Hyper(
        "nadam",
        lr,
        beta1=optimizer.beta_1,
        beta2=optimizer.beta_2,
        epsilon=optimizer.epsilon,
        hyperparameters=lambda lr: [_as_float(1.0)],  # its momentum schedule: 0.96^t
        bias_correction="keras",
      )
  elif isinstance(optimizer, optimizer_pipeline.KERAS_LEGACY_OPTIMIZERS):

    def lr():
      return optimizer._decayed_lr(tf.float32)

    def hyper(name):
      return lambda: optimizer._get_hyper(name, tf.float32)

    if isinstance(optimizer, (legacy.SGD, tf_keras_sgd.SGD)):
      if not optimizer._momentum:
        return _Hyper("sgd", lr)
      return _Hyper(
        "keras_momentum",
        lr,
        use_nesterov=bool(optimizer.nesterov),
        hyperparameters=lambda lr: [hyper("momentum")()],
      )
    if isinstance(optimizer, (legacy.Adagrad, tf_keras_adagrad.Adagrad)):
      return _Hyper(
        "adagrad",
        lr,
        epsilon=optimizer.epsilon,
        initial_accumulator_value=optimizer._initial_accumulator_value,
      )
    if isinstance(optimizer, (legacy.Adam, tf_keras_adam.Adam)):
      return _Hyper(
        "amsgrad" if optimizer.amsgrad else "adam",
        lr,
        beta1=hyper("beta_1"),
        beta2=hyper("beta_2"),
        epsilon=optimizer.epsilon,
        bias_correction="keras_legacy",
      )
    if isinstance(optimizer, (legacy.Ftrl, tf_keras_ftrl.Ftrl)):
      return _ftrl(
        lr,
        l1=hyper("l1_regularization_strength"),
        l2=hyper("l2_regularization_strength"),
        l2_shrinkage=lambda: optimizer._l2_shrinkage_regularization_strength,
        lr_power=hyper("learning_rate_power"),
        beta=hyper("beta"),
        initial_accumulator_value=optimizer._initial_accumulator_value,
        adjust_l2=lambda l2, beta, lr: l2 + beta / (2.0 * lr),
      )
    if isinstance(optimizer, (legacy.RMSprop, tf_keras_rmsprop.RMSprop)):
      return _rmsprop(
        lr,
        rho=hyper("rho"),
        momentum=hyper("momentum"),
        epsilon=optimizer.epsilon,
        centered=optimizer.centered,
        has_momentum=optimizer._momentum,
        epsilon_inside_sqrt=False,
      )
    if isinstance(optimizer, (legacy.Adadelta, tf_keras_adadelta.Adadelta)):
      return _Hyper(
        "adadelta", lr, epsilon=optimizer.epsilon, hyperparameters=lambda lr: [hyper("rho")()]
      )
    if isinstance(optimizer, (legacy.Adamax, tf_keras_adamax.Adamax)):
      return _Hyper(
        "adamax",
        lr,
        beta1=hyper("beta_1"),
        beta2=hyper("beta_2"),
        epsilon=optimizer.epsilon,
        bias_correction="keras_legacy",
      )
    if isinstance(optimizer, (legacy.Nadam, tf_keras_nadam.Nadam)):
      # Nadam's learning rate is not decayed: its `decay` is the momentum schedule's
      # (schedule_decay), 0.96^(decay * t).
      return _Hyper(
        "nadam",
        hyper("learning_rate"),
        beta1=hyper("beta_1"),
        beta2=hyper("beta_2"),
        epsilon=optimizer.epsilon,
        hyperparameters=lambda lr: [_as_float(optimizer._initial_decay)],
        bias_correction="keras_legacy",
      )
  raise _unsupported(
    optimizer,
    "is not supported; use GradientDescent/SGD, Momentum, Adagrad, Adam, Ftrl, RMSprop, "
    "Adadelta, Adamax or Nadam (tf.compat.v1.train, tf.keras.optimizers or their legacy "
    "versions), or tf.compat.v1.train's ProximalGradientDescent, ProximalAdagrad or AdagradDA",
  )


def _distinct(keys):
  """Whether a graph tensor of keys is, through reshapes, the output of tf.unique: a lookup of a
  batch's distinct ids gets its gradient keyed by them, with nothing to sum (eagerly: False)."""
  source = variable_lib.source_tensor(keys)
  return source is not None and (source.op.type, source.value_index) == ("Unique", 0)


def apply_table_gradient(table, gradient, hyper, step):
  """One optimizer step on `table`'s rows named by the IndexedSlices `gradient`."""
  if not isinstance(gradient, tf.IndexedSlices):
    raise variable_lib.invalid_argument(
      table.name,
      f"expected an IndexedSlices gradient keyed by ids, got {type(gradient).__name__}; "
      "was the lookup's gradient densified (e.g. by tf.convert_to_tensor or clipping)?",
    )
  with tf.name_scope(f"{table.name}_apply_gradient"), table.colocated():
    if _distinct(gradient.indices):
      unique_keys, summed = gradient.indices, gradient.values
    else:
      unique_keys, positions = tf.unique(gradient.indices)
      summed = tf.math.unsorted_segment_sum(gradient.values, positions, tf.size(unique_keys))
    learning_rate = _as_float(hyper.learning_rate())
    return _ops_loader.load().tf_ext_table_apply_gradient(
      table.resource_handle,
      unique_keys,
      summed,
      learning_rate,
      _as_float(_called(hyper.beta1)),
      _as_float(_called(hyper.beta2)),
      _as_float(hyper.epsilon),
      tf.cast(step, tf.int64),
      hyper.hyperparameters(learning_rate),
      dim=table.dim,
      optimizer=hyper.kind,
      epsilon_inside_sqrt=hyper.epsilon_inside_sqrt,
      bias_correction=hyper.bias_correction,
      bias_correction_step=hyper.bias_correction_step,
      initial_accumulator_value=float(hyper.initial_accumulator_value),
      use_nesterov=hyper.use_nesterov,
    )
