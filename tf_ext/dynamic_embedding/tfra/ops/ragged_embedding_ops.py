"""TFRA's lookups of RaggedTensor ids ([batch, None]): one combined row per row of the ids.

As for SparseTensor ids, the safe lookup keeps negative ids (TFRA's docstring says it drops them;
its tests and code do not) and drops weights <= 0 unless the combiner is "sum".
"""

import tensorflow as tf

from tf_ext.dynamic_embedding.tfra import embedding_ops

__all__ = ["embedding_lookup_sparse", "fill_empty_rows", "safe_embedding_lookup_sparse"]


def fill_empty_rows(ragged_input, default_value, name=None):
  """(the ragged ids with each empty row holding `default_value`, whether each row was empty)."""
  with tf.name_scope(name or "fill_empty_rows"):
    empty = tf.equal(ragged_input.row_lengths(), 0)
    count = tf.reduce_sum(tf.cast(empty, tf.int64))
    fill = tf.RaggedTensor.from_row_lengths(
      tf.fill([count], tf.cast(default_value, ragged_input.dtype)), tf.cast(empty, tf.int64)
    )
    return tf.concat([ragged_input, fill], axis=1), empty


# TFRA's name for it (its own test imports it).
_fill_empty_rows = fill_empty_rows


def embedding_lookup_sparse(
  params, sp_ids, sp_weights, name="embedding_lookup_sparse", combiner="mean"
):
  """The ragged ids' rows combined per row, as the SparseTensor version combines them."""
  if not isinstance(sp_ids, tf.RaggedTensor):
    raise TypeError("sp_ids must be a RaggedTensor")
  weights = None if sp_weights is None else sp_weights.to_sparse()
  return embedding_ops.embedding_lookup_sparse(
    params, sp_ids.to_sparse(), weights, name=name, combiner=combiner
  )


def safe_embedding_lookup_sparse(
  embedding_weights, sparse_ids, sparse_weights=None, combiner="mean", default_id=None, name=None
):
  """Negative ids and weights <= 0 dropped, empty rows zeros (or `default_id`'s row)."""
  if not isinstance(sparse_ids, tf.RaggedTensor):
    raise TypeError("sparse_ids must be a RaggedTensor")
  with tf.name_scope(name or "safe_embedding_lookup_sparse"):
    if combiner != "sum" and sparse_weights is not None:
      keep = sparse_weights > 0
      sparse_weights = tf.ragged.boolean_mask(sparse_weights, keep)
      sparse_ids = tf.ragged.boolean_mask(sparse_ids, keep)
    sparse_ids, empty = fill_empty_rows(sparse_ids, default_id or 0)
    if sparse_weights is not None:
      sparse_weights, _ = fill_empty_rows(sparse_weights, 1.0)
    result = embedding_lookup_sparse(
      embedding_weights, sparse_ids, sparse_weights, name="lookup", combiner=combiner
    )
    if default_id is None:
      result = tf.where(tf.expand_dims(empty, -1), tf.zeros_like(result), result)
    return result
