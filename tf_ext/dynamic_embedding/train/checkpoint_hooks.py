"""A session hook that writes full and delta checkpoints of tables while training runs."""

import logging

import tensorflow as tf

from tf_ext.dynamic_embedding import delta_checkpoint, live_tables
from tf_ext.every_n_steps import GlobalStepSchedule

_log = logging.getLogger("tf_ext.delta_checkpoint")


class DeltaCheckpointHook(delta_checkpoint.SavesPeriodically, GlobalStepSchedule):
  """Writes a chain of full and delta table checkpoints (tf_ext.DeltaCheckpointManager) into
  `directory`, every `every_n_steps` global steps and/or `every_n_secs` seconds, and once more
  at the end; a new chain starts with a full snapshot every `full_every_n_deltas` deltas.

  With `dense=True` (the default) each link also saves every global variable (the dense
  weights, their optimizer slots, the global step) with a tf.compat.v1.train.Saver, so a link
  restores the whole model at its step. With `restore=True` (the default), the session restores
  the latest link when it starts, unless the session's global step is already past it (e.g.
  Estimator restored a newer checkpoint of its own). For Session, MonitoredTrainingSession and
  Estimator; `manager` is the hook's DeltaCheckpointManager once the graph is built.
  """

  def _global_step(self):
    return tf.compat.v1.train.get_or_create_global_step()

  def begin(self):
    super().begin()
    dense = None
    if self._dense:
      dense = tf.compat.v1.train.Saver(tf.compat.v1.global_variables(), sharded=True)
    self._saves.start(live_tables.tables(), dense).build()

  def _start(self, session, current):
    # The schedule counts from the session's first step (GlobalStepSchedule's, which the table
    # hooks share), or from the link restored.
    self._saves.mark(current)
    latest = self.manager.latest_step()
    if not self._restore or latest is None:
      return
    if latest < current:
      _log.info(
        "tf_ext: delta checkpoint at step %d is older than step %d: not restored", latest, current
      )
      return
    restored = self.manager.restore(session)
    _log.info("tf_ext: restored tables from the delta checkpoint of step %d", restored)
    self._saves.mark(restored)

  def _due(self, step):
    return self._saves.due(step)

  def _run_due(self, session, step):
    self._saves.save(step, session)

  def end(self, session):
    step = self._read_step(session)
    if step != self._saves.last_step:
      self._saves.save(step, session)
