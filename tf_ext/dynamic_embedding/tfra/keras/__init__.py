"""TFRA's `de.keras`: layers, models (save_model) and callbacks."""

from tf_ext.dynamic_embedding.tfra.keras import callbacks, layers, models

__all__ = ["callbacks", "layers", "models"]
