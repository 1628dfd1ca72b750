"""Keras callbacks that evict table rows and write table statistics during `fit`."""

import tensorflow as tf

from tf_ext.dynamic_embedding import lifecycle, live_tables
from tf_ext.dynamic_embedding import variable as variable_lib
from tf_ext.every_n_steps import EveryNBatches


def model_tables(model, eager=True):
  """The dynamic embedding tables a Keras model uses: those it tracks (its layers' tables, and
  DenseFeatures' over tf_ext.feature_column columns), and with `eager` every eager table (the
  ones it may look up outside layers)."""
  found = {}
  for obj in tf.train.TrackableView(model).descendants():
    if isinstance(obj, variable_lib.DynamicEmbeddingVariable):
      found[id(obj)] = obj
  for table in live_tables.tables() if eager else ():
    found.setdefault(id(table), table)
  return sorted(found.values(), key=lambda t: t.name)


class _TableCallback(EveryNBatches):
  def __init__(self, owner, every_n_steps, tables):
    super().__init__(owner, every_n_steps)
    self._tables = None if tables is None else list(tables)

  def _chosen_tables(self, wanted):
    if self._tables is not None:
      return self._tables
    return [t for t in model_tables(self.model) if wanted(t)]


class TableEviction(_TableCallback):
  """Every `every_n_steps` training batches, evicts the rows each table's EvictionPolicy condemns.

  Tables: the given ones, or every table of the model created with an eviction policy.
  `last_evicted` holds {table name: rows removed} of the latest run, `total_evicted` the sums.
  """

  def __init__(self, every_n_steps, tables=None):
    super().__init__("TableEviction", every_n_steps, tables)
    self.last_evicted, self.total_evicted = {}, {}

  def _run(self, step):
    tables = self._chosen_tables(lambda t: t.eviction is not None)
    lifecycle.check_evictable("TableEviction", tables)
    # "Now" is the optimizer's step after the batch, as EvictionHook's is the global step after
    # the run (a table's latest step, that of the batch's update, is one behind).
    self.last_evicted = {t.name: int(t.evict(step)) for t in tables}
    for name, n in self.last_evicted.items():
      self.total_evicted[name] = self.total_evicted.get(name, 0) + n


class TableStatistics(_TableCallback):
  """Every `every_n_steps` training batches, writes each table's statistics to TensorBoard.

  Scalars `<table>/<statistic>` (size, bytes, admitted, rejected, evicted, lookups, lookup_hits,
  lookup_hit_rate) go to `log_dir`, at the optimizer's step. `last_statistics` holds the latest
  values as {table name: {statistic: value}}.
  """

  def __init__(self, log_dir, every_n_steps=100, tables=None):
    super().__init__("TableStatistics", every_n_steps, tables)
    self._log_dir = log_dir
    self._writer = None
    self.last_statistics = {}

  def _run(self, step):
    if self._writer is None:
      self._writer = tf.summary.create_file_writer(self._log_dir)
    with self._writer.as_default(step=step):
      for table in self._chosen_tables(lambda t: True):
        stats = {k: v.numpy().item() for k, v in table.statistics().items()}
        self.last_statistics[table.name] = stats
        for name, value in stats.items():
          tf.summary.scalar(f"{table.name}/{name}", value)
    self._writer.flush()

  def on_train_end(self, logs=None):
    del logs
    if self._writer is not None:
      self._writer.close()
      self._writer = None
