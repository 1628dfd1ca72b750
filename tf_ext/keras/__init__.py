"""Keras integration of tf_ext."""

from tf_ext.keras import callbacks, layers

__all__ = [
  "callbacks",
  "layers",
]
