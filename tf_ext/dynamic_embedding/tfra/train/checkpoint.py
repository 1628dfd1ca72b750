"""TFRA's `de.train.DECheckpoint`. TFRA needs a Checkpoint of its own to save its tables' key and
value files beside the checkpoint; tf_ext tables are saved by tf.train.Checkpoint itself (their rows
stream into a file beside the checkpoint's index), so DECheckpoint is tf.train.Checkpoint."""

import tensorflow as tf


class DECheckpoint(tf.train.Checkpoint):
  """tf.train.Checkpoint; every tf_ext.tfra Variable it reaches is saved with its rows and slots."""


Checkpoint = DECheckpoint
