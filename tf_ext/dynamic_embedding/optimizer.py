"""DynamicEmbeddingOptimizer: lets a TF1 or Keras optimizer train dynamic embedding tables.

Gradients of table lookups reach the table's gradient anchor variable as IndexedSlices keyed
by the looked-up ids. The wrapper adds the "tables" stage to the optimizer's pipeline
(tf_ext/optimizer_pipeline.py), which splits them off in `apply_gradients`: duplicate ids are
summed and one fused op updates each row and its co-located slots in place (creating rows
that are new). Every other variable goes to the wrapped optimizer unchanged.

Optimizers: SGD, Adagrad, Adam (with AMSGrad in Keras), momentum (TF1 MomentumOptimizer and
Keras SGD(momentum), Nesterov too), FTRL (L1, L2, L2 shrinkage, learning_rate_power, beta),
RMSprop (momentum, centered), Adadelta, Adamax and Nadam, from tf.compat.v1.train (which has no
Adamax or Nadam), tf.keras.optimizers and tf.keras.optimizers.legacy (and TensorFlow's own copy of
the legacy ones, tensorflow.python.keras.optimizer_v2, which TFRA programs use); and TF1's
ProximalGradientDescent, ProximalAdagrad and AdagradDA. Each computes what TensorFlow's sparse
update computes for the rows of a dense variable (training_ops.cc; for the Keras 2.11+ optimizers,
what their update does to the rows of an IndexedSlices gradient).

Updates of table rows are *lazy*: only the rows in the batch change, with their slots. TensorFlow's
sparse updates are lazy too for every TF1 optimizer but Adam, and for legacy Keras' SGD, Adagrad,
momentum, FTRL, Adadelta, Adamax and RMSprop with momentum. The others touch every row of a dense
variable even for an IndexedSlices gradient: Adam and AMSGrad (TF1, legacy and new Keras) decay
the moments of absent rows and move them, Keras 2.11+ SGD(momentum) and RMSprop(momentum) decay
absent rows' momentum and move them by it, Keras 2.11+ FTRL recomputes absent rows from their
(unchanged) linear slot, Keras 2.11+ Adamax and Nadam decay absent rows' moments and move them, and
legacy Nadam, RMSprop without momentum (legacy and new) and Keras 2.11+ Adadelta decay absent rows'
slots without moving them. For rows in every batch both agree; a row absent from a batch keeps its
value and slots here.

Bias corrections (Adam's and AMSGrad's, Adamax's 1 - beta1^t, Nadam's 1 - beta2^t and its momentum
schedule u_t = beta1 * (1 - 0.5 * 0.96^(decay * t)), decay 1 in Keras 2.11+ and `schedule_decay`
in legacy Keras, with the product u_1 * ... * u_t that Keras keeps as one variable) use, by
DynamicEmbeddingOptimizer's `bias_correction_step`, the optimizer's step t (iterations + 1, or a
TF1 optimizer's global step + 1) for every row, as TensorFlow and TFRA do (the default, where the
optimizer counts steps), or each row's own update count (a row that missed batches, or first
appeared later, is then bias-corrected as a new row). The two agree for a row seen in every batch
since the start. AdagradDA always steps by the optimizer's global step + 1, as TensorFlow's.
beta^t and the step size are computed in float32 the way the optimizer's API does (TF1's
AdamOptimizer: its float32 beta power variables' running products; Keras, legacy and 2.11+: float32
pow), so that such rows match TensorFlow to float rounding.

Slots as TensorFlow's: TF1 RMSProp's rms starts at 1, the Keras ones' at 0. RMSprop without
momentum (Keras' momentum=0, TF1's momentum=0 as a number) keeps no momentum slot (TF1's stays 0).
The arithmetic follows TensorFlow's kernels (legacy Keras' sparse update where there is none)
operation by operation; Keras 2.11+ writes some updates in another order and rounds constants such
as 1 - rho in double, and TF1 RMSProp with momentum 0 is computed without the momentum term: those
differ by float rounding.

Keras `clipnorm`, `clipvalue` and `global_clipnorm` clip table gradients as Keras clips dense
ones: the optimizer's own clipping runs once over all gradients of the step, table and dense
together (so `global_clipnorm`'s norm includes both), on the gradients as computed (IndexedSlices
before duplicate ids are summed), and the wrapped optimizer's own clipping is skipped for the
dense gradients it then gets.
"""

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

