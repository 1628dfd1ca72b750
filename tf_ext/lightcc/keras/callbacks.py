"""Horovod's Keras callbacks, plus LightCC's traffic figures as TensorBoard scalars."""

import horovod.tensorflow as _hvd
import horovod.tensorflow.keras.callbacks as _hvd_callbacks
import tensorflow as tf
from horovod.tensorflow.keras.callbacks import (
  BestModelCheckpoint,
  BroadcastGlobalVariablesCallback,
  LearningRateScheduleCallback,
  LearningRateWarmupCallback,
  MetricAverageCallback,
)

from tf_ext.lightcc import _reexport, reduction, state

__all__ = [
  "BestModelCheckpoint",
  "BroadcastGlobalVariablesCallback",
  "FusionSettledCallback",
  "LearningRateScheduleCallback",
  "LearningRateWarmupCallback",
  "LightCCTrafficCallback",
  "MetricAverageCallback",
]


class LightCCTrafficCallback(tf.keras.callbacks.Callback):
  """Writes per-step bytes sent intra-group, inter-group and the compression ratio.

  Scalars `lightcc/intra_bytes_per_step`, `lightcc/inter_bytes_per_step` and
  `lightcc/compression_ratio`, every `every_n_batches` batches, to `log_dir` (rank 0 only).
  """

  def __init__(self, log_dir, every_n_batches=10):
    super().__init__()
    self._writer = tf.summary.create_file_writer(log_dir) if _hvd.rank() == 0 else None
    self._every = every_n_batches
    self._step = 0

  def on_train_batch_end(self, batch, logs=None):
    self._step += 1
    if self._step % self._every:
      return
    figures = state.traffic()
    state.reset_traffic()
    if self._writer is None:
      return
    with self._writer.as_default(step=self._step):
      tf.summary.scalar("lightcc/intra_bytes_per_step", figures["intra_bytes"] / self._every)
      tf.summary.scalar("lightcc/inter_bytes_per_step", figures["inter_bytes"] / self._every)
      tf.summary.scalar("lightcc/compression_ratio", figures["compression_ratio"])
    self._writer.flush()


class FusionSettledCallback(tf.keras.callbacks.Callback):
  """Once adaptive fusion has made its final choice (LIGHT_FUSION_REPROBE_STEPS=0), freezes it
  and retraces the train function, so that the batches after it run the chosen bucketing alone
  instead of a switch over every candidate. With LIGHT_FUSION_RETRACE=1 it also gives every
  batch the train function of the bucket size in force (each traced once and kept), as
  lightcc.FusionStepFunction does for a step function of one's own. Every rank does so after
  the same batch."""

  def __init__(self):
    super().__init__()
    self.retraced_after_batch = None  # in the epoch where the choice froze
    self._train_functions = reduction.FusionStepFunction(
      lambda: self.model.make_train_function(force=True)
    )

  @property
  def traced(self):
    """Train functions traced for adaptive fusion so far, the first one included."""
    return self._train_functions.traced

  def on_train_batch_end(self, batch, logs=None):
    if not self._train_functions.traced:
      self._train_functions.first_step_ran(self.model.train_function)
    if self.retraced_after_batch is None and reduction.freeze_settled_fusion():
      self.retraced_after_batch = batch
    self.model.train_function = self._train_functions.current()


__getattr__, __dir__ = _reexport.fallback(__name__, globals(), _hvd_callbacks)
