"""TFRA's `de.data_flow`: dynamic_partition and dynamic_stitch, here TensorFlow's own."""

import tensorflow as tf

__all__ = ["dynamic_partition", "dynamic_stitch"]


def dynamic_partition(data, partitions, num_partitions, name=None):
  """tf.dynamic_partition."""
  return tf.dynamic_partition(data, partitions, num_partitions, name=name)


def dynamic_stitch(indices, data, use_fast=True, name=None):
  """tf.dynamic_stitch (`use_fast` chose TFRA's GPU kernel; TensorFlow's serves both)."""
  del use_fast
  return tf.dynamic_stitch(indices, data, name=name)
