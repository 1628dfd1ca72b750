"""TensorBoard scalars of loss-aware mixed precision: a SessionRunHook (TF1 sessions, Estimator)
and a Keras callback. Both write, under the tag prefix "amp/": half (1 or 0), loss_scale,
switches, half_fraction, skipped_steps and last_probe_error, every `every_n_steps` steps."""

import tensorflow as tf

from tf_ext.dynamic_embedding.lifecycle import check_every_n_steps
from tf_ext.mixed_precision.optimizer import STATE_COLLECTION, report
from tf_ext.mixed_precision.policy import PrecisionPolicy

SCALARS = ("half", "loss_scale", "switches", "half_fraction", "skipped_steps", "last_probe_error")


def _scalars(report_):
  return {name: tf.cast(report_[name], tf.float32) for name in SCALARS}


class SummaryHook(tf.estimator.SessionRunHook):
  """Writes the AMP scalars of the graph's LossAwareOptimizer to `output_dir` (for an Estimator:
  its model_dir) every `every_n_steps` global steps."""

  def __init__(self, output_dir, every_n_steps=100):
    check_every_n_steps("SummaryHook", every_n_steps)
    self._output_dir = output_dir
    self._every = every_n_steps

  def begin(self):
    states = tf.compat.v1.get_collection(STATE_COLLECTION)
    if not states:
      raise ValueError(
        "SummaryHook: this graph has no tf_ext.mixed_precision.LossAwareOptimizer step (build the "
        "training op with one before the session starts)"
      )
    scalars = _scalars(PrecisionPolicy.report_of_state(states[-1]))
    self._summary = tf.compat.v1.summary.merge(
      [tf.compat.v1.summary.scalar(f"amp/{k}", v, collections=[]) for k, v in scalars.items()]
    )
    self._global_step = tf.compat.v1.train.get_or_create_global_step()
    self._writer = tf.compat.v1.summary.FileWriterCache.get(self._output_dir)
    self._last_written = None

  def before_run(self, run_context):
    return tf.estimator.SessionRunArgs(self._global_step)

  def after_run(self, run_context, run_values):
    step = int(run_values.results)
    if self._last_written is not None and step < self._last_written + self._every:
      return
    self._last_written = step
    self._writer.add_summary(run_context.session.run(self._summary), step)

  def end(self, session):
    self._writer.flush()


class TensorBoardCallback(tf.keras.callbacks.Callback):
  """Writes the AMP scalars of the model's optimizer (made by LossAwareOptimizer) to `log_dir`
  every `every_n_steps` training batches, at the optimizer's iteration count."""

  def __init__(self, log_dir, every_n_steps=1, optimizer=None):
    super().__init__()
    check_every_n_steps("TensorBoardCallback", every_n_steps)
    self._log_dir = log_dir
    self._every = every_n_steps
    self._optimizer = optimizer
    self._writer = None
    self._batches = 0

  def on_train_begin(self, logs=None):
    self._writer = tf.summary.create_file_writer(self._log_dir)

  def on_train_batch_end(self, batch, logs=None):
    self._batches += 1
    if self._batches % self._every:
      return
    optimizer = self._optimizer or self.model.optimizer
    values = _scalars(report(optimizer))
    with self._writer.as_default(step=int(optimizer.iterations.numpy())):
      for name, value in values.items():
        tf.summary.scalar(f"amp/{name}", value)

  def on_train_end(self, logs=None):
    if self._writer is not None:
      self._writer.flush()