from tf_ext import _ops_loader, optimizer_pipeline, rank_local_gradients
from tf_ext.dynamic_embedding import alltoall
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
_STEP_CORRECTED_KINDS = ("adam", "amsgrad", "adamax", "nadam")
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


def _hyperparameters(optimizer):
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


def table_of(variable):
  """The DynamicEmbeddingVariable whose gradient anchor `variable` is, or None."""
  ref = getattr(variable, variable_lib.TABLE_OF_ANCHOR, None)
  return ref() if ref is not None else None


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


# ---- Keras gradient clipping -------------------------------------------------------------------

# Set on a Keras optimizer while the dense gradients it is about to get are already clipped.
_CLIPPED_FLAG = "_tf_ext_dense_gradients_clipped"


def _own_clipping_method(optimizer):
  """The name of the method in which the Keras optimizer clips in apply_gradients."""
  if isinstance(optimizer, tf.keras.optimizers.Optimizer):
    return "_clip_gradients"  # (gradients) -> gradients
  return "_transform_gradients"  # legacy: (pairs) -> pairs


def _clips(optimizer):
  """Whether `optimizer` is a Keras optimizer set to clip gradients (as its own checks read)."""
  if isinstance(optimizer, tf.keras.optimizers.Optimizer):
    return any(
      value and value > 0
      for value in (optimizer.clipnorm, optimizer.global_clipnorm, optimizer.clipvalue)
    )
  if isinstance(optimizer, optimizer_pipeline.KERAS_LEGACY_OPTIMIZERS):
    return any(
      value is not None
      for value in (optimizer.clipnorm, optimizer.global_clipnorm, optimizer.clipvalue)
    )
  return False


def _clip_all(optimizer, grads_and_vars):
  """`grads_and_vars` clipped by the Keras optimizer's own clipping, all pairs together."""
  method = getattr(type(optimizer), _own_clipping_method(optimizer))
  present = [i for i, (g, _) in enumerate(grads_and_vars) if g is not None]
  if not present:
    return grads_and_vars
  pairs = [grads_and_vars[i] for i in present]
  if isinstance(optimizer, tf.keras.optimizers.Optimizer):
    pairs = list(zip(method(optimizer, [g for g, _ in pairs]), [v for _, v in pairs]))
  else:
    pairs = method(optimizer, pairs)
  clipped = list(grads_and_vars)
  for i, pair in zip(present, pairs):
    clipped[i] = pair
  return clipped


def _skip_own_clipping_once(optimizer):
  """Makes the next clipping in the optimizer's apply_gradients pass the gradients through: they
  are the dense ones that _clip_all clipped together with the tables'.

  The stage cannot wrap the wrapped optimizer's apply_gradients (the pipeline calls it after the
  stage returns), so the optimizer object gets an instance attribute that shadows its clipping
  method once per flag; without the flag the method runs as before.
  """
  name = _own_clipping_method(optimizer)
  if name not in vars(optimizer):
    own = getattr(type(optimizer), name)

    def clip_unless_clipped(gradients):
      if vars(optimizer).pop(_CLIPPED_FLAG, False):
        return gradients
      return own(optimizer, gradients)

    vars(optimizer)[name] = clip_unless_clipped
  vars(optimizer)[_CLIPPED_FLAG] = True


def _split(grads_and_vars):
  tables, dense = [], []
  for grad, var in grads_and_vars:
    table = table_of(var)
    if table is None:
      dense.append((grad, var))
    elif grad is not None:
      if isinstance(table, alltoall.AllToAllDynamicEmbeddingVariable) and isinstance(
        grad, tf.IndexedSlices
      ):
        grad = table.owned_gradient(grad)
      if hasattr(table, "split_gradient"):  # a group of tables (a tf_ext.tfra Variable's)
        tables.extend(table.split_gradient(grad))
      else:
        tables.append((table, grad))
  return tables, dense


