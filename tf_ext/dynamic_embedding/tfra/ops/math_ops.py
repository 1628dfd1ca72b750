"""TFRA's `de.math`: the sparse ops it gives GPU kernels, here TensorFlow's own."""

import tensorflow as tf

__all__ = ["sparse_fill_empty_rows", "sparse_reshape", "sparse_segment_sum"]


def sparse_segment_sum(data, indices, segment_ids, name=None, num_segments=None):
  """tf.sparse.segment_sum."""
  return tf.sparse.segment_sum(data, indices, segment_ids, name=name, num_segments=num_segments)


def sparse_fill_empty_rows(sp_input, default_value, name=None):
  """tf.sparse.fill_empty_rows: (filled SparseTensor, whether each row was empty)."""
  if not isinstance(sp_input, tf.SparseTensor):
    raise TypeError("Input must be a SparseTensor.")
  return tf.sparse.fill_empty_rows(sp_input, default_value, name=name)


def sparse_reshape(sp_input, shape, name=None):
  """tf.sparse.reshape."""
  if not isinstance(sp_input, tf.SparseTensor):
    raise TypeError("Input must be a SparseTensor.")
  return tf.sparse.reshape(sp_input, shape, name=name)
