"""Dynamic embedding in Keras: the DynamicEmbedding layer and the callbacks that evict rows,
write table statistics and write delta checkpoints during `fit` (public path: tf_ext.keras)."""

from tf_ext.dynamic_embedding.keras import callbacks, layers

__all__ = [
  "callbacks",
  "layers",
]
