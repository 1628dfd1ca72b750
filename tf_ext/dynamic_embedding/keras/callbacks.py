"""Keras callbacks of tf_ext: table eviction, statistics and delta checkpoints during `fit`."""

from tf_ext.dynamic_embedding.keras.checkpoint_callbacks import DeltaCheckpoint
from tf_ext.dynamic_embedding.keras.lifecycle_callbacks import TableEviction, TableStatistics

__all__ = ["DeltaCheckpoint", "TableEviction", "TableStatistics"]
