"""TFRA's `de.keras.models.save_model`: Keras' own save, which tf_ext tables join as resources
(their rows stream into the SavedModel's checkpoint; tf_ext/dynamic_embedding/checkpoint.py)."""

import tensorflow as tf


def save_model(
  model,
  filepath,
  overwrite=True,
  include_optimizer=True,
  save_format=None,
  signatures=None,
  options=None,
  save_traces=True,
  **kwargs,
):
  """Saves `model` (a SavedModel directory by default, as TFRA's), tables included; a model of
  HvdAllToAllEmbedding layers saves each rank's part of its tables (call it on every rank)."""
  return tf.keras.models.save_model(
    model,
    filepath,
    overwrite=overwrite,
    include_optimizer=include_optimizer,
    save_format=save_format or "tf",
    signatures=signatures,
    options=options,
    save_traces=save_traces,
    **kwargs,
  )


de_save_model = save_model
