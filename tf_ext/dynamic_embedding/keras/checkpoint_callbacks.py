"""A Keras callback that writes full and delta checkpoints of tables during `fit`."""

import tensorflow as tf

from tf_ext.dynamic_embedding import delta_checkpoint
from tf_ext.dynamic_embedding.keras.lifecycle_callbacks import model_tables


class DeltaCheckpoint(delta_checkpoint.SavesPeriodically, tf.keras.callbacks.Callback):
  """Writes a chain of full and delta table checkpoints (tf_ext.DeltaCheckpointManager) into
  `directory` during `fit`, every `every_n_steps` batches and/or `every_n_secs` seconds, and at
  the end of training; a new chain starts with a full snapshot every `full_every_n_deltas`
  deltas. Tables: the given ones, or the model's layers' tables (without any, every eager table).

  With `dense=True` (the default) each link also saves the model's variables and its optimizer
  (a tf.train.Checkpoint), so a link restores the whole model at its step. With `restore=True`
  (the default), `fit` starts from the latest link when the directory has one, and continues
  its chain. Steps are the optimizer's iterations. `manager` is the callback's
  DeltaCheckpointManager once training began.
  """

  def _step(self):
    return int(self.model.optimizer.iterations.numpy())

  def on_train_begin(self, logs=None):
    del logs
    if self.manager is None:
      dense = None
      if self._dense:
        dense = tf.train.Checkpoint(
          variables=list(self.model.variables), optimizer=self.model.optimizer
        )
      # The model's layers' tables; without any, every eager table.
      tables = model_tables(self.model, eager=False) or model_tables(self.model)
      if self._saves.start(tables, dense).latest_step() is not None and self._restore:
        self.manager.restore()
    self._saves.mark(self._step())

  def on_train_batch_end(self, batch, logs=None):
    del batch, logs
    step = self._step()
    if self._saves.due(step):
      self._saves.save(step)

  def on_train_end(self, logs=None):
    del logs
    step = self._step()
    if step != self._saves.last_step:
      self._saves.save(step)
