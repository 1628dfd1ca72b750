"""Session hooks for dynamic embedding tables (Session, MonitoredTrainingSession, Estimator).

- `EvictionHook(every_n_steps)`: runs `table.evict()` for every table with an eviction policy.
- `TableStatisticsHook(output_dir, every_n_steps)`: writes each table's statistics as summaries.
- `DeltaCheckpointHook(directory, every_n_steps, every_n_secs, full_every_n_deltas)`: full and
  delta checkpoints of the tables (tf_ext.DeltaCheckpointManager).
"""

from tf_ext.dynamic_embedding.train.checkpoint_hooks import DeltaCheckpointHook
from tf_ext.dynamic_embedding.train.lifecycle_hooks import EvictionHook, TableStatisticsHook

__all__ = [
  "DeltaCheckpointHook",
  "EvictionHook",
  "TableStatisticsHook",
]
