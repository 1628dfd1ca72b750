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

What each optimizer's table update needs from it, and the op that applies the update, are in
table_updates.py.
"""

import tensorflow as tf

from tf_ext import optimizer_pipeline, rank_local_gradients
from tf_ext.dynamic_embedding import alltoall
from tf_ext.dynamic_embedding import variable as variable_lib
from tf_ext.dynamic_embedding.table_updates import (
  BIAS_CORRECTION_STEPS,
  STEP_CORRECTED_KINDS,
  apply_table_gradient,
  hyperparameters_of,
)


def table_of(variable):
  """The DynamicEmbeddingVariable whose gradient anchor `variable` is, or None."""
  ref = getattr(variable, variable_lib.TABLE_OF_ANCHOR, None)
  return ref() if ref is not None else None


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
    hyper = hyperparameters_of(optimizer)
    if self.bias_correction_step != "row" and hyper.kind in STEP_CORRECTED_KINDS:
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
  hyperparameters_of(optimizer_pipeline.wrapped_optimizer(optimizer))
  # All-to-all tables' gradients are exchanged already: a Horovod wrapper leaves them out.
  rank_local_gradients.keep_local(optimizer)
  return optimizer_pipeline.add_stage(optimizer, TablesStage(bias_correction_step))


class _TrainsTables(type):
  def __instancecheck__(cls, obj):
    return optimizer_pipeline.find_stage(obj, TablesStage.kind) is not None


class _DynamicEmbeddingMixin(metaclass=_TrainsTables):
  """`isinstance(optimizer, _DynamicEmbeddingMixin)`: whether `optimizer` (or the optimizer it
  wraps) trains tables. tf_ext 0.1's wrapper class had this name; the check keeps working."""
