"""TFRA's `de.train`: DECheckpoint (tf.train.Checkpoint, which saves tf_ext tables as they are)."""

from tf_ext.dynamic_embedding.tfra.train.checkpoint import Checkpoint, DECheckpoint

__all__ = ["Checkpoint", "DECheckpoint"]
