"""TensorBoard scalars of loss-aware mixed precision: a SessionRunHook (TF1 sessions, Estimator)
and a Keras callback. Both write, under the tag prefix "amp/": half (1 or 0), loss_scale,
switches, half_fraction, skipped_steps and last_probe_error, every `every_n_steps` steps."""

import tensorflow as tf

from tf_ext.every_n_steps import EveryNBatches, EveryNStepsHook
from tf_ext.mixed_precision.optimizer import STATE_COLLECTION, report
from tf_ext.mixed_precision.policy import PrecisionPolicy

SCALARS = ("half", "loss_scale", "switches", "half_fraction", "skipped_steps", "last_probe_error")


def _scalars(report_):
  return {name: tf.cast(report_[name], tf.float32) for name in SCALARS}


class SummaryHook(EveryNStepsHook):
  """Writes the AMP scalars of the graph's LossAwareOptimizer to `output_dir` (for an Estimator:
  its model_dir) every `every_n_steps` global steps."""

  def __init__(self, output_dir, every_n_steps=100):
    super().__init__("SummaryHook", every_n_steps)
    self._output_dir = output_dir

  def _global_step(self):
    return tf.compat.v1.train.get_or_create_global_step()

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
    super().begin()
    self._writer = tf.compat.v1.summary.FileWriterCache.get(self._output_dir)

  def _run(self, session, step):
    self._writer.add_summary(session.run(self._summary), step)

  def end(self, session):
    self._writer.flush()


class TensorBoardCallback(EveryNBatches):
  """Writes the AMP scalars of the model's optimizer (made by LossAwareOptimizer) to `log_dir`
  every `every_n_steps` training batches, at the optimizer's iteration count."""

  def __init__(self, log_dir, every_n_steps=1, optimizer=None):
    super().__init__("TensorBoardCallback", every_n_steps)
    self._log_dir = log_dir
    self._optimizer = optimizer
    self._writer = None

  def on_train_begin(self, logs=None):
    self._writer = tf.summary.create_file_writer(self._log_dir)

  def _chosen_optimizer(self):
    return self._optimizer or self.model.optimizer

  def _step(self):
    return int(self._chosen_optimizer().iterations.numpy())

  def _run(self, step):
    values = _scalars(report(self._chosen_optimizer()))
    with self._writer.as_default(step=step):
      for name, value in values.items():
        tf.summary.scalar(f"amp/{name}", value)

  def on_train_end(self, logs=None):
    if self._writer is not None:
      self._writer.flush()
