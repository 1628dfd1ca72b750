"""Session hooks that evict table rows and write table statistics while training runs."""

import tensorflow as tf

from tf_ext.dynamic_embedding import lifecycle, live_tables
from tf_ext.dynamic_embedding import variable as variable_lib
from tf_ext.every_n_steps import EveryNStepsHook


def _pick(owner, tables, wanted):
  """The tables a hook works on: the given ones, or every table of the graph that `wanted`."""
  if tables is None:
    return [t for t in live_tables.tables() if wanted(t)]
  tables = list(tables)
  for table in tables:
    if not isinstance(table, variable_lib.DynamicEmbeddingVariable):
      raise ValueError(f"{owner}: tables must be DynamicEmbeddingVariables, got {table!r}")
  return tables


class _TableHook(EveryNStepsHook):
  """Runs `_fetches` (built by `_build` at `begin`) every n steps; `_handle` gets the results."""

  def begin(self):
    super().begin()
    self._fetches = self._build()

  def _has_work(self):
    return bool(self._fetches)

  def _run(self, session, step):
    self._handle(step, session.run(self._fetches))

  def _build(self):
    raise NotImplementedError

  def _handle(self, step, results):
    raise NotImplementedError


class EvictionHook(_TableHook):
  """Every `every_n_steps` steps, evicts the rows each table's EvictionPolicy condemns.

  Tables: the given ones, or every table of the graph created with an eviction policy. The
  eviction runs inside each table, shard by shard, while the next steps' lookups go on, with the
  global step it runs at as "now" (`table.evict(step)`).
  `last_evicted` holds {table name: rows removed} of the latest run, `total_evicted` the sums.
  """

  def __init__(self, every_n_steps, tables=None):
    super().__init__("EvictionHook", every_n_steps)
    self._tables = tables
    self.last_evicted, self.total_evicted = {}, {}

  def _build(self):
    tables = _pick("EvictionHook", self._tables, lambda t: t.eviction is not None)
    lifecycle.check_evictable("EvictionHook", tables)
    # "Now" is the global step the hook runs at, fed by `_run`. The default (-1: each table's
    # latest update) is a step behind, and stands still while the steps do not train the table.
    self._now_step = tf.compat.v1.placeholder_with_default(
      tf.constant(-1, tf.int64), [], name="eviction_now_step"
    )
    return {t.name: t.evict(self._now_step) for t in tables}

  def _run(self, session, step):
    # Without a global step, `step` counts the hook's runs: not a step the table's rows record.
    feed = {self._now_step: step} if self._global_step_tensor is not None else None
    self._handle(step, session.run(self._fetches, feed))

  def _handle(self, step, results):
    del step
    self.last_evicted = {name: int(n) for name, n in results.items()}
    for name, n in self.last_evicted.items():
      self.total_evicted[name] = self.total_evicted.get(name, 0) + n


class TableStatisticsHook(_TableHook):
  """Every `every_n_steps` steps, writes each table's statistics as scalar summaries.

  The scalars are named `<table>/<statistic>` (size, bytes, admitted, rejected, evicted,
  lookups, lookup_hits, lookup_hit_rate) and go to `output_dir` (TensorBoard), through the
  FileWriter cache that Estimator and MonitoredTrainingSession share. `last_statistics` holds the
  latest values as {table name: {statistic: value}}.
  """

  def __init__(self, output_dir, every_n_steps=100, tables=None):
    super().__init__("TableStatisticsHook", every_n_steps)
    self._output_dir = output_dir
    self._tables = tables
    self.last_statistics = {}

  def _build(self):
    return {
      t.name: t.statistics() for t in _pick("TableStatisticsHook", self._tables, lambda t: True)
    }

  def _handle(self, step, results):
    writer = tf.compat.v1.summary.FileWriterCache.get(self._output_dir)
    values = []
    for table, stats in results.items():
      self.last_statistics[table] = {k: v.item() for k, v in stats.items()}
      for name, value in stats.items():
        values.append(tf.compat.v1.Summary.Value(tag=f"{table}/{name}", simple_value=float(value)))
    writer.add_summary(tf.compat.v1.Summary(value=values), step)
    writer.flush()
