"""TFRA's Keras callbacks. `ModelCheckpoint` (TFRA's DEHvdModelCheckpoint) saves the tables with the
model: with tf_ext tables every rank writes its own part, so Keras' ModelCheckpoint itself is right
on one process and on Horovod ranks alike."""

import tensorflow as tf


class DEHvdModelCheckpoint(tf.keras.callbacks.ModelCheckpoint):
  """Keras' ModelCheckpoint; the tables' rows are saved with the model's variables."""


ModelCheckpoint = DEHvdModelCheckpoint
