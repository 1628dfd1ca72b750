"""Keras callbacks of tf_ext: table eviction and statistics during `fit`."""

from tf_ext.keras.lifecycle_callbacks import TableEviction, TableStatistics

__all__ = ["TableEviction", "TableStatistics"]
