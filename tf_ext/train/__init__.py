"""Session hooks for dynamic embedding tables (Session, MonitoredTrainingSession, Estimator).

- `EvictionHook(every_n_steps)`: runs `table.evict()` for every table with an eviction policy.
- `TableStatisticsHook(output_dir, every_n_steps)`: writes each table's statistics as summaries.
"""

from tf_ext.train.lifecycle_hooks import EvictionHook, TableStatisticsHook