class TablesStage(optimizer_pipeline.Stage):
  """The pipeline's "tables" step: table gradients update rows and their slots in place; the
  other (dense) pairs go on to the wrapped optimizer."""

  kind = "tables"
  saved = True

  def __init__(self, bias_correction_step="auto"):
    if bias_correction_step not in BIAS_CORRECTION_STEPS:
      raise ValueError(
        f"tf_ext.DynamicEmbeddingOptimizer: bias_correction_step must be one of "
        f"{BIAS_CORRECTION_STEPS}, got {bias_correction_step!r}"
      )
    self.bias_correction_step = bias_correction_step

  def saved_arguments(self):
    if self.bias_correction_step == "auto":
      return {}  # what tf_ext 0.2 saved
    return {"bias_correction_step": self.bias_correction_step}

  def owns(self, variable):
    return table_of(variable) is not None

  def added_to(self, target):
    # Horovod's Keras DistributedOptimizer is the target itself (the pipeline goes below it).
    rank_local_gradients.keep_local(target)

  def apply(self, optimizer, grads_and_vars, step):
    if _clips(optimizer):
      grads_and_vars = _clip_all(optimizer, list(grads_and_vars))
    tables, dense = _split(grads_and_vars)
    if _clips(optimizer) and any(g is not None for g, _ in dense):
      _skip_own_clipping_once(optimizer)
    if not tables:
      return [], dense
    hyper = _hyperparameters(optimizer)
    if self.bias_correction_step != "row" and hyper.kind in _STEP_CORRECTED_KINDS:
      counted = optimizer_pipeline.counts_steps(optimizer)
      if not counted and self.bias_correction_step == "optimizer":
        raise ValueError(
          f"tf_ext.DynamicEmbeddingOptimizer(bias_correction_step='optimizer'): "
          f"{type(optimizer).__name__} has no step to correct by: pass global_step to "
          "minimize/apply_gradients, or create one with "
          "tf.compat.v1.train.get_or_create_global_step()"
        )
      if counted:
        hyper = hyper._replace(bias_correction_step="optimizer")
    for table, _ in tables:
      if isinstance(table, alltoall.AllToAllDynamicEmbeddingVariable):
        table.check_optimizer(
          {
            "optimizer": type(optimizer).__name__,
            "update": hyper.kind,
            "use_nesterov": hyper.use_nesterov,
            "initial_accumulator_value": float(hyper.initial_accumulator_value),
            "bias_correction_step": hyper.bias_correction_step,
          }
        )
    return [apply_table_gradient(t, g, hyper, step) for t, g in tables], dense


optimizer_pipeline.register_saved_stage(TablesStage.kind, TablesStage)


def DynamicEmbeddingOptimizer(optimizer, bias_correction_step="auto"):  # noqa: N802 (a wrapper)
  """Wraps `optimizer` so that it also trains dynamic embedding tables.

  bias_correction_step: the t by which Adam, AMSGrad, Adamax and Nadam bias-correct a row (and
  Nadam schedules its momentum). "optimizer": the optimizer's step + 1 for every row, as
  TensorFlow's dense optimizers and TFRA compute it (Keras' `iterations`; a TF1 optimizer's
  global step, which must exist); "row": the row's own update number (a row first seen late is
  corrected as a new row, with smaller steps); "auto" (the default): "optimizer" where the
  optimizer counts steps, else (a TF1 optimizer applied without a global step) "row". See the
  dynamic embedding docs' "Bias correction" for what each costs in model quality.

  Supported: tf.compat.v1.train.{GradientDescent,Momentum,Adagrad,Adam,Ftrl,RMSProp,Adadelta,
  ProximalGradientDescent,ProximalAdagrad,AdagradDA}Optimizer and
  tf.keras.optimizers.{SGD,Adagrad,Adam,Ftrl,RMSprop,Adadelta,Adamax,Nadam} (also the .legacy ones;
  SGD with momentum and Nesterov, Adam with amsgrad, RMSprop with momentum and centered; clipnorm,
  clipvalue, global_clipnorm), or any wrapper of one that
  tf_ext.optimizer_pipeline recognises (tf_ext.lightcc's and Horovod's DistributedOptimizer, Keras'
  LossScaleOptimizer), in any order. The optimizer object itself is returned, with its class
  extended, so Keras `compile`, Estimator and MonitoredTrainingSession accept it, its config stays
  the same, and a saved Keras model reloads with the wrapper.
  """
  # Fail now, not at the first step, for unsupported optimizers.
  _hyperparameters(optimizer_pipeline.wrapped_optimizer(optimizer))
  # All-to-all tables' gradients are exchanged already: a Horovod wrapper leaves them out.
  rank_local_gradients.keep_local(optimizer)
  return optimizer_pipeline.add_stage(optimizer, TablesStage(bias_correction_step))


class _TrainsTables(type):
  def __instancecheck__(cls, obj):
    return optimizer_pipeline.find_stage(obj, TablesStage.kind) is not None


class _DynamicEmbeddingMixin(metaclass=_TrainsTables):
  """`isinstance(optimizer, _DynamicEmbeddingMixin)`: whether `optimizer` (or the optimizer it
  wraps) trains tables. tf_ext 0.1's wrapper class had this name; the check keeps working."""
