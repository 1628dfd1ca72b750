"""Keras integration of tf_ext."""

from tf_ext.dynamic_embedding.keras import callbacks, layers
